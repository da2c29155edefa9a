"""spec.rollout.autoscale under `asyncrl run` (issue 35): examples/tiny-cpu.yaml started with one rollout
and `autoscale: {minReplicas: 1, maxReplicas: 2}` (short windows) on this 2-core machine, through a
scale-up and a later scale-down. One rollout cannot keep the trainer busy, so the runner's decision (the
operator's asyncrl_api.autoscale.decide on the trainer's own report) starts the second; the trainer's wait
share falls once it serves. The scale-up is then on probation: it must raise the trainer's consumed
samples/s by ``minScaleUpGain``, set here to 2.0 (three times the rate), which a second replica can never
give, so the runner undoes it: replica 1 is SIGTERMed (it aborts or publishes whole its in-flight groups
and says bye to weight sync) and the trainer goes on with replica 0 without a stall. (With the default
0.05 the outcome depends on the machine: here a second replica on the trainer's cores lowers samples/s,
see BENCHMARKS.md's autoscale row.) Accounting closes across both changes: the stream reopened after the
run holds every message ever stored as acked (trained or dropped, in the trainer's ledger) or still
queued, and no trajectory id was trained twice, the removed replica's among them.

How long the second engine takes to load depends on the machine's load (45 s idle, over 60 s while other
work runs), so the run is not a fixed step count: the test stops it (SIGTERM, as Ctrl-C) SERVED_STEPS
steps after the scale-down, which also proves that a stop in the middle of training loses nothing."""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import yaml
from asyncrl_testing import jobs, learning, procfs
from asyncrl_workloads.local import natsserver
from asyncrl_workloads.trainer import checkpoint

pytestmark = pytest.mark.e2e

REPO = pathlib.Path(__file__).resolve().parents[2]
MAX_STEPS = 600  # an upper bound only: the test stops the run (below)
SERVED_STEPS = 15  # steps after the scale-down: the trainer goes on with one replica


