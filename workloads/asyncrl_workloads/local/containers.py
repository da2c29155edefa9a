"""`asyncrl run JOB --containers`: each rendered pod runs in its own image under podman (or docker).

Called by `runner`, whose `Supervisor` starts a pod through `Engine.start` instead of as a local process.
What the engine runs is the rendered container (`pods.PodContainer`), as the kubelet would:

- the image and the command/args (`--entrypoint` = command[0], as a pod's `command` replaces the image's
  ENTRYPOINT), with the config path pointing at the run dir's copy;
- the pod's own env only (`LocalPod.env` plus the runner's run-wide variables), never the host's whole
  environment: each name goes on the command line as `--env NAME`, its value through the engine process's
  environment, so no value (the gateway's admin key, an endpoint's API key) shows in `ps`;
- the securityContext: runAsUser/runAsGroup as `--user`, fsGroup/supplementalGroups as `--group-add`,
  readOnlyRootFilesystem as `--read-only`; each emptyDir as a tmpfs the pod's user can write, exec allowed
  as in an emptyDir directory (triton and torch load the code they compile there): `tmpfs_options`;
- `--network host`: the trainer's rendezvous, NATS and the metrics ports stay on 127.0.0.1 as in a local run;
- the host paths the job names, bind-mounted at the same paths (`Mount`): the run dir and the checkpoint
  path read-write, the model, prompt files and NATS creds read-only; for an agent worker, the directories
  of the repository paths its command names (`pods.host_arguments`: `python3 examples/agents/x.py` runs
  the checkout's script in the worker's image, as it runs the local file without --containers). The
  image's user (uid 10001) is not the user who runs `asyncrl run`, so the runner makes the two writable
  directories writable by every user (`open_for_pods`) rather than chown them with podman's `:U`: `:U`
  would hand the run dir to the container's uid, after which the runner itself (a non-root user with
  rootless podman) could no longer write its logs and metrics there, and docker has no `:U`;
- a CPU rollout's own core as `--cpuset-cpus`.

Stopping: the runner's SIGTERM goes to `podman run`, whose signal proxy (on by default for an attached
run) passes it to the container's process; `remove` (`rm -f`, no stop timeout) is the SIGKILL step and
also removes whatever a killed `podman run` left. Every container carries the label `LABEL=<run id>`, so
`podman ps -a --filter label=asyncrl.dev/local-run` finds them; a runner killed with SIGKILL leaves its
containers running (they are the engine's children, not the runner's), to be removed that way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence

from asyncrl_api import config, models

from asyncrl_workloads.local import pods, process

ENGINES = ("podman", "docker")
"""Looked up on PATH in this order; `ASYNCRL_CONTAINER_ENGINE` names another binary."""
ENGINE_ENV = "ASYNCRL_CONTAINER_ENGINE"
LABEL = "asyncrl.dev/local-run"
SHM = "/dev/shm"
ENGINE_TIMEOUT_S = 60.0


class EngineError(RuntimeError):
    """No container engine, or the engine refused a command; the message says which."""


@dataclasses.dataclass(frozen=True)
class Mount:
    """A host path bind-mounted at the same path in every pod's container."""

    path: str
    read_only: bool

    def option(self) -> str:
        return f"{self.path}:{self.path}:{'ro' if self.read_only else 'rw'}"


def find_engine(environ: Mapping[str, str]) -> str:
    """The engine binary: `ASYNCRL_CONTAINER_ENGINE`, else podman, else docker on PATH."""
    path = environ.get("PATH", os.defpath)
    wanted = environ.get(ENGINE_ENV)
    for name in [wanted] if wanted else ENGINES:
        found = shutil.which(name, path=path)
        if found:
            return found
    names = repr(wanted) if wanted else " nor ".join(ENGINES)
    raise EngineError(f"--containers: {'no ' if wanted else 'neither '}{names} on PATH")


def run_id(run_dir: pathlib.Path) -> str:
    """A short id of the run dir: the containers' label value and name prefix (unique per run dir)."""
    return hashlib.sha256(str(run_dir).encode()).hexdigest()[:8]


def container_name(run: str, pod: pods.LocalPod) -> str:
    return f"asyncrl-{run}-{pod.name}"


def is_podman(engine: str) -> bool:
    return pathlib.Path(engine).name.startswith("podman")


