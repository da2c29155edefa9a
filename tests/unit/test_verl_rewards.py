"""verl-style reward functions (rewards/loader.py): told apart by their parameters, called with verl's
keywords (ground truth from a dotted key, default reward_model.ground_truth), float and dict results
(score + numeric extras as per-sample metrics, rewards/scorer.py), and the start-up checks."""

from __future__ import annotations

import asyncio
import pathlib
import textwrap
from collections.abc import Mapping
from typing import Any

import pytest
from asyncrl_api import task as task_api
from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.rewards import loader, scorer
from asyncrl_workloads.tasks import source

RECORD = {
    "data_source": "openai/gsm8k",
    "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
    "reward_model": {"style": "rule", "ground_truth": "4"},
    "extra_info": {"split": "train", "index": 7},
    "answer": "four",
}

GSM8K_MODULE = '''
import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's examples: a float."""
    found = re.findall(r"#### (\\S+)", solution_str)
    return 1.0 if found and found[-1] == ground_truth else 0.0


def compute_score_dict(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """verl's dict form: score plus extra info."""
    right = solution_str.strip().endswith(ground_truth)
    return {"score": 1.0 if right else -0.5, "acc": right, "length": len(solution_str), "pred": "x"}


def needs_more(data_source, solution_str, ground_truth, tokenizer):
    return 0.0
'''


