"""An agent outside the package teaches the model through the gateway, from one command: `asyncrl run` of
examples/gateway-cpu.yaml (1 rollout replica, the trainer, the embedded nats-server, and the job's own
agent worker, spec.agent.workers: examples/agents/lookup_agent.py, which imports nothing of asyncrl,
given the gateway's URL and the run's admin key by the runner). No second process is started by the test
for it. The agent opens groups, runs its tool loop with the unmodified openai and anthropic SDKs
(streamed: `--stream`), its groups taking chat completions, the Messages API and the Responses API in
turn, rewards each session itself and ends it. A real Prometheus (asyncrl_testing.prometheus) scrapes the
run's processes every second. Beside it, `asyncrl agent` drives a command-line agent that never exits
(`sleep`): each of its sessions is killed at --timeout and aborted, nothing of it is published, and its
next group proceeds.

Checked, once the trainer has made STEPS steps:
- the job dashboard's "Agent gateway" row (the row tests/e2e/test_observability.py leaves out): every
  panel query, Grafana's variables filled, answers a number -- not nothing, nor NaN (a quantile of a
  histogram without observations); the agent streams so that time to first token is observed;

and once the agent worker was paused (SIGSTOP: a worker that exits is restarted, as in a Deployment)
and everything is quiet:
- learning: the trainer's per-step mean reward of the last fifth exceeds the first fifth by > 3
  standard errors;
- the engine's logprobs, as the gateway recorded them, equal the trainer's for samples of its current
  weights (the steps' fresh_logprob_gap);
- conservation: trajectories produced (the rollout's counter) = stored in the stream = consumed +
  dropped (the trainer's counters) + still in the stream;
- the gateway's own books: sessions started = ended + expired + aborted + still open, the aborted ones
  exactly the `asyncrl agent` sessions, every group the agent finished was answered 200 throughout, and
  no request got a 5xx;
- the runner stops the run on Ctrl-C: no process of the run is left, within 30 s by its summary.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import yaml
from asyncrl_testing import dashboards, jobs, learning, procfs
from asyncrl_testing import prometheus as prometheus_server
from asyncrl_workloads.local import process

pytestmark = pytest.mark.e2e
REPO = pathlib.Path(__file__).resolve().parents[2]
STEPS = 20
GROUP = 8  # sessions per group, as the job's samplesPerPrompt
DEADLINE_S = 780
NAMESPACE, JOB = "default", "gw"  # the local runner's namespace, gateway-cpu.yaml's name
APIS = ("chat", "messages", "responses")  # the agent's groups take them in turn: one trajectory model


def _write_job(tmp_path: pathlib.Path) -> pathlib.Path:
    body = jobs.load_example("gateway-cpu.yaml")
    spec = body["spec"]
    spec["model"]["path"] = str(tmp_path / "model")
    spec["rollout"]["replicas"] = 1  # the agent opens every session at replica 0's URL
    spec["agent"]["gateway"]["port"] = process.free_port()
    spec["maxSteps"] = STEPS * 10  # the test ends the run: quiet first, then Ctrl-C
    spec["progress"]["reportIntervalSeconds"] = 1
    worker = spec["agent"]["workers"]  # the example's worker, streamed and speaking the three APIs in turn
    assert worker["command"][1] == "examples/agents/lookup_agent.py"
    worker["command"] += ["--stream", "--apis", ",".join(APIS)]
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _wait(what: str, predicate, procs: dict[str, subprocess.Popen], logs: pathlib.Path, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            assert proc.poll() is None, f"{name} exited {proc.returncode} waiting for {what}\n{_tail(logs)}"
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}\n{_tail(logs)}")


def _tail(logs: pathlib.Path) -> str:
    return "\n".join(
        f"== {p.name}\n" + "".join(p.read_text(errors="replace").splitlines(True)[-20:])
        for p in sorted(logs.glob("*.log"))
    )


def _quiet(ports: list[int]) -> list[set[learning.Sample]]:
    """The processes' counters once two scrapes 2 s apart agree (nothing moves any more)."""
    names = ("asyncrl_trajectories_", "asyncrl_gateway_sessions", "asyncrl_gateway_requests_total")

    def counters() -> list[set[learning.Sample]]:
        return [learning.metric_samples(port, names) for port in ports]

    before = counters()
    for _ in range(30):
        time.sleep(2)
        after = counters()
        if after == before:
            return after
        before = after
    raise AssertionError("the run never went quiet")


def _shown(result: list[dict]) -> str:
    """A query's answer as a panel's legend would show it: labels=value for each series."""
    return ", ".join(
        f"{','.join(s['metric'].values()) or 'value'}={float(s['value'][1]):.3g}" for s in result
    )


