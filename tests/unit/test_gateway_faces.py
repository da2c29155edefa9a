"""The gateway's Messages and Responses faces (gateway/messages_api.py, gateway/responses_api.py) without an
engine: what each accepts, ignores and refuses, and that one tool conversation told in either dialect
becomes the same chat messages and tools the session's chat path continues. Served end to end in
tests/dataplane/test_gateway.py and tests/e2e/test_gateway_clients.py."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest
from asyncrl_workloads.gateway import messages_api, responses_api, sessions
from asyncrl_workloads.gateway.sessions import SessionError

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
        ({"tools": [{"type": "web_search"}]}, "tools[0].type: web_search"),
        ({"tools": [{"type": "computer_use_preview"}]}, "computer_use_preview"),
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
