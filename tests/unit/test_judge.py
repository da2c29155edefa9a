"""The judge's pure parts: the template over a sample, the score parser, and the scorer's weighting.

The judge over a real endpoint (vLLM's OpenAI server) is tested in tests/dataplane/test_judge.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asyncrl_api import task
from asyncrl_workloads.rewards import judge, scorer


def spec(**kw: Any) -> task.JudgeSpec:
    return task.JudgeSpec.model_validate(kw)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("7", 0.7),
        ("Score: 7/10", 0.7),  # the first number, not the scale after it
        ("  10.0 ", 1.0),
        ("0", 0.0),
        ("I'd say 2.5 out of 10", 0.25),
    ],
)
def test_a_numeric_score_is_the_first_number_mapped_to_0_1(reply: str, expected: float) -> None:
    assert judge.parse_score(spec(), reply) == pytest.approx(expected)


def test_a_custom_range_is_normalised() -> None:
    assert judge.parse_score(spec(score={"min": 1, "max": 5}), "4") == pytest.approx(0.75)


@pytest.mark.parametrize("reply", ["no idea", "", "11", "-1"])
def test_a_reply_without_a_number_in_range_is_an_error_never_a_reward(reply: str) -> None:
    with pytest.raises(judge.JudgeError):
        judge.parse_score(spec(), reply)


def test_verdicts_take_the_first_word_the_reply_contains_as_a_whole_word() -> None:
    verdicts = spec(verdicts={"correct": 1.0, "incorrect": 0.0, "partial": 0.5})
    assert judge.parse_score(verdicts, "Incorrect: the answer is 4") == 0.0  # "correct" inside is no match
    assert judge.parse_score(verdicts, "The answer is CORRECT.") == 1.0
    assert judge.parse_score(verdicts, "partial, not incorrect") == 0.5
    with pytest.raises(judge.JudgeError):
        judge.parse_score(verdicts, "corrections needed")


def test_the_template_sees_the_record_the_response_and_the_conversation() -> None:
    template = "Q: {prompt}\nA: {response}\nRef: {reference}\nTopic: {topic}\n{conversation}"
    s = spec(template=template, system="Be {topic}")
    record = {"prompt": "what is 2+2?", "answer": 4, "topic": "strict"}
    messages = judge.build_messages(s, record, "4", None, "prompt")
    assert messages == [
        {"role": "system", "content": "Be strict"},
        {
            "role": "user",
            "content": "Q: what is 2+2?\nA: 4\nRef: 4\nTopic: strict\nuser: what is 2+2?\nassistant: 4",
        },
    ]


def test_a_multi_turn_episode_is_judged_on_its_whole_conversation() -> None:
    conversation = [
        {"role": "user", "content": "look up k"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "lookup", "arguments": '{"key": "k"}'}}],
        },
        {"role": "tool", "content": "v"},
        {"role": "assistant", "content": "v"},
    ]
    messages = judge.build_messages(spec(template="{conversation}"), {}, "v", conversation, "prompt")
    expected = 'user: look up k\nassistant: \n-> lookup({"key": "k"})\ntool: v\nassistant: v'
    assert messages[-1]["content"] == expected


def test_a_chat_record_prompt_gives_its_last_user_message() -> None:
    record = {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]}
    messages = judge.build_messages(spec(template="{prompt}|{reference}"), record, "x", None, "prompt")
    assert messages == [{"role": "user", "content": "hi|"}]


def test_template_placeholders_are_checked_at_start_up() -> None:
    judge.check_template(spec(template="{response} {topic} {{literal}}"), ["prompt", "topic"])
    with pytest.raises(ValueError, match=r"\{topic\}"):
        judge.check_template(spec(template="{response} {topic}"), None)  # a gateway job: no records
    with pytest.raises(ValueError, match="plain"):
        judge.check_template(spec(template="{response.__class__}"), [])
    with pytest.raises(ValueError, match="plain"):
        judge.check_template(spec(template="{response:>10}"), [])


def test_a_record_missing_a_field_is_a_judge_error() -> None:
    with pytest.raises(judge.JudgeError, match="topic"):
        judge.build_messages(spec(template="{topic}"), {"prompt": "p"}, "r", None, "prompt")


class FixedJudge:
    """Stands in for scorer.Judge in the weighting arithmetic only (HTTP: the dataplane test)."""

    def __init__(self, value: float, weight: float) -> None:
        self.spec = spec(weight=weight)
        self.value = value
        self.seen: list[Any] = []

    async def score(self, record: Any, response: str, conversation: Any) -> float:
        self.seen.append(conversation)
        return self.value


class Episode:
    messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]


def test_a_rule_and_a_judge_combine_with_their_weights() -> None:
    fixed = FixedJudge(0.5, weight=2.0)
    both = scorer.Scorer(lambda record, response: 1.0, fixed, function_weight=0.25)  # type: ignore[arg-type]
    assert asyncio.run(both.score({}, "r", Episode())) == pytest.approx(0.25 * 1.0 + 2.0 * 0.5)
    assert fixed.seen == [Episode.messages]


def test_async_rule_functions_are_awaited() -> None:
    async def rule(record: Any, response: str) -> float:
        await asyncio.sleep(0)
        return float(response == record["answer"])

    assert asyncio.run(scorer.Scorer(rule).score({"answer": "a"}, "a")) == 1.0  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nan"):

        async def bad(record: Any, response: str) -> float:
            return float("nan")

        asyncio.run(scorer.Scorer(bad).score({}, "a"))  # type: ignore[arg-type]


class FailingJudge(FixedJudge):
    async def score(self, record: Any, response: str, conversation: Any) -> float:
        if response == "bad":
            raise judge.JudgeError("no number in the judge's reply 'hm'")
        return self.value


def test_a_sample_whose_reward_fails_is_dropped_and_counted_never_given_a_reward() -> None:
    from asyncrl_workloads import metrics
    from asyncrl_workloads.rollout import group

    bound = metrics.bind(metrics.Identity("ns", "judge-drop", "rollout", "0"))
    samples = [
        group.Sample([1], [2], [-0.1], [0], [1], text)  # one generated token each
        for text in ("good", "bad", "good")
    ]
    only_judge = scorer.Scorer(None, FailingJudge(0.7, weight=1.0))  # type: ignore[arg-type]
    kept = asyncio.run(group.score(samples, {"prompt": "p"}, only_judge, bound, index=0))
    assert [(i, reward) for i, _, reward in kept] == [(0, 0.7), (2, 0.7)]
    assert bound.dropped["reward_error"]._value.get() == 1
