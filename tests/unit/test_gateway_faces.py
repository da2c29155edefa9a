"""The gateway's Messages and Responses faces (gateway/messages_api.py, gateway/responses_api.py) without an
engine: what each accepts, ignores and refuses, and that one tool conversation told in either dialect
becomes the same chat messages and tools the session's chat path continues. Served end to end in
tests/dataplane/test_gateway.py and tests/e2e/test_gateway_clients.py."""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from asyncrl_workloads import metrics
from asyncrl_workloads.gateway import http, messages_api, responses_api, service, sessions
from asyncrl_workloads.gateway.sessions import SessionError
from asyncrl_workloads.rollout import engine
from vllm import SamplingParams

ARGS = '{"city": "Oslo"}'
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "get_time", "description": "Time.", "parameters": SCHEMA}}
]
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "time?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0_0", "type": "function", "function": {"name": "get_time", "arguments": ARGS}}]},
    {"role": "tool", "tool_call_id": "call_0_0", "content": "12:00"},
]  # fmt: skip
CLAUDE_CODE_BODY = {  # the fields Claude Code sends (docs/agent-frameworks.md), with a tool round trip
    "model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": True,
    "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "time?"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": "s"},
            {"type": "tool_use", "id": "call_0_0", "name": "get_time", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_0_0", "content": "12:00",
                                      "cache_control": {"type": "ephemeral"}}]},
    ],
    "tools": [{"name": "get_time", "description": "Time.", "input_schema": SCHEMA}],
    "metadata": {"user_id": "u"}, "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": []}, "output_config": {"effort": "high"},
}  # fmt: skip


def chat_view(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> tuple[Any, str]:
    """What the chat path compares for continuation: normalised messages (assistants by value)."""
    normal = sessions.normalise_messages(messages)
    return [sessions.normalise_assistant(m) or m for m in normal], sessions.tools_key(tools)


def test_a_claude_code_request_is_accepted_and_becomes_the_chat_conversation() -> None:
    messages_api._check(CLAUDE_CODE_BODY, messages_api.HONOURED)
    req = messages_api._parse(messages_api.protocol.AnthropicMessagesRequest, CLAUDE_CODE_BODY)
    messages, tools, choice = messages_api._chat(req)
    assert choice == "auto"
    assert chat_view(messages, tools) == chat_view(CHAT, CHAT_TOOLS)


def test_a_stateless_responses_input_becomes_the_chat_conversation() -> None:
    body = {
        "model": "m", "instructions": "Be brief.", "store": False, "reasoning": {"effort": "low"},
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k", "parallel_tool_calls": True,
        "tools": [{"type": "function", "name": "get_time", "description": "Time.", "parameters": SCHEMA}],
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "time?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {"type": "function_call", "call_id": "call_0_0", "name": "get_time", "arguments": ARGS},
            {"type": "function_call_output", "call_id": "call_0_0", "output": "12:00"},
        ],
    }  # fmt: skip
    responses_api._check(body)
    req = responses_api._parse(body)
    session = sessions.Session("sess-1", "k", sessions.Group("g", None, 1), 0.0, 0.0)
    messages, tools = responses_api._messages(session, req), responses_api._tools(req)
    assert chat_view(messages, tools) == chat_view(CHAT, CHAT_TOOLS)