@pytest.fixture
def verl_module(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A user's reward file, importable the way spec.code makes it (a directory on sys.path)."""
    (tmp_path / "my_gsm8k_reward.py").write_text(textwrap.dedent(GSM8K_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_gsm8k_reward"


def test_a_verl_function_is_called_with_verl_keywords() -> None:
    seen: list[dict[str, Any]] = []

    def compute_score(
        data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None
    ) -> float:
        seen.append(dict(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth))
        seen[-1]["extra_info"] = extra_info
        return 0.75

    assert loader.is_verl_style(compute_score) and not loader.takes_episode(compute_score)
    assert loader.score(compute_score, RECORD, "#### 4") == 0.75
    assert loader.score(compute_score, RECORD, "#### 4", ground_truth_key="answer") == 0.75
    assert loader.score(compute_score, {"prompt": "p"}, "r", ground_truth_key="answer") == 0.75
    info = RECORD["extra_info"]
    assert seen == [
        {"data_source": "openai/gsm8k", "solution_str": "#### 4", "ground_truth": "4", "extra_info": info},
        {"data_source": "openai/gsm8k", "solution_str": "#### 4", "ground_truth": "four", "extra_info": info},
        {"data_source": None, "solution_str": "r", "ground_truth": None, "extra_info": {}},
    ]


def test_only_the_parameters_a_verl_function_names_are_passed() -> None:
    def two(solution_str: str, ground_truth: str) -> float:
        return float(solution_str == ground_truth)

    def everything(**kwargs: Any) -> float:  # no solution_str: not verl-style, and not (record, response)
        return 0.0

    assert loader.score(two, RECORD, "4") == 1.0
    assert not loader.is_verl_style(everything)


def test_the_module_file_loads_and_scores_float_and_dict_results(verl_module: str) -> None:
    fn = loader.load_reward(f"{verl_module}:compute_score")
    assert loader.score(fn, RECORD, "2 + 2 = 4 #### 4") == 1.0
    assert loader.score(fn, RECORD, "#### 5") == 0.0
    fn = loader.load_reward(f"{verl_module}:compute_score_dict")
    result = loader.scored(loader.call(fn, RECORD, "so 4"), "so 4")
    assert result == loader.Scored(1.0, {"acc": 1.0, "length": 4.0})  # "pred" is not numeric: not a metric


def test_a_verl_function_needing_more_is_refused_at_load(verl_module: str) -> None:
    with pytest.raises(loader.RewardLoadError) as err:
        loader.load_reward(f"{verl_module}:needs_more")
    assert str(err.value).startswith(
        f"spec.reward.function: '{verl_module}:needs_more' must accept verl's (data_source, solution_str, "
        "ground_truth, extra_info) ("
    )
    assert "tokenizer" in str(err.value)


def test_an_asyncrl_function_may_return_a_dict_too() -> None:
    def fn(record: Mapping[str, Any], response: str) -> dict[str, float]:
        return {"score": 0.5, "format_ok": 1}

    assert loader.scored(loader.call(fn, RECORD, "r"), "r") == loader.Scored(0.5, {"format_ok": 1.0})


@pytest.mark.parametrize(
    ("result", "message"),
    [({"acc": 1.0}, "a dict without 'score' (keys: ['acc'])"), ({"score": float("inf")}, "returned inf")],
)
def test_unusable_results_raise(result: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        loader.scored(result, "r")


def test_the_scorer_awaits_async_verl_functions_and_exports_the_extras() -> None:
    async def compute_score(data_source: str, solution_str: str, ground_truth: str, **kwargs: Any) -> Any:
        return {"score": 1.0 if ground_truth == "four" else 0.0, "acc": 1.0, "steps": 3}

    bound = metrics_mod.bind(metrics_mod.Identity("test-verl-rewards", "job", "rollout", "0"))
    job = scorer.Scorer(compute_score, ground_truth_key="answer", metrics=bound)
    assert asyncio.run(job.score(RECORD, "four")) == 1.0
    assert asyncio.run(job.score(RECORD, "four")) == 1.0
    labels = {"namespace": "test-verl-rewards", "job": "job", "role": "rollout", "replica": "0"}
    sample = metrics_mod.REGISTRY.get_sample_value
    assert sample("asyncrl_reward_extra_count", {**labels, "key": "acc"}) == 2.0
    assert sample("asyncrl_reward_extra_sum", {**labels, "key": "steps"}) == 6.0


def _reward(**fields: Any) -> task_api.RewardSpec:
    return task_api.RewardSpec.model_validate(fields)


def test_every_record_must_hold_the_ground_truth_a_verl_function_reads(verl_module: str) -> None:
    fn = loader.load_reward(f"{verl_module}:compute_score")
    assert scorer.record_fields(_reward(function=f"{verl_module}:compute_score"), fn) == {
        "reward_model.ground_truth": "verl's ground_truth"
    }
    spec = _reward(function=f"{verl_module}:compute_score", groundTruthKey="extra_info.answer")
    needs = scorer.record_fields(spec, fn)
    assert needs == {"extra_info.answer": "spec.reward.groundTruthKey"}
    with pytest.raises(source.PromptSourceError) as err:
        source.load_prompts("builtin:say_char", required=needs)
    assert str(err.value) == (
        "spec.data.prompts: 'builtin:say_char' row 0: field 'extra_info.answer' is missing "
        "(spec.reward.groundTruthKey)"
    )


def test_a_ground_truth_key_for_a_function_that_does_not_read_it_is_refused() -> None:
    spec = _reward(function="asyncrl_workloads.tasks.say_char:reward", groundTruthKey="answer")
    with pytest.raises(loader.RewardLoadError) as err:
        scorer.record_fields(spec, loader.load_reward(spec.function or ""))
    assert str(err.value) == (
        "spec.reward.groundTruthKey: only a verl-style reward.function (one with a solution_str parameter)"
        " reads it; 'asyncrl_workloads.tasks.say_char:reward' takes (record, response)"
    )


def test_validation_rows_carry_the_extras_as_verls_generations_log_does() -> None:
    from asyncrl_workloads.rollout import validation

    sent: list[tuple[str, dict[str, Any]]] = []
    records = [{**RECORD, "say": "4"}, {**RECORD, "say": "5"}]

    async def generate(record: dict[str, Any]) -> list[tuple[str, Any]]:
        return [(record["say"], None)]  # one greedy answer

    def compute_score(data_source: str, solution_str: str, ground_truth: str) -> dict[str, Any]:
        return {"score": float(solution_str == ground_truth), "length": len(solution_str), "note": "x"}

    async def send(part: str, body: dict[str, Any]) -> None:
        sent.append((part, body))

    async def run() -> None:
        identity = metrics_mod.Identity("test-verl-rewards", "validation", "rollout", "0")
        v = validation.Validator(
            validation.ValidationSettings(1, concurrency=2), records, generate,
            scorer.Scorer(compute_score), send, metrics_mod.bind(identity), {0: 0}.__getitem__,
        )  # fmt: skip
        v.loaded(0)
        await v.wait()

    asyncio.run(run())
    rows = [body for part, body in sent if part == "sample"]
    assert [(r["reward"], r["rewardExtras"]) for r in rows] == [
        (1.0, {"length": 1.0}),
        (0.0, {"length": 1.0}),
    ]