def run_argv(
    engine: str, run: str, pod: pods.LocalPod, env_names: Iterable[str], mounts: Sequence[Mount]
) -> list[str]:
    """`podman run` for one pod (see the module docstring); pure."""
    spec = pod.container
    if spec is None:
        raise pods.RenderedJobError(f"{pod.name}: no rendered container to run")
    argv = [engine, "run", "--rm", "--name", container_name(run, pod), "--label", f"{LABEL}={run}"]
    argv += ["--network", "host", "--stop-timeout", "10"]
    if spec.user is not None:
        argv += ["--user", spec.user]
    for group in spec.groups:
        argv += ["--group-add", str(group)]
    if spec.read_only_root:
        argv.append("--read-only")
    for path in spec.empty_dirs:
        if path == SHM:  # the engine mounts its own /dev/shm; a pod's memory emptyDir there is its size
            argv += ["--shm-size", "1g"]
        else:
            argv += ["--tmpfs", f"{path}:{tmpfs_options(engine)}"]
    for mount in mounts:
        argv += ["--volume", mount.option()]
    for path in spec.host_paths:
        argv += ["--volume", Mount(path, read_only=True).option()]
    for name in env_names:
        argv += ["--env", name]
    if pod.cpus:
        argv += ["--cpuset-cpus", ",".join(map(str, sorted(pod.cpus)))]
    return [*argv, "--entrypoint", spec.argv[0], spec.image, *spec.argv[1:]]


def job_mounts(
    run_dir: pathlib.Path, spec: models.AsyncRLJobSpec, local_pods: Iterable[pods.LocalPod]
) -> tuple[Mount, ...]:
    """The host paths the pods use: the run dir and checkpoint path (read-write), the model, prompt and
    validation files and NATS creds (read-only); a path inside another one is covered by it."""
    wanted = [(run_dir, False), (pathlib.Path(spec.trainer.checkpoint.path), False)]
    wanted.append((pathlib.Path(spec.model.path), True))
    for source in (spec.data.prompts, spec.data.validation):
        if source is not None and source.startswith("/"):  # builtin:<task> names no file
            wanted.append((pathlib.Path(source), True))
    creds = {pod.env[config.NATS_CREDS_ENV] for pod in local_pods if config.NATS_CREDS_ENV in pod.env}
    wanted += [(pathlib.Path(path), True) for path in sorted(creds)]
    out: list[Mount] = []
    for path, read_only in wanted:
        path = path.resolve()
        if not any(path.is_relative_to(m.path) for m in out):
            out.append(Mount(str(path), read_only))
    return tuple(out)


def tmpfs_options(engine: str) -> str:
    """A tmpfs the container's user can write, as an emptyDir: podman (4.3) ignores `mode=` on a path the
    image has (the tmpfs stays root's 0755) and chowns it to the container's user with `U`; docker
    takes the mode."""
    return "rw,exec,U" if is_podman(engine) else "rw,exec,mode=1777"


def open_for_pods(path: pathlib.Path) -> None:
    """Make a directory the pods write to writable by their user (see the module docstring)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)


@dataclasses.dataclass
class Engine:
    """Starts and removes one run's containers."""

    path: str
    run: str
    mounts: tuple[Mount, ...]
    env: Mapping[str, str]  # run-wide pod env (the runner's defaults, step log and progress paths)
    environ: Mapping[str, str]  # the engine's own environment (its config: CONTAINERS_CONF, PATH, ...)

    def names(self, local_pods: Iterable[pods.LocalPod]) -> list[str]:
        return [container_name(self.run, pod) for pod in local_pods]

    def start(self, pod: pods.LocalPod, log_path: pathlib.Path) -> process.Child:
        """`podman run` for the pod, attached, as a local child whose exit code is the container's."""
        self.remove([container_name(self.run, pod)])  # a restarted pod's earlier container, if any is left
        env = {**self.env, **pod.env}
        argv = run_argv(self.path, self.run, pod, env, self.mounts)
        return process.Child(pod.name, argv, log_path, env={**self.environ, **env})

    def remove(self, names: Sequence[str]) -> None:
        """`rm -f` (no stop timeout: this is the SIGKILL step); names that do not exist are fine."""
        if not names:
            return
        flags = ["--ignore", "--time", "0"] if is_podman(self.path) else []
        done = subprocess.run(
            [self.path, "rm", "-f", *flags, *names],
            env=dict(self.environ),
            capture_output=True,
            text=True,
            timeout=ENGINE_TIMEOUT_S,
        )
        if done.returncode != 0 and is_podman(self.path):
            raise EngineError(f"{self.path} rm -f {' '.join(names)}: {done.stderr.strip()}")

    def left(self) -> list[str]:
        """Names of this run's containers that still exist (running or not)."""
        done = subprocess.run(
            [self.path, "ps", "-a", "--filter", f"label={LABEL}={self.run}", "--format", "{{.Names}}"],
            env=dict(self.environ),
            capture_output=True,
            text=True,
            timeout=ENGINE_TIMEOUT_S,
        )
        if done.returncode != 0:
            raise EngineError(f"{self.path} ps: {done.stderr.strip()}")
        return done.stdout.split()
