"""Validation runs (spec.data.validation): when one is due, what a run sends, how the trainer keeps it, and
how the local runner shows it. The parts here are pure or run on stand-in generation; the real engine,
bus and trainer run it in tests/e2e/test_local_runner.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import pathlib
from typing import Any

import prometheus_client
import pytest
from asyncrl_api import status
from asyncrl_workloads import metrics
from asyncrl_workloads.bus import codec
from asyncrl_workloads.local import plot, progress
from asyncrl_workloads.rewards import scorer as scorer_mod
from asyncrl_workloads.rollout import validation
from asyncrl_workloads.trainer import validation as trainer_validation


@pytest.mark.parametrize(
    ("previous", "step", "every", "due"),
    [
        (None, 0, 10, True),  # the replica's first weights: the baseline
        (None, 37, 10, True),  # a replica that started late validates what it first loads
        (0, 9, 10, False),
        (9, 10, 10, True),  # crosses 10
        (10, 10, 10, False),  # a catch-up round repeats the version: no second run
        (8, 13, 5, True),  # skipped versions still cross 10
        (11, 19, 10, False),
        (3, 4, 1, True),
    ],
)
def test_a_run_is_due_when_the_loaded_step_crosses_a_multiple(previous, step, every, due) -> None:
    assert validation.due(previous, step, every) is due


def test_the_mean_leaves_failed_rewards_out_and_is_none_when_nothing_was_scored() -> None:
    result = validation.summarize(20, 4, [1.0, None, 0.0, 0.5], 2.34567, 0.0)
    assert result == {
        "step": 20, "paramVersion": 4, "rewardMean": 0.5, "samples": 4, "failed": 1, "seconds": 2.346,
        "time": "1970-01-01T00:00:00Z",
    }  # fmt: skip
    assert validation.summarize(0, 0, [None], 0.0, 0.0)["rewardMean"] is None
    status.ValidationProgress.model_validate(result)  # what status.progress.validation accepts


def test_a_sample_row_holds_what_verls_generations_logger_does_plus_the_record() -> None:
    record = {"question": "2+2?", "answer": "4"}
    row = validation.sample_row(10, 2, record, "question", "4", 1.0, None)
    assert row == {
        "step": 10, "version": 2, "prompt": "2+2?", "response": "4", "reward": 1.0, "error": None,
        "record": record,
    }  # fmt: skip
    assert validation.fit(row, 10_000) == row
    bulky = validation.sample_row(10, 2, {**record, "context": "x" * 5000}, "question", "4", 1.0, None)
    fitted = validation.fit(bulky, 1000)
    assert fitted is not None and fitted["record"] is None and fitted["reward"] == 1.0
    assert (
        validation.fit(validation.sample_row(1, 1, record, "question", "y" * 5000, 0.0, None), 1000) is None
    )


def test_validation_messages_round_trip_and_anything_else_is_refused() -> None:
    body = {"step": 3, "rewardMean": 0.25}
    assert codec.decode_validation(codec.encode_validation("result", body)) == ("result", body)
    with pytest.raises(codec.CodecError, match="part"):
        codec.encode_validation("summary", body)
    with pytest.raises(codec.CodecError, match="kind"):
        codec.decode_validation(codec.encode_announcement(1, 1, 0.0))


@dataclasses.dataclass
class Run:
    """A validator on stand-in generation (the answer is the record's `say`) with a real scorer."""

    sent: list[tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=list)
    steps: dict[int, int] = dataclasses.field(default_factory=lambda: {0: 0, 1: 4, 2: 8, 3: 12})

    def validator(self, every: int) -> validation.Validator:
        records = [{"prompt": "a", "say": "a"}, {"prompt": "b", "say": "c"}, {"prompt": "!", "say": "!"}]

        async def generate(record: dict[str, Any]) -> tuple[str, Any]:
            return record["say"], None

        def reward(record: dict[str, Any], response: str) -> float:
            if response == "!":
                raise ValueError("unscorable")
            return float(response == record["prompt"])

        async def send(part: str, body: dict[str, Any]) -> None:
            self.sent.append((part, body))

        identity = metrics.Identity("test-validation", f"every-{every}", "rollout", "0")
        return validation.Validator(
            validation.ValidationSettings(every, concurrency=2), records, generate,
            scorer_mod.Scorer(reward), send, metrics.bind(identity), self.steps.__getitem__,
        )  # fmt: skip


def test_a_run_sends_every_sample_then_the_result_and_sets_the_gauges() -> None:
    run = Run()

    async def scenario() -> validation.Validator:
        v = run.validator(every=5)
        for version in (0, 1, 2, 3):  # steps 0, 4, 8, 12: runs at 0, 8 (crosses 5) and 12 (crosses 10)
            v.loaded(version)
            await v.wait()
        return v

    v = asyncio.run(scenario())
    assert [r["step"] for r in v.results] == [0, 8, 12]
    parts = [part for part, _ in run.sent]
    assert parts == ["sample", "sample", "sample", "result"] * 3
    rows = [body for part, body in run.sent[:3]]
    assert [(r["response"], r["reward"]) for r in rows] == [("a", 1.0), ("c", 0.0), ("!", None)]
    assert rows[2]["error"] == "ValueError: unscorable"
    result = run.sent[3][1]
    assert (result["rewardMean"], result["samples"], result["failed"]) == (0.5, 3, 1)
    labels = {"namespace": "test-validation", "job": "every-5", "role": "rollout", "replica": "0"}
    sample = metrics.REGISTRY.get_sample_value
    assert sample("asyncrl_validation_reward", labels) == 0.5
    assert (
        sample("asyncrl_validation_step", labels),
        sample("asyncrl_validation_param_version", labels),
    ) == (
        12.0,
        3.0,
    )
    assert sample("asyncrl_validation_samples", labels) == 3.0


def test_the_trainer_logs_every_sample_and_reports_the_highest_step(tmp_path: pathlib.Path) -> None:
    log = trainer_validation.ValidationLog(tmp_path / "val" / "validation.jsonl")
    row = validation.sample_row(8, 2, {"prompt": "a"}, "prompt", "a", 1.0, None)
    for part, body in [
        ("sample", row),
        ("result", validation.summarize(8, 2, [1.0], 1.0, 0.0)),
        ("result", validation.summarize(0, 0, [0.0], 1.0, 0.0)),  # a restarted rollout's baseline
    ]:
        log.take(*codec.decode_validation(codec.encode_validation(part, body)))
    lines = (tmp_path / "val" / "validation.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [row]
    assert log.latest is not None and (log.latest["step"], log.latest["rewardMean"]) == (8, 1.0)
    assert status.ValidationProgress.model_validate(log.latest).param_version == 2


def test_the_generations_log_is_beside_the_checkpoints_unless_the_environment_names_it(monkeypatch) -> None:
    monkeypatch.delenv(trainer_validation.LOG_ENV, raising=False)
    assert trainer_validation.log_path("/ck") == pathlib.Path("/ck/validation.jsonl")
    monkeypatch.setenv(trainer_validation.LOG_ENV, "/runs/x/validation.jsonl")
    assert trainer_validation.log_path("/ck") == pathlib.Path("/runs/x/validation.jsonl")


def _exposition(job: str, step: int, reward: float | None) -> str:
    registry = prometheus_client.CollectorRegistry()
    values = ("default", job, "rollout", "0")
    gauges = {
        name: prometheus_client.Gauge(name, "", ("namespace", "job", "role", "replica"), registry=registry)
        for name in ("asyncrl_validation_step", "asyncrl_validation_reward")
    }
    gauges["asyncrl_validation_step"].labels(*values).set(step)
    gauges["asyncrl_validation_reward"].labels(*values).set(math.nan if reward is None else reward)
    return prometheus_client.generate_latest(registry).decode()


def test_the_local_runner_shows_and_plots_the_last_validation_run() -> None:
    tracker = progress.Tracker(max_steps=10, clock=iter(range(100)).__next__)
    assert "validationStep" not in tracker.record({"r0": None}, [])  # nothing before the first run
    first = tracker.record({"r0": _exposition("v", 0, 0.125)}, [])
    assert (first["validationStep"], first["validationReward"]) == (0, 0.125)
    assert "val 0.125@0" in progress.line(first)
    carried = tracker.record({"r0": None}, [])  # replica 0 restarting: the last run is carried
    assert carried["validationStep"] == 0
    later = tracker.record({"r0": _exposition("v", 5, 0.5)}, [])
    unscored = tracker.record({"r0": _exposition("v", 10, None)}, [])
    assert unscored["validationReward"] is None and "val -@10" in progress.line(unscored)
    records = [first, carried, later, unscored]
    # the reward panel's validation curve: one point per run (the e2e draws the PNGs)
    assert plot._series(records, "validationStep", "validationReward") == ([0, 5], [0.125, 0.5])
