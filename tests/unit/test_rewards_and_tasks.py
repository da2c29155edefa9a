"""Reward loading (rewards/loader.py), prompt sources and the builtin say_char and lookup tasks (tasks/)."""

from __future__ import annotations

import json
import pathlib
import types
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from asyncrl_workloads.episode import tools
from asyncrl_workloads.rewards import loader
from asyncrl_workloads.tasks import lookup, say_char, source


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
    assert list(source.load_prompts("builtin:say_char")) == say_char.records()
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"q": "hi", "answer": 1}) + "\n\n" + json.dumps({"q": "yo"}) + "\n")
    assert list(source.load_prompts(str(path), "q")) == [{"q": "hi", "answer": 1}, {"q": "yo"}]


@pytest.mark.parametrize(
    ("content", "key", "message"),
    [
        (None, "prompt", "cannot read"),
        ("", "prompt", "holds no prompts"),
        ("{bad\n", "prompt", "line 1 is not JSON"),
        ("[1]\n", "prompt", "line 1 is not a JSON object"),
        ('{"text": "x"}\n', "prompt", "line 1: field 'prompt' must be a string"),
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


def _two(record: Mapping[str, Any], response: str) -> float:
    return 1.0


def _three(record: Mapping[str, Any], response: str, episode: Any) -> float:
    return 1.0


def _optional_episode(record: Mapping[str, Any], response: str, episode: Any = None) -> float:
    return 1.0


def _star(record: Mapping[str, Any], response: str, *rest: Any) -> float:
    return 1.0


def _keywords(record: Mapping[str, Any], response: str, **options: Any) -> float:
    return 1.0


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (_two, False),
        (_three, True),
        (_optional_episode, True),
        (_star, True),
        (_keywords, False),
        (max, False),
    ],
    ids=["two", "three", "optional-episode", "star-args", "keywords-only", "builtin-without-signature"],
)
def test_a_reward_takes_the_episode_when_it_accepts_a_third_argument(
    fn: Callable[..., Any], expected: bool
) -> None:
    assert loader.takes_episode(fn) is expected


def test_score_passes_the_episode_only_to_functions_that_take_it() -> None:
    seen: list[tuple[Any, ...]] = []
    episode = object()

    def two(record: Mapping[str, Any], response: str) -> float:
        seen.append((record, response))
        return 0.5

    def three(record: Mapping[str, Any], response: str, episode: Any) -> float:
        seen.append((record, response, episode))
        return 0.25

    record = {"prompt": "p"}
    assert loader.score(two, record, "r", episode) == 0.5
    assert loader.score(three, record, "r", episode) == 0.25
    assert loader.score(three, record, "r") == 0.25
    assert seen == [(record, "r"), (record, "r", episode), (record, "r", None)]


@pytest.mark.parametrize("messages_key", ["prompt", "conversation"])
def test_chat_prompts_may_be_lists_of_messages(tmp_path: pathlib.Path, messages_key: str) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({messages_key: messages}) + "\n" + json.dumps({messages_key: "hello"}) + "\n")
    assert list(source.load_prompts(str(path), messages_key, chat=True)) == [
        {messages_key: messages},
        {messages_key: "hello"},
    ]


NOT_MESSAGES = {
    "empty": [],
    "no-role": [{"content": "no role"}],
    "no-content": [{"role": "user"}],
    "role-not-a-string": [{"role": 1, "content": "x"}],
    "strings": ["hi"],
    "one-dict": {"role": "user", "content": "hi"},
    "int": 7,
    "null": None,
}
MESSAGES = [{"role": "user", "content": "hi"}]


def _got(prompt: Any) -> str:
    return "null" if prompt is None else type(prompt).__name__


def _second_prompt(tmp_path: pathlib.Path, prompt: Any) -> str:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"prompt": prompt}) + "\n")
    return str(path)


@pytest.mark.parametrize("prompt", [MESSAGES, *NOT_MESSAGES.values()], ids=["messages", *NOT_MESSAGES])
def test_raw_format_refuses_a_prompt_that_is_not_a_string(tmp_path: pathlib.Path, prompt: Any) -> None:
    path = _second_prompt(tmp_path, prompt)
    with pytest.raises(source.PromptSourceError) as err:
        source.load_prompts(path)
    assert str(err.value) == (
        f"spec.data.prompts: {path!r} line 2: field 'prompt' must be a string (data.format raw), got "
        + _got(prompt)
    )


@pytest.mark.parametrize("prompt", NOT_MESSAGES.values(), ids=NOT_MESSAGES)
def test_chat_format_refuses_a_prompt_that_is_neither_a_string_nor_messages(
    tmp_path: pathlib.Path, prompt: Any
) -> None:
    path = _second_prompt(tmp_path, prompt)
    with pytest.raises(source.PromptSourceError) as err:
        source.load_prompts(path, chat=True)
    assert str(err.value) == (
        f"spec.data.prompts: {path!r} line 2: "
        "field 'prompt' must be a string or a list of {role, content} messages, got " + _got(prompt)
    )


def test_lookup_records_hide_a_cycling_secret_the_prompt_does_not_show() -> None:
    records = source.load_prompts("builtin:lookup", chat=True)
    assert len(records) == lookup.RECORDS
    assert [r["secret"] for r in records] == [lookup.ALPHABET[i % len(lookup.ALPHABET)] for i in range(32)]
    assert all(r["prompt"] == "secret?" for r in records)
    assert lookup.lookup(records[5]) == "f"
    assert loader.resolve(None, "builtin:lookup") is lookup.reward


def _episode(*outcomes: str) -> Any:
    return types.SimpleNamespace(tool_calls=[tools.CallResult("lookup", o, "c", 0.0) for o in outcomes])


def _gateway_episode(*tool_contents: str) -> Any:
    """A gateway session's episode: no recorded calls (the agent ran them), its conversation only."""
    messages = [{"role": "user", "content": "secret?"}]
    for content in tool_contents:
        messages += [{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]},
                     {"role": "tool", "tool_call_id": "1", "content": content}]  # fmt: skip
    return types.SimpleNamespace(tool_calls=[], messages=messages)


@pytest.mark.parametrize(
    ("response", "episode", "expected"),
    [
        ("c", _episode("ok"), 1.0),
        ("  c then more", _episode("error", "ok"), 1.0),
        ("a", _episode("ok"), 0.3),
        ("z", _episode("ok"), 0.2),
        ("C", _episode("ok"), 0.2),
        ("", _episode("ok"), 0.2),
        ("c", _episode(), 0.0),
        ("c", _episode("error", "timeout", "bad_arguments", "unknown_tool", "malformed"), 0.0),
        ("c", None, 0.0),
        ("c", _gateway_episode("c"), 1.0),
        ("a", _gateway_episode("error: boom", "c"), 0.3),
        ("c", _gateway_episode("error: the tool call could not be parsed"), 0.0),
        ("c", _gateway_episode(), 0.0),
    ],
    ids=[
        "right-letter",
        "right-after-spaces",
        "other-letter",
        "not-a-letter",
        "capital",
        "empty",
        "no-call",
        "no-successful-call",
        "single-turn",
        "gateway-right-letter",
        "gateway-other-letter",
        "gateway-only-errors",
        "gateway-no-call",
    ],
)
def test_lookup_reward_grades_the_answer_only_after_a_successful_call(
    response: str, episode: Any, expected: float
) -> None:
    assert loader.score(lookup.reward, {"prompt": "secret?", "secret": "c"}, response, episode) == expected
