"""`asyncrl run --containers`, its pure parts: the rendered container as an engine runs it (image, command,
user, groups, read-only root, emptyDirs), the `podman run` command line, the host paths mounted, the
engine lookup, and the supervisor's stop through the engine. (The pods really running in the built
images: tests/images/test_images_run.py.)"""

from __future__ import annotations

import os
import pathlib
import stat

import pytest
import yaml
from asyncrl_api import config, models
from asyncrl_testing import cluster_wait, jobs
from asyncrl_workloads.local import containers, pods, runner

CONFIG_PATH = jobs.LOCAL_CONFIG_PATH


def test_each_local_pod_carries_its_rendered_container_with_the_images_own_command():
    manifests, _, local = jobs.expand_locally(jobs.load_example("tiny-cpu.yaml"))
    statefulsets = pods.role_statefulsets(manifests)
    for pod in local:
        rendered = statefulsets[pod.role]["spec"]["template"]["spec"]["containers"][0]
        assert pod.container is not None and pod.container.image == rendered["image"]
        # the same argv as the local process, but argv[0] is the console script on the image's PATH
        assert pod.container.argv == (f"asyncrl-{pod.role}", "--config", str(CONFIG_PATH))
        assert pod.argv[1:] == pod.container.argv[1:] and pod.argv[0] != pod.container.argv[0]
    assert {p.container.image for p in local} == {
        "ghcr.io/asyncrl/trainer:0.1.0",
        "ghcr.io/asyncrl/rollout:0.1.0",
    }


