"""Validation runs (spec.data.validation, spec.data.validationSampling): the spec's rules, when a run is
due, its mean@k and pass@k, what a run sends, how the trainer keeps it, and how the local runner shows it.
The parts here are pure or run on stand-in generation; the real engine, bus, trainer and trackers run a
sampled validation in tests/e2e/test_tracking.py and a greedy one in tests/e2e/test_async_learning.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import pathlib
from typing import Any

import prometheus_client
import pydantic
import pytest
from asyncrl_api import models, status, task
from asyncrl_testing import jobs
from asyncrl_workloads import metrics
from asyncrl_workloads.bus import codec
from asyncrl_workloads.episode import chat as chat_mod
from asyncrl_workloads.local import plot, progress
from asyncrl_workloads.rewards import scorer as scorer_mod
from asyncrl_workloads.rollout import validation
from asyncrl_workloads.trainer import validation as trainer_validation

VALIDATED = {"validation": "/data/val.jsonl"}


def _data(data: dict[str, Any]) -> task.DataSpec:
    spec = models.AsyncRLJobSpec.model_validate(jobs.deep_merge(jobs.malformed_cases()[0], {"data": data}))
    return spec.data


def test_validation_is_one_greedy_answer_per_record_unless_sampling_is_set() -> None:
    default = _data(VALIDATED).validation_sampling_settings()
    assert (default.n, default.temperature, default.top_p, default.pass_threshold) == (1, 0.0, 1.0, 1.0)
    sampled = _data(
        {**VALIDATED, "validationSampling": {"samplesPerPrompt": 8, "temperature": 0.6, "topP": 0.95,
                                             "passThreshold": 0.5}}
    ).validation_sampling_settings()  # fmt: skip
    assert (sampled.n, sampled.temperature, sampled.top_p, sampled.pass_threshold) == (8, 0.6, 0.95, 0.5)
    assert sampled.to_api() == {"samplesPerPrompt": 8, "temperature": 0.6, "topP": 0.95, "passThreshold": 0.5}
    # one sampled answer per record is allowed (pass@1 of a sampled policy)
    assert (
        _data({**VALIDATED, "validationSampling": {"temperature": 1.0}}).validation_sampling_settings().n == 1
    )


@pytest.mark.parametrize(
    ("validated", "sampling", "field", "words"),
    [
        (False, {"samplesPerPrompt": 4, "temperature": 1.0}, ".validationSampling", "needs data.validation"),
        (True, {"samplesPerPrompt": 4}, ".samplesPerPrompt", "temperature above 0"),
        (True, {"samplesPerPrompt": 4, "temperature": 0.0}, ".samplesPerPrompt", "greedy"),
        (True, {"samplesPerPrompt": 0}, "samplesPerPrompt", "greater than or equal"),
        (True, {"samplesPerPrompt": 1025, "temperature": 1.0}, "samplesPerPrompt", "less than or equal"),
        (True, {"topP": 0.0}, "topP", "greater than"),
    ],
)
def test_sampling_rules_name_the_field(
    validated: bool, sampling: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        _data({**(VALIDATED if validated else {}), "validationSampling": sampling})
    assert field in str(info.value) and words in str(info.value)


@pytest.mark.parametrize(
    ("rewards", "threshold", "mean_at_k", "pass_at_k"),
    [
        # k = 1 greedy: the plain mean and the share of records that passed
        ([[1.0], [0.0], [1.0], [0.0]], 1.0, 0.5, 0.5),
        # k = 3: (1 + 0 + 0 + 0 + 0 + 0 + 0.5 + 1) / 8 scored; records 0 and 2 have a 1, record 3 none scored
        ([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.5, None, 1.0], [None, None, None]], 1.0, 0.3125, 2 / 3),
        ([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.5, None, 1.0], [None, None, None]], 0.5, 0.3125, 2 / 3),
        ([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.5, None, 1.0], [None, None, None]], 0.0, 0.3125, 1.0),
        # partial credit below the threshold: mean@k can exceed pass@k unless rewards are 0 or 1
        ([[0.9, 0.9], [0.9, 0.8]], 1.0, 0.875, 0.0),
        ([[-1.0, 2.0], [-1.0, -1.0]], 1.5, -0.25, 0.5),
        ([[None, None]], 1.0, None, None),
        ([], 1.0, None, None),
    ],
)
def test_mean_at_k_and_pass_at_k(rewards, threshold, mean_at_k, pass_at_k) -> None:
    mean, passed = validation.at_k(rewards, threshold)
    assert mean == (None if mean_at_k is None else pytest.approx(mean_at_k))
    assert passed == (None if pass_at_k is None else pytest.approx(pass_at_k))


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
    result = validation.summarize(20, 4, [[1.0], [None], [0.0], [0.5]], 1, 1.0, 2.34567, 0.0)
    assert result == {
        "step": 20, "paramVersion": 4, "rewardMean": 0.5, "k": 1, "meanAtK": 0.5, "passAtK": 1 / 3,
        "samples": 4, "failed": 1, "seconds": 2.346, "time": "1970-01-01T00:00:00Z",
    }  # fmt: skip
    unscored = validation.summarize(0, 0, [[None]], 1, 1.0, 0.0, 0.0)
    assert (unscored["rewardMean"], unscored["meanAtK"], unscored["passAtK"]) == (None, None, None)
    status.ValidationProgress.model_validate(result)  # what status.progress.validation accepts
    sampled = validation.summarize(8, 2, [[1.0, 0.0], [0.0, None]], 2, 1.0, 1.0, 0.0)
    assert (sampled["k"], sampled["meanAtK"], sampled["passAtK"], sampled["samples"], sampled["failed"]) == (
        2, 1 / 3, 0.5, 4, 1
    )  # fmt: skip
    assert status.ValidationProgress.model_validate(sampled).pass_at_k == 0.5


def test_a_sample_row_holds_what_verls_generations_logger_does_plus_the_record() -> None:
    record = {"question": "2+2?", "answer": "4"}
    row = validation.sample_row(10, 2, record, "question", "4", 1.0, None, index=3, sample=1)
    assert row == {
        "step": 10, "version": 2, "index": 3, "sample": 1, "prompt": "2+2?", "response": "4", "reward": 1.0,
        "error": None, "record": record,
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

    def validator(self, every: int, k: int = 1) -> validation.Validator:
        """k > 1: the answers are the record's `say` then `also` (the rest of its k), one line each."""
        records = [
            {"prompt": "a", "say": "a", "also": "xa"}, {"prompt": "b", "say": "c", "also": "bb"},
            {"prompt": "!", "say": "!", "also": "!!"}, {"prompt": "?", "say": "?", "also": "??"},
        ][: 3 if k == 1 else 4]  # fmt: skip

        async def generate(record: dict[str, Any]) -> list[tuple[str, Any]]:
            if record["prompt"] == "?":
                raise chat_mod.FormatError("the template rejects it")
            return [(text, None) for text in (record["say"], *record["also"])[:k]]

        def reward(record: dict[str, Any], response: str) -> float:
            if response == "!":
                raise ValueError("unscorable")
            return float(response == record["prompt"])

        async def send(part: str, body: dict[str, Any]) -> None:
            self.sent.append((part, body))

        identity = metrics.Identity("test-validation", f"every-{every}-k-{k}", "rollout", "0")
        return validation.Validator(
            validation.ValidationSettings(every, concurrency=2, k=k), records, generate,
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
    labels = {"namespace": "test-validation", "job": "every-5-k-1", "role": "rollout", "replica": "0"}
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
    assert sample("asyncrl_validation_k", labels) == 1.0
    assert sample("asyncrl_validation_mean_at_k", labels) == 0.5
    assert sample("asyncrl_validation_pass_at_k", labels) == 0.5  # "a" passed, "b" did not, "!" failed


def test_a_sampled_run_sends_k_rows_per_record_and_reports_mean_and_pass_at_k() -> None:
    run = Run()

    async def scenario() -> dict[str, Any]:
        v = run.validator(every=5, k=3)
        v.loaded(0)
        await v.wait()
        return v.results[0]

    result = asyncio.run(scenario())
    rows = [body for part, body in run.sent if part == "sample"]
    assert [part for part, _ in run.sent] == ["sample"] * 12 + ["result"]  # 4 records x 3, then the result
    assert [(r["index"], r["sample"], r["response"], r["reward"]) for r in rows] == [
        (0, 0, "a", 1.0), (0, 1, "x", 0.0), (0, 2, "a", 1.0),
        (1, 0, "c", 0.0), (1, 1, "b", 1.0), (1, 2, "b", 1.0),
        (2, 0, "!", None), (2, 1, "!", None), (2, 2, "!", None),  # every reward failed: in neither mean
        (3, 0, "", None), (3, 1, "", None), (3, 2, "", None),  # the template rejected the record
    ]  # fmt: skip
    assert rows[9]["error"] == "the template rejects it"
    # mean@3 = (1 + 0 + 1 + 0 + 1 + 1) / 6; pass@3 = 2 of the 2 records with a scored answer
    assert result == {**result, "k": 3, "samples": 12, "failed": 6, "meanAtK": 4 / 6, "passAtK": 1.0}
    assert result["rewardMean"] == result["meanAtK"]
    labels = {"namespace": "test-validation", "job": "every-5-k-3", "role": "rollout", "replica": "0"}
    sample = metrics.REGISTRY.get_sample_value
    assert sample("asyncrl_validation_k", labels) == 3.0
    assert sample("asyncrl_validation_mean_at_k", labels) == pytest.approx(4 / 6)
    assert sample("asyncrl_validation_pass_at_k", labels) == 1.0
    assert sample("asyncrl_validation_samples", labels) == 12.0


def test_an_agent_job_validates_k_whole_episodes_per_record() -> None:
    @dataclasses.dataclass
    class Episode:
        final_text: str

    class Loop:  # stands in for episode.loop.ToolLoop: each run is one episode
        def __init__(self) -> None:
            self.runs = 0

        async def run(self, record: dict[str, Any], seed: int | None) -> Episode:
            self.runs += 1
            return Episode(f"{record['prompt']}{self.runs}")

    loop = Loop()
    answers = asyncio.run(validation.episodes(loop, 3)({"prompt": "p"}))
    assert [text for text, _ in answers] == ["p1", "p2", "p3"] and loop.runs == 3
    assert all(isinstance(ep, Episode) for _, ep in answers)  # the reward gets the episode


def test_the_trainer_logs_every_sample_and_reports_the_highest_step(tmp_path: pathlib.Path) -> None:
    log = trainer_validation.ValidationLog(tmp_path / "val" / "validation.jsonl")
    row = validation.sample_row(8, 2, {"prompt": "a"}, "prompt", "a", 1.0, None)
    for part, body in [
        ("sample", row),
        ("result", validation.summarize(8, 2, [[1.0, 0.0]], 2, 1.0, 1.0, 0.0)),
        (
            "result",
            validation.summarize(0, 0, [[0.0, 0.0]], 2, 1.0, 1.0, 0.0),
        ),  # a restarted rollout's baseline
    ]:
        log.take(*codec.decode_validation(codec.encode_validation(part, body)))
    lines = (tmp_path / "val" / "validation.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [row]
    assert log.latest is not None and (log.latest["step"], log.latest["rewardMean"]) == (8, 0.5)
    assert (log.latest["k"], log.latest["meanAtK"], log.latest["passAtK"]) == (2, 0.5, 1.0)
    reported = status.ValidationProgress.model_validate(log.latest)
    assert (reported.param_version, reported.k, reported.mean_at_k, reported.pass_at_k) == (2, 2, 0.5, 1.0)
    # the step log's next line gets both results, in arrival order, once
    assert [(r["step"], r["passAtK"]) for r in log.take_new()] == [(8, 1.0), (0, 0.0)]
    assert log.take_new() == []


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
