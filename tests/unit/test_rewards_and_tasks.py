"""Reward loading (rewards/loader.py), prompt sources and the say_char task (tasks/)."""

from __future__ import annotations

import json
import pathlib

import pytest
from asyncrl_workloads.rewards import loader
from asyncrl_workloads.tasks import say_char, source


def test_reward_reference_resolves_to_the_function() -> None:
    fn = loader.load_reward("asyncrl_workloads.tasks.say_char:reward")
    assert fn is say_char.reward


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("no_colon", "is not of the form"),
        ("no_such_pkg.mod:fn", "cannot import module 'no_such_pkg.mod'"),
        ("asyncrl_workloads.tasks.say_char:nope", "has no attribute 'nope'"),
        ("asyncrl_workloads.tasks.say_char:ALPHABET", "is not callable"),
        ("asyncrl_workloads.tasks.say_char:records", "must accept (record, response)"),
    ],
)
def test_bad_reward_reference_names_the_field(reference: str, message: str) -> None:
    with pytest.raises(loader.RewardLoadError) as err:
        loader.load_reward(reference)
    assert str(err.value).startswith("spec.reward.function: ") and message in str(err.value)


def test_builtin_task_supplies_its_reward_when_none_is_given() -> None:
    assert loader.resolve(None, "builtin:say_char") is say_char.reward
    with pytest.raises(loader.RewardLoadError, match="spec.reward.function: required"):
        loader.resolve(None, "/data/prompts.jsonl")


def test_score_rejects_non_finite_rewards() -> None:
    assert loader.score(lambda record, response: 1, {}, "x") == 1.0
    with pytest.raises(ValueError, match="returned nan"):
        loader.score(lambda record, response: float("nan"), {}, "x")


@pytest.mark.parametrize(
    ("response", "expected"),
    [("c", 1.0), ("  cab", 1.0), ("a", 0.3), ("z", 0.1), ("C", 0.0), ("7c", 0.0), ("", 0.0), ("   ", 0.0)],
)
def test_say_char_reward_grades_the_first_character(response: str, expected: float) -> None:
    assert say_char.reward({"prompt": "say c:", "answer": "c"}, response) == expected


def test_say_char_records_cover_the_alphabet() -> None:
    records = say_char.records()
    assert [r["answer"] for r in records] == list(say_char.ALPHABET)
    assert all(r["prompt"] == f"say {r['answer']}:" for r in records)


def test_prompt_sources(tmp_path: pathlib.Path) -> None:
    assert source.load_prompts("builtin:say_char") == say_char.records()
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"q": "hi", "answer": 1}) + "\n\n" + json.dumps({"q": "yo"}) + "\n")
    assert source.load_prompts(str(path), "q") == [{"q": "hi", "answer": 1}, {"q": "yo"}]


@pytest.mark.parametrize(
    ("content", "key", "message"),
    [
        (None, "prompt", "cannot read"),
        ("", "prompt", "holds no prompts"),
        ("{bad\n", "prompt", "line 1 is not JSON"),
        ("[1]\n", "prompt", "line 1 is not a JSON object"),
        ('{"text": "x"}\n', "prompt", "record 0 of"),
    ],
)
def test_bad_prompt_sources_name_the_field(
    tmp_path: pathlib.Path, content: str | None, key: str, message: str
) -> None:
    path = tmp_path / "p.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(source.PromptSourceError) as err:
        source.load_prompts(str(path), key)
    assert str(err.value).startswith("spec.data.prompts: ") and message in str(err.value)
    with pytest.raises(source.PromptSourceError, match="unknown builtin task 'nope'"):
        source.load_prompts("builtin:nope")