@pytest.mark.parametrize(
    ("pod_context", "own", "user", "groups", "read_only"),
    [
        ({}, {}, None, (), False),
        ({"runAsUser": 10001}, {}, "10001", (), False),
        ({"runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001}, {}, "10001:10001", (10001,), False),
        # the container's own fields win over the pod's; fsGroup and supplementalGroups both join
        ({"runAsUser": 1, "runAsGroup": 2, "fsGroup": 3, "supplementalGroups": [3, 4]},
         {"runAsUser": 5, "readOnlyRootFilesystem": True}, "5:2", (3, 4), True),
    ],
)  # fmt: skip
def test_the_security_context_becomes_the_containers_user_groups_and_root(
    pod_context, own, user, groups, read_only
):
    container = {"image": "img", "securityContext": own}
    got = pods.pod_container({"securityContext": pod_context}, container, ["prog"])
    assert (got.user, got.groups, got.read_only_root) == (user, groups, read_only)


def test_only_empty_dir_volumes_become_tmpfs_mounts():
    spec = {
        "volumes": [
            {"name": "cfg", "configMap": {"name": "c"}},
            {"name": "tmp", "emptyDir": {}},
            {"name": "home", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "shm", "emptyDir": {"medium": "Memory"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "d"}},
        ]
    }
    mounts = [
        {"name": n, "mountPath": p}
        for n, p in [("cfg", "/etc/asyncrl"), ("tmp", "/tmp"), ("home", "/home/asyncrl"), ("shm", "/dev/shm"),
                     ("data", "/data")]
    ]  # fmt: skip
    got = pods.pod_container(spec, {"image": "img", "volumeMounts": mounts}, ["prog"])
    assert got.empty_dirs == ("/tmp", "/home/asyncrl", "/dev/shm")


def test_podman_run_argv_is_the_pods_image_command_env_user_and_mounts():
    pod = pods.LocalPod(
        name="tiny-rollout-1",
        role="rollout",
        replica=1,
        argv=("/venv/bin/asyncrl-rollout", "--config", "/runs/x/job.json"),
        env={"ASYNCRL_ROLE": "rollout", "ASYNCRL_GATEWAY_ADMIN_KEY": "s3cret"},
        metrics_port=40001,
        cpus=frozenset({1}),
        container=pods.PodContainer(
            image="ghcr.io/asyncrl/rollout:0.1.0",
            argv=("asyncrl-rollout", "--config", "/runs/x/job.json"),
            user="10001:10001",
            groups=(10001,),
            read_only_root=True,
            empty_dirs=("/tmp", "/dev/shm"),
            host_paths=("/src/examples/agents",),
        ),
    )
    mounts = [containers.Mount("/runs/x", False), containers.Mount("/models/tiny", True)]
    argv = containers.run_argv("/usr/bin/podman", "abcd1234", pod, pod.env, mounts)
    assert argv == [
        "/usr/bin/podman", "run", "--rm",
        "--name", "asyncrl-abcd1234-tiny-rollout-1", "--label", "asyncrl.dev/local-run=abcd1234",
        "--network", "host", "--stop-timeout", "10",
        "--user", "10001:10001", "--group-add", "10001", "--read-only",
        "--tmpfs", "/tmp:rw,exec,U", "--shm-size", "1g",
        "--volume", "/runs/x:/runs/x:rw", "--volume", "/models/tiny:/models/tiny:ro",
        "--volume", "/src/examples/agents:/src/examples/agents:ro",
        "--env", "ASYNCRL_ROLE", "--env", "ASYNCRL_GATEWAY_ADMIN_KEY",  # names only: values stay out of ps
        "--cpuset-cpus", "1",
        "--entrypoint", "asyncrl-rollout", "ghcr.io/asyncrl/rollout:0.1.0", "--config", "/runs/x/job.json",
    ]  # fmt: skip
    assert "s3cret" not in " ".join(argv)
    assert (
        containers.tmpfs_options("/usr/bin/docker") == "rw,exec,mode=1777"
    )  # docker has no U, takes the mode


def test_mounts_are_the_run_dir_checkpoints_model_files_and_creds_each_once(tmp_path):
    body = jobs.load_example("tiny-cpu.yaml")
    prompts, held_out = tmp_path / "data" / "prompts.jsonl", tmp_path / "val.jsonl"
    body["spec"]["data"] = {"prompts": str(prompts), "validation": str(held_out), "format": "raw"}
    body["spec"]["reward"] = {"type": "function", "function": "asyncrl_workloads.rewards.math:boxed_answer"}
    job = models.AsyncRLJob.model_validate(body)
    run_dir = tmp_path / "run"
    spec = job.spec.model_copy(deep=True)
    spec.trainer.checkpoint.path = str(run_dir / "checkpoints")  # the runner's default: inside the run dir
    creds = pods.LocalPod("p", "rollout", 0, ("x",), {config.NATS_CREDS_ENV: "/home/me/u.creds"}, 1)
    got = containers.job_mounts(run_dir, spec, [creds, creds])
    assert got == (
        containers.Mount(str(run_dir), False),
        containers.Mount("/tmp/asyncrl/models/tiny", True),
        containers.Mount(str(prompts), True),
        containers.Mount(str(held_out), True),
        containers.Mount("/home/me/u.creds", True),
    )
    spec.trainer.checkpoint.path = "/ckpt/tiny"  # --keep-checkpoint-path: its own writable mount
    assert containers.Mount("/ckpt/tiny", False) in containers.job_mounts(run_dir, spec, [])


def test_open_for_pods_lets_another_uid_write(tmp_path):
    path = tmp_path / "run" / "checkpoints"
    containers.open_for_pods(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o777


def _executable(path: pathlib.Path, text: str) -> pathlib.Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_the_engine_is_podman_then_docker_or_the_one_named(tmp_path):
    bins = tmp_path / "bin"
    bins.mkdir()
    _executable(bins / "docker", "#!/bin/sh\n")
    assert containers.find_engine({"PATH": str(bins)}) == str(bins / "docker")
    _executable(bins / "podman", "#!/bin/sh\n")
    assert containers.find_engine({"PATH": str(bins)}) == str(bins / "podman")
    named = {"PATH": str(bins), containers.ENGINE_ENV: "docker"}
    assert containers.find_engine(named) == str(bins / "docker")
    with pytest.raises(containers.EngineError, match="neither podman nor docker on PATH"):
        containers.find_engine({"PATH": str(tmp_path)})
    with pytest.raises(containers.EngineError, match="no 'nerdctl' on PATH"):
        containers.find_engine({"PATH": str(bins), containers.ENGINE_ENV: "nerdctl"})


def test_cli_without_an_engine_says_so_in_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    from asyncrl_workloads import cli

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(containers.ENGINE_ENV, raising=False)
    job_file = tmp_path / "tiny.yaml"
    job_file.write_text(yaml.safe_dump(jobs.load_example("tiny-cpu.yaml")))
    assert cli.main(["run", str(job_file), "--run-dir", str(tmp_path / "run"), "--containers"]) == 1
    err = capsys.readouterr().err
    assert err == "asyncrl run: --containers: neither podman nor docker on PATH\n"
    assert not (tmp_path / "run").exists()


FAKE_PODMAN = """#!/bin/sh
# `run`: a container that stops on SIGTERM (what podman's signal proxy delivers); `rm`: recorded.
echo "$*" >> {calls}
case "$1" in
  run) trap 'echo TERM >> {calls}; exit 143' TERM; while :; do sleep 0.1; done ;;
esac
"""


def test_supervisor_stops_containers_with_sigterm_through_the_engine_then_rm_f(tmp_path):
    """The supervisor's wiring, with a stand-in engine that records its calls (the real podman runs the
    pods in tests/images/test_images_run.py)."""
    calls = tmp_path / "calls"
    engine_path = _executable(tmp_path / "podman", FAKE_PODMAN.format(calls=calls))
    local = [
        pods.LocalPod(f"t-{role}-0", role, 0, ("x",), {"A": role}, 1, None,
                      pods.PodContainer("img", (f"asyncrl-{role}",)))
        for role in ("trainer", "rollout")
    ]  # fmt: skip
    engine = containers.Engine(str(engine_path), "r1", (), {"B": "run"}, dict(os.environ))
    supervisor = runner.Supervisor(local, {"HOST": "x"}, tmp_path / "logs", print, engine)
    supervisor.start_all()
    try:
        lines = lambda: calls.read_text().splitlines() if calls.exists() else []  # noqa: E731
        runs = lambda: sum(line.startswith("run ") for line in lines())  # noqa: E731
        cluster_wait.wait_until(runs, lambda n: n == 2, "both pods' `podman run`", timeout=10, interval=0.05)
    finally:
        supervisor.stop_all(grace=5)
    got = calls.read_text().splitlines()
    assert got.count("TERM") == 2  # each `podman run` got the SIGTERM (and would proxy it)
    assert got[-1] == "rm -f --ignore --time 0 asyncrl-r1-t-trainer-0 asyncrl-r1-t-rollout-0"
    run = next(line for line in got if line.startswith("run ") and "t-rollout-0" in line)
    assert "--env B --env A " in run and "HOST" not in run  # the pod's env, not the runner's
