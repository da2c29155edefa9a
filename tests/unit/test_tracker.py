"""The tracker's bookkeeping (tracking/tracker.py) with a sink that records calls in memory. The real
backends (an MLflow server, W&B offline, TensorBoard event files) are driven by tests/e2e/test_tracking.py;
this covers the paths a real run hits only by timing: a restart after a step reached the backend but not
tracking.json, and a sink that fails and recovers."""

from __future__ import annotations

import json
import pathlib
import time
from typing import Any

from asyncrl_workloads.tracking import sinks, tracker


class Recording(sinks.Sink):
    backend = "mlflow"

    def __init__(self, holds: dict[str, int] | None = None, fail: int = 0) -> None:
        self.steps: list[int] = []
        self.holds, self.fail = holds or {}, fail
        self.started: list[str | None] = []
        self.validations: list[tuple[int, dict[str, float], list[dict[str, Any]]]] = []

    def start(self, run_id: str | None, name: str, tags: dict[str, str]) -> tuple[str, bool]:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("connection refused")
        self.started.append(run_id)
        return run_id or "run-1", run_id is None

    def log_params(self, params: dict[str, str]) -> None:
        return None

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self.steps.append(step)

    def log_validation(self, step: int, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        self.validations.append((step, metrics, rows))

    def logged(self) -> dict[str, int]:
        return self.holds


def _run(path: pathlib.Path, sink: Recording, steps: range) -> tracker.Tracker:
    t = tracker.Tracker([sink], path, "r", {}, {"a": "1"}, None)
    for step in steps:
        t.step({"step": step, "loss": 1.0})
    t.close(timeout=30)
    return t


def test_a_resumed_run_skips_what_the_backend_holds_beyond_the_saved_state(tmp_path: pathlib.Path) -> None:
    state = tmp_path / "tracking.json"
    first = Recording()
    _run(state, first, range(1, 6))
    assert first.steps == [1, 2, 3, 4, 5] and first.started == [None]
    # killed after step 7 reached the backend, before tracking.json said so (it says 5)
    again = Recording(holds={"last_step": 7})
    _run(state, again, range(5, 10))  # re-trained from the checkpoint at step 4
    assert again.started == ["run-1"] and again.steps == [8, 9]
    # a backend that says less than the file (or nothing) never makes a step log twice
    third = Recording(holds={"last_step": 2})
    _run(state, third, range(8, 12))
    assert third.steps == [10, 11]


def test_a_sink_that_fails_is_retried_and_reported_until_it_logs(tmp_path: pathlib.Path) -> None:
    sink = Recording(fail=1)
    t = tracker.Tracker([sink], tmp_path / "t.json", "r", {}, {}, None)
    try:
        t.step({"step": 1, "loss": 1.0})
        deadline = time.monotonic() + 10
        while t.status()["mlflow"]["reason"] == "Starting":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert t.status()["mlflow"]["reason"] in ("Unreachable", "Logging")
        while sink.steps != [1]:  # the retry after tracker.BACKOFF_MIN_S
            assert time.monotonic() < deadline, t.status()
            time.sleep(0.05)
        assert t.status()["mlflow"]["ready"] is True
    finally:
        t.close(timeout=5)


def test_a_validation_result_reaches_the_trackers_with_mean_and_pass_at_k(tmp_path: pathlib.Path) -> None:
    sink = Recording()
    t = tracker.Tracker([sink], tmp_path / "t.json", "r", {}, {}, None)
    result = {
        "step": 6, "paramVersion": 6, "rewardMean": 0.25, "k": 4, "meanAtK": 0.25, "passAtK": 0.5,
        "samples": 8, "failed": 0, "seconds": 1.5, "time": "1970-01-01T00:00:00Z",
    }  # fmt: skip
    row = {"step": 6, "index": 0, "sample": 3, "prompt": "a", "response": "b", "reward": 0.0, "record": {}}
    t.validation(result, [row])
    t.close(timeout=10)
    assert sink.validations == [
        (
            6,
            {
                "validation/rewardMean": 0.25, "validation/k": 4.0, "validation/meanAtK": 0.25,
                "validation/passAtK": 0.5, "validation/samples": 8.0, "validation/failed": 0.0,
                "validation/seconds": 1.5,
            },
            [{"prompt": "a", "response": "b", "reward": 0.0}],
        )
    ]  # fmt: skip


def test_tensorboard_says_what_its_event_files_hold_so_a_lagging_state_never_logs_a_step_twice(
    tmp_path: pathlib.Path,
) -> None:
    """The real writer and reader (torch.utils.tensorboard, tensorboard's EventAccumulator): CI once saw the
    e2e restart log a step twice to TensorBoard when the SIGKILL fell between a step's flush and
    tracking.json's write."""
    from tensorboard.backend.event_processing import event_accumulator  # noqa: PLC0415

    state, log_dir = tmp_path / "tracking.json", tmp_path / "tb"
    t = tracker.Tracker([sinks.TensorBoardSink(log_dir)], state, "r", {}, {"a": "1"}, None)
    for step in range(1, 9):
        t.step({"step": step, "loss": float(step)})
    t.validation({"step": 6, "rewardMean": 0.5}, [{"prompt": "p", "response": "r", "reward": 0.5}])
    t.close(timeout=30)
    assert sinks.TensorBoardSink(log_dir).logged() == {"last_step": 8, "last_validation": 6}
    # the kill: step 8 and the validation were flushed, the file still says 7 and none
    saved = json.loads(state.read_text())
    saved["tensorboard"]["last_step"] = 7
    saved["tensorboard"].pop("last_validation")
    state.write_text(json.dumps(saved))
    time.sleep(1.1)  # event files are read in name order, which starts with the second
    t = tracker.Tracker([sinks.TensorBoardSink(log_dir)], state, "r", {}, {"a": "1"}, None)
    for step in range(5, 13):  # re-trained from the checkpoint at step 4
        t.step({"step": step, "loss": 100.0 + step})
    t.validation({"step": 6, "rewardMean": 0.9}, [])
    t.validation({"step": 10, "rewardMean": 0.25}, [])
    t.close(timeout=30)
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 2
    events = event_accumulator.EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, 13))
    assert [e.value for e in loss][7:9] == [8.0, 109.0]  # the first value of step 8 stays
    assert [(e.step, e.value) for e in events.Scalars("validation/rewardMean")] == [(6, 0.5), (10, 0.25)]
