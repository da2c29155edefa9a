"""The local runner's pure parts: the operator's rendered pods as local processes, job loading, progress
records and plots. (The runner running for real: tests/e2e/test_local_runner.py.)"""

from __future__ import annotations

import dataclasses
import itertools
import json
import pathlib
import time

import prometheus_client
import pytest
import yaml
from asyncrl_api import config, models
from asyncrl_operator import render
from asyncrl_testing import jobs
from asyncrl_workloads import metrics
from asyncrl_workloads.local import gateway, pods, progress, runner

CONFIG_PATH = jobs.LOCAL_CONFIG_PATH


def test_tiny_example_expands_to_one_trainer_and_two_rollouts_with_local_identity():
    _, cfg, local = jobs.expand_locally(jobs.load_example("tiny-cpu.yaml"))
    assert [(p.name, p.role, p.replica) for p in local] == [
        ("tiny-trainer-0", "trainer", 0),
        ("tiny-rollout-0", "rollout", 0),
        ("tiny-rollout-1", "rollout", 1),
    ]
    trainer, rollout0, rollout1 = local
    config_args = ("--config", str(CONFIG_PATH))
    assert trainer.argv[0].endswith("asyncrl-trainer") and trainer.argv[1:] == config_args
    assert rollout1.argv[0].endswith("asyncrl-rollout") and rollout1.argv[1:] == config_args
    assert {
        k: trainer.env[k]
        for k in (
            "ASYNCRL_ROLE",
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "POD_NAME",
            "POD_NAMESPACE",
        )
    } == {
        "ASYNCRL_ROLE": "trainer",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "31002",
        "POD_NAME": "tiny-trainer-0",
        "POD_NAMESPACE": "default",
    }
    assert (rollout1.env["ASYNCRL_ROLE"], rollout1.env["ASYNCRL_REPLICA"], rollout1.env["POD_NAME"]) == (
        "rollout",
        "1",
        "tiny-rollout-1",
    )
    ports = [p.metrics_port for p in local]
    assert len(set(ports)) == 3 and [p.env["ASYNCRL_METRICS_PORT"] for p in local] == [str(n) for n in ports]
    assert cfg.endpoints.trainer_host == "127.0.0.1" and cfg.endpoints.weight_sync_port == 31001


def test_localized_config_changes_only_the_endpoints():
    body = jobs.load_example("tiny-cpu.yaml")
    job = models.AsyncRLJob.model_validate(body)
    rendered = config.JobConfig.model_validate_json(pods.job_json(render.render(job)))
    _, cfg, _ = jobs.expand_locally(body)
    assert cfg.spec == rendered.spec and (cfg.name, cfg.namespace) == (rendered.name, rendered.namespace)
    assert cfg.endpoints.nats_url == "nats://127.0.0.1:4333" != rendered.endpoints.nats_url
    assert rendered.endpoints.trainer_host != "127.0.0.1"


def test_torchrun_trainer_gets_its_node_rank_and_local_master_expanded_into_the_command():
    body = jobs.make_job(
        "big", rollout={"replicas": 1, "gpusPerReplica": 1}, trainer={"replicas": 2, "gpusPerReplica": 2}
    )
    _, cfg, local = jobs.expand_locally(body)
    trainers = [p for p in local if p.role == "trainer"]
    assert [p.name for p in trainers] == ["big-trainer-0", "big-trainer-1"]
    second = trainers[1].argv
    assert second[0].endswith("torchrun")
    assert "--node-rank=1" in second and "--master-addr=127.0.0.1" in second
    assert f"--master-port={cfg.endpoints.torch_master_port}" in second
    assert not any("$(" in arg for arg in second)
    assert second[-2:] == ("--config", str(CONFIG_PATH))


def test_replica_override_and_rendered_zero_replicas():
    body = jobs.load_example("tiny-cpu.yaml")
    job = models.AsyncRLJob.model_validate(body)
    manifests = render.render(job)
    cfg = pods.localize_config(pods.job_json(manifests), "nats://x:1", 1, 2, 3)
    ports = itertools.count(40000)
    local = pods.expand(manifests, CONFIG_PATH, cfg, lambda: next(ports), replicas={"rollout": 1})
    assert [p.name for p in local] == ["tiny-trainer-0", "tiny-rollout-0"]