def test_an_outside_agent_teaches_the_model_to_call_its_tool_through_the_gateway(tmp_path):
    started = time.monotonic()
    run_dir, logs = tmp_path / "run", tmp_path / "run" / "logs"
    runner_log = (tmp_path / "runner.log").open("w")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in ("operator", "workloads", "tools")),
    }
    env.pop("ASYNCRL_GATEWAY_ADMIN_KEY", None)  # the runner makes one for this run
    runner = subprocess.Popen(
        [sys.executable, "-m", "asyncrl_workloads.cli", "run", str(_write_job(tmp_path)),
         "--run-dir", str(run_dir), "--poll", "1", "--timeout", str(DEADLINE_S)],
        cwd=REPO, env=env, stdout=runner_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    procs = {"runner": runner}
    prom = None
    try:
        info_path = run_dir / "gateway.json"
        _wait("gateway.json", info_path.exists, procs, logs, 120)
        info = json.loads(info_path.read_text())
        assert oct(info_path.stat().st_mode & 0o777) == "0o600"
        described = json.loads((run_dir / "pods.json").read_text())  # written before gateway.json
        pods = {p["role"]: p["metricsPort"] for p in described}
        targets = [f"127.0.0.1:{p['metricsPort']}" for p in described]
        assert [p["name"] for p in described if p["role"] == "agent"] == ["gw-agent-0"]
        prom = prometheus_server.start(targets, honor_labels=True)  # keep the run's job/namespace labels
        steps_log = run_dir / "steps.jsonl"

        def trained() -> bool:
            return steps_log.exists() and len(steps_log.read_text().splitlines()) >= STEPS

        _wait(f"{STEPS} trainer steps", trained, procs, logs, DEADLINE_S - (time.monotonic() - started))
        trained_s = time.monotonic() - started
        board = dashboards.load(dashboards.JOB_BOARD)
        panels = [
            (title, dashboards.substitute(expr, NAMESPACE, JOB))
            for title, expr in dashboards.panel_queries(board, only_rows=(dashboards.GATEWAY_ROW,))
        ]
        no_data = dashboards.without_data(prom, panels, timeout=60, shows=dashboards.has_number)
        shown = [f"{title}: {_shown(prom.query(expr))}" for title, expr in panels]
        # a command-line agent that never exits: both sessions of each of its 2 groups killed at 3 s
        cli_agent = subprocess.run(
            [sys.executable, "-m", "asyncrl_workloads.cli", "agent", "--n", "2", "--groups", "2",
             "--timeout", "3", "--", "sleep", "600"],
            cwd=tmp_path, env={**env, **info["env"]}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        run_pids = procfs.run_processes(run_dir)
        worker = next(pid for pid in run_pids if "lookup_agent.py" in procfs.cmdline(pid, limit=4096))
        os.kill(worker, signal.SIGSTOP)  # the job's agent pauses: no new sessions, the run goes quiet
        rollout, trainer = _quiet([pods["rollout"], pods["trainer"]])
        nats_url = json.loads((run_dir / "job.json").read_text())["endpoints"]["natsUrl"]
        stored, in_stream = learning.stream_state(nats_url, NAMESPACE, JOB)
        running = procfs.run_processes(run_dir)
        os.kill(worker, signal.SIGCONT)  # it then takes the runner's SIGTERM like every pod
        runner.send_signal(signal.SIGINT)
        assert runner.wait(timeout=90) == 130
        left = procfs.run_processes(run_dir)
    finally:
        if runner.poll() is None:
            runner.kill()
        if prom is not None:
            prom.stop()
        runner_log.close()
    print(
        f"{STEPS} steps trained {trained_s:.0f} s after start; whole test {time.monotonic() - started:.0f} s"
    )
    print("the Agent gateway row:\n  " + "\n  ".join(shown))
    assert panels, f"the job dashboard has no {dashboards.GATEWAY_ROW!r} row"
    assert not no_data, "panels without data:\n" + "\n".join(no_data)
    # Ctrl-C stops every process of the run, engines included, and says so in its summary
    assert len(running) >= 4, running  # trainer, rollout, its engine core, nats-server at least
    assert left == [], left
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["detail"] == "SIGINT" and summary["stopSeconds"] < 30, summary
    agent_output = (run_dir / "logs" / "gw-agent-0.log").read_text()
    assert "group g" in agent_output, agent_output[-3000:]
    assert cli_agent.returncode == 0, cli_agent.stdout[-2000:] + cli_agent.stderr[-2000:]
    assert cli_agent.stdout.splitlines()[-1] == "asyncrl agent: 2 groups, 0 sessions ended, 4 aborted"
    assert cli_agent.stdout.count("still running at --timeout 3s: killed, session aborted") == 4

    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    learning.assert_rises([s["reward_mean"] for s in steps], "reward")
    # what the gateway recorded is what the engine sampled: for samples of the trainer's current weights the
    # recorded (behaviour) logprobs of the generated tokens equal the trainer's own, as in the single-turn e2e
    gaps = [s["fresh_logprob_gap"] for s in steps if "fresh_logprob_gap" in s]
    assert gaps and max(gaps) < 1e-3, gaps

    # conservation: every trajectory the rollout published is stored once, and trained, dropped or queued
    produced = learning.total(rollout, "asyncrl_trajectories_produced_total")
    consumed = learning.total(trainer, "asyncrl_trajectories_consumed_total")
    dropped = learning.total(trainer, "asyncrl_trajectories_dropped_total")
    assert produced == stored > 0
    assert stored == consumed + dropped + in_stream, (stored, consumed, dropped, in_stream)
    assert consumed >= sum(len(s["ids"]) for s in steps[:STEPS])

    # the gateway's books: every session accounted for, no server error
    sessions = {
        state: learning.total(rollout, "asyncrl_gateway_sessions_total", state=state)
        for state in ("started", "ended", "expired", "aborted")
    }
    active = learning.total(rollout, "asyncrl_gateway_sessions_active")
    closed = sessions["ended"] + sessions["expired"] + sessions["aborted"]
    assert sessions["started"] == closed + active, (sessions, active)
    assert sessions["ended"] >= produced and sessions["aborted"] == 4  # the sleeping CLI's, nothing else
    codes = {
        (dict(labels)["route"], dict(labels)["code"]): value
        for name, labels, value in rollout
        if name == "asyncrl_gateway_requests_total" and value
    }
    assert not [key for key in codes if key[1].startswith("5")], codes
    served = sum(codes.get((api, "200"), 0) for api in APIS)
    assert codes[("groups", "200")] >= produced / GROUP and served >= produced, codes
    assert all(codes.get((api, "200")) for api in APIS), codes  # the groups took the three APIs in turn
    assert (run_dir / "summary.json").exists()