def test_a_previous_response_id_chain_continues_the_stored_conversation() -> None:
    session = sessions.Session("sess-1", "k", sessions.Group("g", None, 1), 0.0, 0.0)
    session.responses["resp_1"] = sessions.normalise_messages(CHAT[:3])
    result = {"type": "function_call_output", "call_id": "call_0_0", "output": "12:00"}
    body = {"model": "m", "instructions": "Be brief.", "previous_response_id": "resp_1", "input": [result]}
    assert chat_view(responses_api._messages(session, responses_api._parse(body)), []) == chat_view(CHAT, [])
    with pytest.raises(SessionError, match="previous_response_id") as missing:
        responses_api._messages(session, responses_api._parse({**body, "previous_response_id": "resp_2"}))
    assert missing.value.status == 404


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"mcp_servers": []}, "mcp_servers"),
        ({"output_config": {"format": {"type": "json_schema", "schema": {}}}}, "output_config.format"),
        ({"tool_choice": {"type": "tool", "name": "get_time"}}, "tool_choice.type"),
        ({"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}, "disable_parallel_tool_use"),
        ({"kv_transfer_params": {}}, "kv_transfer_params"),
    ],
)
def test_messages_refuses_what_changes_sampling_by_name(change: dict[str, Any], named: str) -> None:
    with pytest.raises(SessionError, match=re.escape(named)) as refused:
        messages_api._check({**CLAUDE_CODE_BODY, **change}, messages_api.HONOURED)
    assert refused.value.status == 400


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"tools": [{"type": "custom", "name": "apply_patch"}]}, "tools[0].type: custom"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type: web_search_call"),
        ({"background": True}, "background"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"text": {"format": {"type": "json_schema"}}}, "text.format"),
        ({"truncation": "auto"}, "truncation"),
        ({"max_tool_calls": 2}, "max_tool_calls"),
        ({"conversation": "conv_1"}, "conversation"),
    ],
)
def test_responses_refuses_what_it_cannot_honour_by_name(change: dict[str, Any], named: str) -> None:
    with pytest.raises(SessionError, match=re.escape(named)) as refused:
        responses_api._check({"model": "m", "input": "hi", **change})
    assert refused.value.status == 400


def test_defaults_sent_explicitly_are_accepted() -> None:
    defaults = {"background": False, "truncation": "disabled", "top_logprobs": 0, "service_tier": "auto"}
    responses_api._check({"model": "m", "input": "hi", "text": {"format": {"type": "text"}}, **defaults})


def test_the_docs_list_every_ignored_field() -> None:
    docs = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "agent-frameworks.md").read_text()
    for name in sorted(messages_api.IGNORED | responses_api.IGNORED):
        assert f"`{name}`" in docs, name


