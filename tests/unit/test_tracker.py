"""The tracker's bookkeeping (tracking/tracker.py) with a sink that records calls in memory. The real
backends (an MLflow server, W&B offline, TensorBoard event files) are driven by tests/e2e/test_tracking.py;
this covers the paths a real run hits only by timing: a restart after a step reached the backend but not
tracking.json, and a sink that fails and recovers."""

from __future__ import annotations

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
        return None

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