def test_each_local_cpu_rollout_gets_a_core_of_its_own(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {3, 5})
    _, _, local = jobs.expand_locally(jobs.load_example("tiny-cpu.yaml"))
    binds = {p.name: p.env.get("VLLM_CPU_OMP_THREADS_BIND") for p in local}
    assert binds == {"tiny-trainer-0": None, "tiny-rollout-0": "3", "tiny-rollout-1": "5"}
    # the whole pod starts on that core, so torch's import never probes the other replica's core
    assert {p.name: p.cpus for p in local} == {
        "tiny-trainer-0": None, "tiny-rollout-0": {3}, "tiny-rollout-1": {5}
    }  # fmt: skip
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1")  # the user's own binding wins
    _, _, local = jobs.expand_locally(jobs.load_example("tiny-cpu.yaml"))
    assert all("VLLM_CPU_OMP_THREADS_BIND" not in p.env and p.cpus is None for p in local)


def test_kubernetes_variable_expansion_rules():
    env = {"A": "1", "B": "two"}
    assert pods.expand_vars("$(A)-$(B)-$(C)-$$(A)", env) == "1-two-$(C)-$(A)"


def test_unknown_downward_api_field_is_refused():
    container = {"env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]}
    with pytest.raises(pods.RenderedJobError, match="metadata.uid"):
        pods.container_env(container, "p-0", "ns", 0, {})
    # a Secret key the run does not have is the runner's own variable of that name, else unset
    secret = {"env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    assert pods.container_env(secret, "p-0", "ns", 0, {}) == {}
    assert pods.container_env(secret, "p-0", "ns", 0, {}, environ={"K": "v"}) == {"K": "v"}
    resource = {"env": [{"name": "R", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}]}
    with pytest.raises(pods.RenderedJobError, match="'R'"):
        pods.container_env(resource, "p-0", "ns", 0, {})


def test_the_teachers_api_key_comes_from_the_runners_environment_and_stays_out_of_pods_json():
    body = jobs.load_example("tiny-cpu.yaml")
    body["spec"]["teacher"] = {
        "endpoint": {
            "baseURL": "http://127.0.0.1:8000/v1",
            "model": "teacher",
            "apiKeySecret": {"name": "teacher-key", "key": "apiKey"},
        }
    }
    manifests = render.render(models.AsyncRLJob.model_validate(body))
    cfg = pods.localize_config(pods.job_json(manifests), "nats://127.0.0.1:4333", 1, 2, 3)
    ports = itertools.count(40000)
    environ = {config.TEACHER_API_KEY_ENV: "sk-local-teacher\n"}  # kept exactly, newline and all
    local = pods.expand(manifests, CONFIG_PATH, cfg, lambda: next(ports), environ=environ)
    assert [p.env.get(config.TEACHER_API_KEY_ENV) for p in local] == ["sk-local-teacher\n", None, None]
    assert "sk-local-teacher" not in pods.describe(local)
    assert json.loads(pods.describe(local))[0]["env"][config.TEACHER_API_KEY_ENV] == "(secret)"
    # no key in the runner's environment: the variable is left unset (a server that wants one says 401)
    local = pods.expand(manifests, CONFIG_PATH, cfg, lambda: next(ports), environ={})
    assert all(config.TEACHER_API_KEY_ENV not in p.env for p in local)


def test_missing_role_statefulset_is_reported():
    job = models.AsyncRLJob.model_validate(jobs.load_example("tiny-cpu.yaml"))
    manifests = [
        m for m in render.render(job) if m["metadata"]["name"] != "tiny-rollout" or m["kind"] != "StatefulSet"
    ]
    with pytest.raises(pods.RenderedJobError, match="rollout"):
        pods.role_statefulsets(manifests)


# --- a gateway job: admin key, one port per rollout replica, what the user is told ----------------------


def _gateway_job(replicas=2, port=8100):
    body = jobs.load_example("gateway-cpu.yaml")
    body["spec"]["rollout"]["replicas"] = replicas
    body["spec"]["agent"]["gateway"]["port"] = port
    return models.AsyncRLJob.model_validate(body)


def test_gateway_replicas_get_their_own_port_and_url_and_the_admin_key_for_its_secret():
    """The spec port is the front URL's (the Service's on a cluster); replica i serves on port + 1 + i."""
    job = _gateway_job(replicas=2, port=8100)
    local_gateway = gateway.plan(job.spec, {})
    assert local_gateway is not None and local_gateway.secret == ("gw-gateway-admin", "apiKey")
    manifests = render.render(job)
    cfg = pods.localize_config(pods.job_json(manifests), "nats://127.0.0.1:4333", 1, 2, 3)
    ports = itertools.count(40000)
    local = pods.expand(manifests, CONFIG_PATH, cfg, lambda: next(ports), gateway=local_gateway)
    key = local_gateway.admin_key
    env = {p.name: {k: v for k, v in p.env.items() if k.startswith("ASYNCRL_GATEWAY_")} for p in local}
    assert env == {
        "gw-trainer-0": {},
        "gw-rollout-0": {
            "ASYNCRL_GATEWAY_ADMIN_KEY": key,
            "ASYNCRL_GATEWAY_PORT": "8101",
            "ASYNCRL_GATEWAY_URL": "http://127.0.0.1:8101",
            "ASYNCRL_GATEWAY_PEER_URL": "http://127.0.0.1:8101,http://127.0.0.1:8102",
        },
        "gw-rollout-1": {
            "ASYNCRL_GATEWAY_ADMIN_KEY": key,
            "ASYNCRL_GATEWAY_PORT": "8102",
            "ASYNCRL_GATEWAY_URL": "http://127.0.0.1:8102",
            "ASYNCRL_GATEWAY_PEER_URL": "http://127.0.0.1:8101,http://127.0.0.1:8102",
        },
    }
    described = json.loads(pods.describe(local))  # pods.json: the key stays in gateway.json only
    assert [p["env"].get("ASYNCRL_GATEWAY_ADMIN_KEY") for p in described] == [None, "(secret)", "(secret)"]
    assert local_gateway.admin_key not in pods.describe(local)
    # without the run's key, the Secret has no local value: refused as before
    with pytest.raises(pods.RenderedJobError, match="ASYNCRL_GATEWAY_ADMIN_KEY"):
        pods.expand(manifests, CONFIG_PATH, cfg, lambda: next(ports))
    assert (
        gateway.plan(models.AsyncRLJob.model_validate(jobs.load_example("agent-cpu.yaml")).spec, {}) is None
    )


def test_gateway_admin_key_is_the_environments_or_new_for_every_run():
    spec = _gateway_job().spec
    assert gateway.plan(spec, {"ASYNCRL_GATEWAY_ADMIN_KEY": " mine \n"}).admin_key == "mine"
    generated = {gateway.plan(spec, {"ASYNCRL_GATEWAY_ADMIN_KEY": ""}).admin_key for _ in range(3)}
    assert len(generated) == 3 and all(len(key) >= 32 for key in generated)


def test_gateway_urls_and_key_are_printed_and_written_for_the_owner_only(tmp_path):
    local_gateway = gateway.plan(
        _gateway_job(replicas=2, port=8200).spec, {"ASYNCRL_GATEWAY_ADMIN_KEY": "k3y"}
    )
    path = gateway.write_info(local_gateway, tmp_path)
    assert path == tmp_path / "gateway.json" and path.stat().st_mode & 0o777 == 0o600
    info = json.loads(path.read_text())
    command = (
        "ASYNCRL_GATEWAY_URL=http://127.0.0.1:8200 ASYNCRL_GATEWAY_ADMIN_KEY=k3y "
        "python examples/agents/lookup_agent.py"
    )
    assert info == {
        "url": "http://127.0.0.1:8200",
        "urls": ["http://127.0.0.1:8201", "http://127.0.0.1:8202"],
        "adminKey": "k3y",
        "env": {"ASYNCRL_GATEWAY_URL": "http://127.0.0.1:8200", "ASYNCRL_GATEWAY_ADMIN_KEY": "k3y"},
        "agentCommand": command,
    }
    url_line, key_line, agent_line = local_gateway.lines(path)
    assert url_line.startswith(
        "asyncrl: agent gateway at http://127.0.0.1:8200 (in front of http://127.0.0.1:8201, http://127.0.0.1:8202)"
    )
    assert key_line == f"asyncrl: gateway admin key k3y (also in {path})"
    assert agent_line == f"asyncrl: drive it with an agent: {command}"
    quoted = dataclasses.replace(local_gateway, admin_key="a b")  # a key from the env is quoted for the shell
    assert "ASYNCRL_GATEWAY_ADMIN_KEY='a b' python" in quoted.agent_command()


def test_a_gateway_port_in_use_is_reported_before_anything_runs(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        local_gateway = gateway.plan(_gateway_job(replicas=1, port=port).spec, {})
        assert gateway.busy_ports(local_gateway) == [port]
        body = jobs.load_example("gateway-cpu.yaml")
        body["spec"]["rollout"]["replicas"] = 1
        body["spec"]["agent"]["gateway"]["port"] = port
        job_file = tmp_path / "gw.yaml"
        job_file.write_text(yaml.safe_dump(body))
        with pytest.raises(
            runner.JobFileError, match=rf"spec\.agent\.gateway\.port: port\(s\) {port} in use"
        ):
            runner.run(runner.Options(job_file=job_file, run_dir=tmp_path / "run"))
        assert not (tmp_path / "run").exists()
    assert gateway.busy_ports(local_gateway) == []


# --- job loading --------------------------------------------------------------------------------------


def test_job_overrides_move_checkpoints_into_the_run_dir(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(jobs.load_example("tiny-cpu.yaml")))
    options = runner.Options(job_file=job_file, max_steps=3, rollout_replicas=1)
    job, _ = runner.load_job(options, tmp_path / "run")
    assert job.spec.max_steps == 3 and job.spec.rollout.replicas == 1
    assert job.spec.trainer.checkpoint.path == str((tmp_path / "run" / "checkpoints").resolve())
    kept, _ = runner.load_job(runner.Options(job_file=job_file, keep_checkpoint_path=True), tmp_path / "r")
    assert kept.spec.trainer.checkpoint.path == "/tmp/asyncrl/checkpoints/tiny"


def test_invalid_job_names_the_field_and_writes_nothing(tmp_path):
    body = jobs.load_example("tiny-cpu.yaml")
    body["spec"]["rollout"]["replicas"] = -1
    job_file = tmp_path / "bad.yaml"
    job_file.write_text(yaml.safe_dump(body))
    run_dir = tmp_path / "run"
    with pytest.raises(runner.JobFileError, match=r"spec\.rollout\.replicas"):
        runner.run(runner.Options(job_file=job_file, run_dir=run_dir))
    assert not run_dir.exists()


def test_autoscale_of_a_gateway_job_is_refused_locally_not_ignored(tmp_path):
    body = jobs.load_example("gateway-cpu.yaml")
    body["spec"]["rollout"]["autoscale"] = {"minReplicas": 1, "maxReplicas": 2}
    job_file = tmp_path / "elastic.yaml"
    job_file.write_text(yaml.safe_dump(body))
    with pytest.raises(runner.JobFileError, match=r"spec\.rollout\.autoscale: asyncrl run does not resize"):
        runner.run(runner.Options(job_file=job_file, run_dir=tmp_path / "run"))
    assert not (tmp_path / "run").exists()


# --- progress records and plots -----------------------------------------------------------------------


def _exposition(produced, consumed, tokens, rewards, step, depth, buckets=(0.25, 0.5, 1.0)):
    registry = prometheus_client.CollectorRegistry()
    labels = ("namespace", "job", "role", "replica")
    values = ("default", "tiny", "trainer", "0")

    def metric(kind, name, **kw):
        return kind(name, "", labels, registry=registry, **kw).labels(*values)

    metric(prometheus_client.Counter, "asyncrl_trajectories_produced").inc(produced)
    metric(prometheus_client.Counter, "asyncrl_trajectories_consumed").inc(consumed)
    metric(prometheus_client.Counter, "asyncrl_tokens_generated").inc(tokens)
    histogram = metric(prometheus_client.Histogram, "asyncrl_reward", buckets=buckets)
    for reward in rewards:
        histogram.observe(reward)
    metric(prometheus_client.Gauge, "asyncrl_trainer_step").set(step)
    metric(prometheus_client.Gauge, "asyncrl_queue_depth").set(depth)
    return prometheus_client.generate_latest(registry).decode()


def test_tracker_turns_counters_into_rates_and_reads_reward_and_staleness_from_steps():
    clock = iter([100.0, 102.0, 106.0, 108.0, 110.0])
    tracker = progress.Tracker(max_steps=10, clock=lambda: next(clock))
    first = tracker.record(
        {"a": _exposition(10, 8, 80, [0.0, 1.0], 1, 4), "b": None},
        [{"step": 1, "reward_mean": 0.25, "staleness": [0, 1, 1]}],
    )
    assert (first["step"], first["produced"], first["consumed"], first["queueDepth"]) == (1, 10, 8, 4)
    assert first["samplesPerSecond"] == 4.0 and first["tokensPerSecond"] == 40.0
    assert first["reward"] == 0.25 and first["rolloutReward"] == 0.5
    assert first["stalenessMean"] == pytest.approx(2 / 3) and first["stalenessMax"] == 1
    assert first["processesUp"] == 1 and first["processes"] == 2
    # counters are cumulative: 16 more consumed in 4 s, two more rewards of 1.0
    second = tracker.record({"a": _exposition(30, 24, 80, [0.0, 1.0, 1.0, 1.0], 3, 6), "b": None}, [])
    assert second["samplesPerSecond"] == 4.0 and second["tokensPerSecond"] == 0.0
    assert second["reward"] == 0.25  # no new step: the last known batch reward is carried
    assert second["rolloutReward"] == 1.0 and second["stalenessMean"] is None
    assert "step 3/10" in progress.line(second) and "queue 6" in progress.line(second)
    gone = tracker.record({"a": None, "b": None}, [])  # the trainer finished and exited
    assert (gone["step"], gone["consumed"], gone["processesUp"]) == (3, 24, 0)  # nothing goes backwards
    restarted = tracker.record({"a": _exposition(5, 0, 0, [], 0, 0), "b": None}, [])
    assert restarted["produced"] == 35 and restarted["consumed"] == 24  # a counter reset adds, never drops


def test_rollout_reward_is_unknown_when_the_histogram_has_no_sum():
    # prometheus_client omits _sum when a bucket bound is negative; a mean of 0.0 would be a lie
    tracker = progress.Tracker(max_steps=None, clock=iter([0.0, 1.0]).__next__)
    entry = tracker.record({"a": _exposition(2, 0, 9, [0.5, 1.0], 0, 0, buckets=(-1.0, 0.0, 1.0))}, [])
    assert entry["rolloutReward"] is None and entry["produced"] == 2


def _rollout_exposition(replica, calls=(), episodes=()):
    """A rollout's /metrics text from the workloads' own registry: `calls` are (tool, outcome, count),
    `episodes` (ended, count), counted as the agent loop counts them (metrics.Bound)."""
    identity = metrics.Identity("test-progress", "agent", "rollout", replica)
    bound = metrics.bind(identity)
    for tool, outcome, count in calls:
        bound.tool_calls_by(tool, outcome).inc(count)
    for ended, count in episodes:
        bound.agent_episodes_by(ended).inc(count)
    try:
        text = prometheus_client.generate_latest(metrics.REGISTRY).decode()
    finally:  # the registry is process-wide: leave no child of this identity behind
        values = dataclasses.astuple(identity)
        for metric in vars(metrics).values():
            if isinstance(metric, prometheus_client.metrics.MetricWrapperBase):
                for labels in [k for k in metric._metrics if k[: len(values)] == values]:
                    metric.remove(*labels)
    # other tests' children of the same registry are not this process's
    return "".join(
        row for row in text.splitlines(keepends=True) if row.startswith("#") or 'job="agent"' in row
    )


def test_tool_calls_per_episode_are_summed_over_rollouts_tools_and_outcomes():
    tracker = progress.Tracker(max_steps=None, clock=iter([0.0, 2.0, 4.0, 6.0, 8.0]).__next__)
    none_yet = tracker.record({"r0": _rollout_exposition("0"), "r1": _rollout_exposition("1")}, [])
    assert "agentEpisodes" not in none_yet and "calls/ep" not in progress.line(none_yet)
    r1 = _rollout_exposition("1", [("(unparsed)", "malformed", 2)], [("max_turns", 1), ("length", 1)])
    r0 = _rollout_exposition("0", [("lookup", "ok", 3), ("(unknown)", "unknown_tool", 1)], [("stop", 2)])
    first = tracker.record({"r0": r0, "r1": r1}, [])
    assert (first["toolCalls"], first["agentEpisodes"], first["toolCallsPerEpisode"]) == (6, 4, 1.5)
    assert "1.50 tool calls/ep" in progress.line(first)
    # one more episode with one more call on r0; the 10 s window still reaches back to the first poll
    r0 = _rollout_exposition("0", [("lookup", "ok", 4), ("(unknown)", "unknown_tool", 1)], [("stop", 3)])
    second = tracker.record({"r0": r0, "r1": r1}, [])
    assert (second["toolCalls"], second["agentEpisodes"], second["toolCallsPerEpisode"]) == (7, 5, 1.4)
    gone = tracker.record({"r0": None, "r1": None}, [])  # the rollouts exited: their counts are carried
    assert (gone["toolCalls"], gone["agentEpisodes"], gone["toolCallsPerEpisode"]) == (7, 5, 1.4)


def test_no_episode_in_the_window_is_unknown_not_zero():
    tracker = progress.Tracker(max_steps=None, clock=itertools.count(0.0, 2.0).__next__, window_s=10.0)
    text = _rollout_exposition("0", [("lookup", "ok", 2)], [("stop", 1)])
    assert tracker.record({"r0": text}, [])["toolCallsPerEpisode"] == 2.0
    for _ in range(6):  # polls every 2 s with nothing new, until the window no longer holds the episode
        later = tracker.record({"r0": text}, [])
    assert later["toolCallsPerEpisode"] is None and later["agentEpisodes"] == 1
    assert "- tool calls/ep" in progress.line(later)


def test_a_job_without_an_agent_loop_shows_nothing_of_it():
    """Its rollouts export the agent histograms (bound at start) but no call or episode series."""
    text = _rollout_exposition("0")
    assert "asyncrl_agent_turns_count{" in text and "asyncrl_tool_calls_total{" not in text
    entry = progress.Tracker(max_steps=None, clock=iter([0.0, 1.0]).__next__).record({"r0": text}, [])
    assert not {"toolCallsPerEpisode", "toolCalls", "agentEpisodes"} & set(entry)
    assert "calls/ep" not in progress.line(entry)


def test_step_log_returns_only_complete_new_lines(tmp_path):
    path = tmp_path / "steps.jsonl"
    log = progress.StepLog(path)
    assert log.read_new() == []
    path.write_text('{"step": 1}\n{"step": 2')
    assert log.read_new() == [{"step": 1}]
    with path.open("a") as handle:
        handle.write('}\n{"step": 3}\n')
    assert log.read_new() == [{"step": 2}, {"step": 3}]


def test_plot_writes_png_curves(tmp_path):
    from asyncrl_workloads.local import plot

    with (tmp_path / "metrics.jsonl").open("w") as handle:
        for i in range(6):
            handle.write(
                json.dumps(
                    {
                        "step": i,
                        "elapsed": 2.0 * i,
                        "reward": 0.1 * i,
                        "rolloutReward": None,
                        "stalenessMean": 0.5,
                        "stalenessMax": 1,
                        "samplesPerSecond": 3.0,
                        "producedPerSecond": 3.5,
                    }
                )
                + "\n"
            )
        handle.write('{"step": 7, "elap')  # a partial last line from a killed run is ignored
    written = plot.plot(tmp_path)
    assert sorted(p.name for p in written) == ["curves.png", "reward.png", "staleness.png", "throughput.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    with pytest.raises(plot.PlotError, match="cannot read"):
        plot.plot(tmp_path / "nothing-here")


# --- supervision of real (tiny) processes --------------------------------------------------------------


def _pod(name, role, script):
    return pods.LocalPod(name, role, 0, ("/bin/sh", "-c", script), {}, 0)


def _wait_for(predicate, timeout=10.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_a_failed_rollout_is_restarted_then_given_up_and_a_config_error_is_fatal(tmp_path):
    said = []
    supervisor = runner.Supervisor(
        [_pod("t-trainer-0", "trainer", "sleep 30"), _pod("t-rollout-0", "rollout", "exit 1")],
        {},
        tmp_path,
        said.append,
        backoff_s=0.05,
    )
    supervisor.start_all()
    try:
        outcomes = []
        for _ in range(runner.ROLLOUT_RESTARTS + 1):
            assert _wait_for(lambda: supervisor.children["t-rollout-0"].poll() is not None)
            outcomes.append(supervisor.check())
            while "t-rollout-0" in supervisor.restart_at:  # the back-off, then the restart
                time.sleep(0.02)
                assert supervisor.check() is None
        assert outcomes[:-1] == [None] * runner.ROLLOUT_RESTARTS and outcomes[-1][0] == "failed"
        assert len(said) == runner.ROLLOUT_RESTARTS and "restarting in 0.05s (1/3)" in said[0]
        assert "restarting in 0.1s (2/3)" in said[1]  # doubling, as the kubelet's back-off
    finally:
        supervisor.stop_all(grace=5)
    config_error = runner.Supervisor(
        [_pod("c-rollout-0", "rollout", "echo bad field >&2; exit 2")], {}, tmp_path, said.append
    )
    config_error.start_all()
    assert _wait_for(lambda: config_error.children["c-rollout-0"].poll() is not None)
    outcome, detail = config_error.check()
    assert outcome == "failed" and "code 2" in detail and "bad field" in detail


def test_a_rollouts_termination_message_is_said_at_its_first_exit_and_it_waits_out_the_back_off(tmp_path):
    """An endpoint's classified line (what a rollout writes to its termination message before exit 3)
    is on the live output at the first failure; the restart waits 10 s, the kubelet's first back-off."""
    said = []
    line = "Unreachable: judge endpoint http://127.0.0.1:9/v1: cannot reach 127.0.0.1:9: connection refused"
    script = f'echo "{line}" > "$ASYNCRL_TERMINATION_LOG"; echo noise; exit 3'
    supervisor = runner.Supervisor([_pod("e-rollout-0", "rollout", script)], {}, tmp_path, said.append)
    supervisor.start_all()
    try:
        assert _wait_for(lambda: supervisor.children["e-rollout-0"].poll() is not None)
        now = time.monotonic()
        assert supervisor.check(now) is None
        assert said == [f"e-rollout-0 exited with code 3: {line}; restarting in 10s (1/3)"]
        first = supervisor.children["e-rollout-0"]
        assert supervisor.check(now + 9.5) is None and supervisor.children["e-rollout-0"] is first
        assert supervisor.check(now + 10.0) is None and supervisor.children["e-rollout-0"] is not first
    finally:
        supervisor.stop_all(grace=5)


def test_trainer_exit_zero_means_done(tmp_path):
    supervisor = runner.Supervisor([_pod("d-trainer-0", "trainer", "exit 0")], {}, tmp_path, print)
    supervisor.start_all()
    assert _wait_for(lambda: supervisor.children["d-trainer-0"].poll() is not None)
    assert supervisor.check() == ("done", "d-trainer-0 finished")


def test_stop_all_kills_whole_process_groups_including_grandchildren(tmp_path):
    import os

    pidfile = tmp_path / "grandchild.pid"
    # the grandchild ignores SIGTERM: only the group SIGKILL after the grace period ends it
    script = f"sh -c 'trap \"\" TERM; echo $$ > {pidfile}; exec sleep 300' & wait"
    supervisor = runner.Supervisor([_pod("g-rollout-0", "rollout", script)], {}, tmp_path, print)
    supervisor.start_all()
    assert _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip())
    grandchild = int(pidfile.read_text())
    supervisor.stop_all(grace=1.0)

    def gone():
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            return True
        state = pathlib.Path(f"/proc/{grandchild}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state == "Z"  # killed, waiting for init to reap it

    assert _wait_for(gone, timeout=10)


def test_cli_reports_a_bad_job_in_one_line_and_exits_2(tmp_path, capsys):
    from asyncrl_workloads import cli

    body = jobs.load_example("tiny-cpu.yaml")
    body["spec"]["trainer"]["optimiser"] = {"lr": 1}  # misspelt field
    job_file = tmp_path / "bad.yaml"
    job_file.write_text(yaml.safe_dump(body))
    assert cli.main(["run", str(job_file), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "spec.trainer.optimiser" in err
    assert not (tmp_path / "run").exists()
    assert cli.main(["plot", str(tmp_path / "run")]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err


def test_a_pod_with_cpus_starts_on_them_and_its_children_inherit_them(tmp_path):
    import os

    core = max(os.sched_getaffinity(0))
    out = tmp_path / "cpus"
    # the grandchild (what vLLM's EngineCore and worker are to the rollout) reports its own affinity
    pod = _pod("p-rollout-0", "rollout", f"sh -c 'grep Cpus_allowed_list /proc/self/status > {out}'")
    supervisor = runner.Supervisor([dataclasses.replace(pod, cpus=frozenset({core}))], {}, tmp_path, print)
    supervisor.start_all()
    assert _wait_for(lambda: supervisor.children["p-rollout-0"].poll() is not None)
    assert out.read_text().split() == ["Cpus_allowed_list:", str(core)]


def test_the_nats_creds_path_is_the_runners_own_file_when_it_has_one():
    container = {"env": [{"name": config.NATS_CREDS_ENV, "value": config.NATS_CREDS_PATH}]}
    here = {config.NATS_CREDS_ENV: "/home/me/user.creds"}
    assert pods.container_env(container, "p-0", "ns", 0, {}, environ=here) == here
    unset = pods.container_env(container, "p-0", "ns", 0, {}, environ={})
    assert unset == {config.NATS_CREDS_ENV: config.NATS_CREDS_PATH}


def test_scale_rollouts_starts_parked_ordinals_and_sigterms_the_highest_first(tmp_path):
    """spec.rollout.autoscale locally: rollouts planned up to maxReplicas, the parked ones started on a
    scale-up, the highest SIGTERMed on a scale-down (never restarted as a crash), started again later."""
    script = "trap 'echo stopped > $0.term; exit 0' TERM; while :; do sleep 0.05; done"
    rollouts = [
        dataclasses.replace(
            _pod(f"s-rollout-{i}", "rollout", script),
            replica=i,
            argv=("/bin/sh", "-c", script, str(tmp_path / f"r{i}")),
        )  # fmt: skip
        for i in range(3)
    ]
    supervisor = runner.Supervisor(
        [_pod("s-trainer-0", "trainer", "sleep 30"), *rollouts], {}, tmp_path, print
    )
    supervisor.wanted_rollouts, supervisor.parked = 1, {"s-rollout-1", "s-rollout-2"}
    supervisor.start_all()
    try:
        assert sorted(supervisor.children) == ["s-rollout-0", "s-trainer-0"]
        supervisor.scale_rollouts(3)
        assert [p.name for p in supervisor.running() if p.role == "rollout"] == [p.name for p in rollouts]
        time.sleep(0.3)  # the shells set their trap
        supervisor.scale_rollouts(1)
        assert _wait_for(lambda: (tmp_path / "r2.term").exists() and (tmp_path / "r1.term").exists())
        assert not (tmp_path / "r0.term").exists()
        assert _wait_for(lambda: supervisor.children["s-rollout-2"].poll() is not None)
        assert supervisor.check() is None and "s-rollout-2" not in supervisor.restart_at  # not a crash
        assert [p.name for p in supervisor.running() if p.role == "rollout"] == ["s-rollout-0"]
        supervisor.scale_rollouts(2)  # ordinal 1 again, once its earlier process is gone
        assert _wait_for(lambda: supervisor.check() is None and "s-rollout-1" not in supervisor.parked)
        assert supervisor.children["s-rollout-1"].poll() is None
    finally:
        supervisor.stop_all(grace=5)


def test_elastic_takes_each_new_trainer_report_once_and_asks_for_the_decision(tmp_path):
    from asyncrl_api import autoscale
    from asyncrl_workloads.local import elastic

    report = tmp_path / "progress.json"
    asked: list[int] = []
    spec = autoscale.AutoscaleSpec.model_validate(
        {"minReplicas": 1, "maxReplicas": 2, "scaleUpStabilizationSeconds": 2}
    )
    scaler = elastic.Elastic(spec, 1, report, asked.append, print)
    assert scaler.poll(1, now=0.0) is None  # no report yet

    def write(at: float, wait: float) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
        u = {"trainerWaitFraction": wait, "rolloutBlockedFraction": 0.0, "steps": 20}
        report.write_text(json.dumps({"progress": {"step": 3, "utilization": u, "lastUpdateTime": stamp}}))

    write(1000, 0.7)
    assert scaler.poll(1, now=1000.5).reason == "Stabilizing"
    assert scaler.poll(1, now=1001) is None  # the same report: no second sample
    write(1003, 0.7)
    assert scaler.poll(1, now=1003.2).reason == "ScaleUp" and asked == [2] and scaler.replicas == 2
    write(1004, 0.7)
    assert scaler.poll(1, now=1004.1).reason == "WaitingForReplicas"  # the new one loads its engine
    assert scaler.changes[0]["from"] == 1 and scaler.changes[0]["to"] == 2