def test_a_starved_trainer_gets_a_second_rollout_which_is_removed_when_it_does_not_pay(
    tmp_path: pathlib.Path,
) -> None:
    body = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    patch = {
        "model": {"path": str(tmp_path / "model")},
        "rollout": {"replicas": 1, "autoscale": {
            "minReplicas": 1, "maxReplicas": 2, "scaleUpStabilizationSeconds": 10,
            "scaleDownStabilizationSeconds": 20, "maxBlockedFraction": 0.9, "minScaleUpGain": 2.0}},
        "data": {"validation": None, "validateEverySteps": None},
        # a queue the fleet never fills: what dropOldest discards while the trainer holds a sample outside
        # its batcher is overcounted as queue_full for a while (seen once here at maxSize 256: 59 counted,
        # 0 lost); that counter is not this test's subject (noted on issue 35 for a fix)
        "async": {"queue": {"maxSize": 4096}},
        "maxSteps": MAX_STEPS,
        "progress": {"reportIntervalSeconds": 1},
    }  # fmt: skip
    body["spec"] = jobs.deep_merge(body["spec"], patch)
    job_file = tmp_path / "elastic.yaml"
    job_file.write_text(yaml.safe_dump(body, sort_keys=False))
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "asyncrl_workloads.cli", "run", str(job_file), "--run-dir", str(run_dir),
            "--poll", "1", "--timeout", "900"]  # fmt: skip
    log_path = tmp_path / "run.log"
    with log_path.open("w") as log:
        runner = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            stopped = _stop_once_served(runner, run_dir, deadline=time.monotonic() + 900)
            rc = runner.wait(timeout=120)
        finally:
            if runner.poll() is None:
                runner.kill()
    output = log_path.read_text()
    assert stopped and rc == 128 + signal.SIGTERM, (rc, output[-4000:])
    assert procfs.run_processes(run_dir) == []
    assert "autoscale: rollout replicas 1 -> 2: trainer starved" in output, output[-3000:]
    assert "autoscale: rollout replicas 2 -> 1: consumed samples/s" in output, output[-3000:]

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    scaled = next(i for i, r in enumerate(records) if r.get("rolloutReplicasDesired") == 2)
    served = next(i for i, r in enumerate(records) if r.get("rolloutReplicasReady") == 2)
    undone = next(i for i, r in enumerate(records) if i > scaled and r.get("rolloutReplicasDesired") == 1)
    assert scaled <= served < undone
    assert records[undone]["autoscaleReason"] == "ScaleUpUndone"
    assert any(r.get("autoscaleReason") == "Judging" for r in records[served:undone])
    before = [r["trainerWaitFraction"] for r in records[:scaled] if "trainerWaitFraction" in r]
    after = [r["trainerWaitFraction"] for r in records[served:undone] if "trainerWaitFraction" in r]
    # the report covers the last 20 steps: its last value while both replicas served is the fairest
    assert before and after and after[-1] < max(before), (before, after)
    print(f"trainer wait: {max(before):.2f} before the scale-up, {after[-1]:.2f} with two replicas")
    # the removed replica left weight sync (no round waited for it) and the trainer went on without it
    (trainer_log,) = [p.read_text() for p in (run_dir / "logs").glob("*trainer-0.log")]
    assert "replica 1 (incarnation" in trainer_log and "dropped replica 1" not in trainer_log, trainer_log[
        -3000:
    ]
    assert records[-1]["rolloutReplicasReady"] == 1

    cfg = json.loads((run_dir / "job.json").read_text())
    nats = natsserver.start(store_dir=run_dir / "nats", log_path=tmp_path / "nats-after.log")
    try:
        stored, in_stream = learning.stream_state(nats.url, cfg["namespace"], cfg["name"])
    finally:
        nats.stop()
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    ledger = checkpoint.Ledger.load(
        pathlib.Path(cfg["spec"]["trainer"]["checkpoint"]["path"]) / checkpoint.LEDGER
    )
    ids = [i for s in steps for i in s["ids"]]
    assert ledger.consumed_total == len(ids) == len(set(ids))  # nothing trained twice
    assert ledger.acked_total + in_stream <= stored  # nothing acked that was not stored
    queue_full = stored - in_stream - ledger.acked_total  # dropOldest: discarded by the stream itself
    assert steps[-1]["counters"]["dropped_queue_full"] <= queue_full  # the trainer never overcounts them
    dropped = ledger.dropped_stale + ledger.dropped_invalid + queue_full
    assert stored == ledger.consumed_total + dropped + in_stream  # produced = consumed + dropped + queued
    # the rollouts' own counters (last scraped before they stopped) never exceed what the stream stored
    assert 0 < records[-1]["produced"] <= stored
    assert {i.split(":")[1] for i in ids} == {"r0", "r1"}, "the new replica's samples were trained"


def _read_lines(path: pathlib.Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines[:-1]] + (
        [json.loads(lines[-1])] if lines and lines[-1].endswith("}") else []
    )


def _stop_once_served(runner: subprocess.Popen[str], run_dir: pathlib.Path, deadline: float) -> bool:
    """SIGTERM the runner once the fleet went 1 -> 2 -> 1, samples of the second replica were trained
    and the trainer took SERVED_STEPS more steps after the scale-down; False if the runner ended first or
    the deadline passed."""
    while runner.poll() is None and time.monotonic() < deadline:
        time.sleep(1)
        records = _read_lines(run_dir / "metrics.jsonl")
        desired = [r.get("rolloutReplicasDesired") for r in records]
        if 2 not in desired or 1 not in desired[desired.index(2) :]:
            continue
        undone_at = records[desired.index(2) + desired[desired.index(2) :].index(1)].get("step") or 0
        steps = _read_lines(run_dir / "steps.jsonl")
        if not steps or int(steps[-1]["step"]) < int(str(undone_at)) + SERVED_STEPS:
            continue
        if any(":r1:" in i for s in steps for i in s["ids"]):  # type: ignore[attr-defined]
            runner.send_signal(signal.SIGTERM)
            return True
    return False