# ---- Codex CLI's Responses requests (docs/agent-frameworks.md) ----------------------------------------
NAMESPACE = {
    "type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
    "tools": [{"type": "function", "name": "close_agent", "description": "Close one.", "strict": False,
               "parameters": {"type": "object", "properties": {"target": {"type": "string"}}}}],
}  # fmt: skip
CODEX_BODY = {  # the fields and shapes Codex CLI 0.169 sends in one POST /v1/responses (shortened texts)
    "model": "policy", "stream": True, "store": False, "tool_choice": "auto", "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "t1",
    "client_metadata": {"x-codex-installation-id": "i", "turn_id": "t"}, "instructions": "",
    "input": [
        {"type": "message", "id": "msg_1", "role": "developer",
         "content": [{"type": "input_text", "text": "You are a coding agent."}]},
        {"type": "message", "id": "msg_2", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "function_call", "id": "fc_1", "status": "completed", "name": "close_agent",
         "namespace": "multi_agent_v1", "arguments": '{"target":"x"}', "call_id": "call_a"},
        {"type": "function_call_output", "id": "fco_1", "call_id": "call_a", "output": "closed"},
    ],
    "tools": [
        {"type": "function", "name": "exec_command", "description": "Run.", "strict": False,
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
        NAMESPACE,
        {"type": "web_search", "external_web_access": False},
    ],
}  # fmt: skip


def test_a_codex_request_is_accepted_its_namespace_flattened_and_its_hosted_tool_dropped() -> None:
    assert responses_api._check(CODEX_BODY) == ["web_search"]
    req = responses_api._parse(CODEX_BODY)
    session = sessions.Session("sess-1", "k", sessions.Group("g", None, 1), 0.0, 0.0)
    messages, tools = responses_api._messages(session, req), responses_api._tools(req)
    assert [t["function"]["name"] for t in tools] == ["exec_command", "multi_agent_v1__close_agent"]
    assert [m["role"] for m in messages] == ["developer", "user", "assistant", "tool"]
    # the client's echo of a namespaced call is the flat name the model generated: the call continues
    assert messages[2]["tool_calls"][0]["function"]["name"] == "multi_agent_v1__close_agent"


@pytest.mark.parametrize(
    "kind", ["web_search", "file_search", "code_interpreter", "computer_use_preview", "image_generation",
             "mcp", "local_shell", "some_future_tool"],
)  # fmt: skip
def test_hosted_tools_are_dropped_or_refused_by_name(kind: str) -> None:
    body = {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f"}, {"type": kind}]}
    assert responses_api._check(body, "drop") == [kind]
    assert [t["type"] for t in responses_api._served(body)["tools"]] == ["function"]
    with pytest.raises(SessionError, match=re.escape(f"tools[1].type: {kind} is a hosted tool")) as refused:
        responses_api._check(body, "refuse")
    assert refused.value.status == 400


class FakeGateway:
    """What ``responses_api.create`` uses of a Gateway: settings, metrics, prepare and generate (the
    model's reply is given)."""

    def __init__(self, reply: service.Generated, hosted: str = "drop") -> None:
        self.s = service.GatewaySettings("http://gw", "policy", 4096, 16, hosted_tools=hosted)
        self.m = metrics.bind(metrics.Identity("test-faces", "job", "rollout", "0"))
        self.reply, self.chats = reply, list[dict[str, Any]]()

    def prepare_chat(self, session: sessions.Session, chat: dict[str, Any]) -> service.Prepared:
        self.chats.append(chat)
        return service.Prepared(None, None, None, SamplingParams(), 0, messages=chat["messages"])  # type: ignore[arg-type]

    async def generate(self, session: sessions.Session, prep: service.Prepared) -> service.Generated:
        return self.reply

    async def stream(self, session: sessions.Session, prep: service.Prepared) -> AsyncIterator[Any]:
        for piece in ("do", "ne"):
            yield piece
        yield self.reply


def generated(content: str, calls: list[dict[str, Any]]) -> service.Generated:
    completion = engine.Completion([5, 6], [-0.1, -0.2], [0, 0], "stop", content)
    return service.Generated("resp_x", completion, 10, content, calls, "tool_calls" if calls else "stop")


def test_a_namespaced_call_comes_back_with_its_namespace_and_the_dropped_tool_is_named_and_counted() -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "multi_agent_v1__close_agent", "arguments": '{"target": "y"}'}}  # fmt: skip
    g = FakeGateway(generated("", [call]))
    session = sessions.Session("sess-1", "k", sessions.Group("g", None, 1), 0.0, 0.0)
    counter = g.m.gateway_hosted_tools_dropped_by("web_search")
    before = counter._value.get()
    response = asyncio.run(responses_api.create(g, session, {**CODEX_BODY, "stream": False}))  # type: ignore[arg-type]
    assert response.headers[responses_api.DROPPED_HEADER] == "web_search"
    assert counter._value.get() == before + 1
    (out,) = json.loads(bytes(response.body))["output"]
    assert (out["type"], out["name"], out["namespace"], out["call_id"]) == (
        "function_call", "close_agent", "multi_agent_v1", "call_1",
    )  # fmt: skip
    seen = [t["function"]["name"] for t in g.chats[0]["tools"]]
    assert seen == ["exec_command", "multi_agent_v1__close_agent"]


def test_messages_names_the_field_of_a_whole_request_check() -> None:
    body = {**CLAUDE_CODE_BODY, "max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 4000}}
    with pytest.raises(SessionError) as refused:
        messages_api._parse(messages_api.protocol.AnthropicMessagesRequest, body)
    assert str(refused.value) == "thinking.budget_tokens: must be less than max_tokens"


def test_a_streamed_chat_completion_keeps_one_id_the_calls() -> None:
    g = FakeGateway(generated("done", []))
    app = http.GatewayApp(g, "admin", 1024)  # type: ignore[arg-type]
    prep = service.Prepared(None, None, None, None, 0)  # type: ignore[arg-type]
    prep.req = type("Req", (), {"stream_options": None})()

    async def collect() -> list[dict[str, Any]]:
        session = sessions.Session("sess-1", "k", sessions.Group("g", None, 1), 0.0, 0.0)
        return [json.loads(c) async for c in app._chat_chunks(session, prep, "policy")]

    chunks = asyncio.run(collect())
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "done"
    assert {c["id"] for c in chunks} == {prep.call_id} and prep.call_id.startswith("chatcmpl-")
