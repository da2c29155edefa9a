"""The OpenAI Responses API face of the gateway: ``POST /v1/responses``.

Called by ``gateway/http.py`` for a session's request (the OpenAI Agents SDK's default model, Codex CLI
and most new OpenAI-style agents speak it). The body is checked with vLLM's ``ResponsesRequest``; its
``input`` items (``message``, ``function_call``, ``function_call_output``; ``reasoning`` items are
dropped) become chat messages by vLLM's own conversion (``responses.utils.construct_input_messages``),
which then take the session's one chat path (``service.Gateway.prepare_chat`` -> ``generate``/``stream``
-> ``record``), so a call whose conversation extends an earlier one continues its trajectory as for chat.
The reply is answered as a Response (``message`` and ``function_call`` output items, built by vLLM's
``build_response_output_items``) or as the Responses event stream.

Both uses: stateless (``store: false``, the whole input every call) and ``previous_response_id`` chains,
whose earlier conversations the session holds (``Session.responses``; a chain lives as long as its
session). Fields: honoured ``HONOURED``; accepted and ignored ``IGNORED`` (they steer the vendor's
service, not what is sampled); anything else set to other than its default is refused with a 400 naming
it, as are ``tool_choice`` other than auto/none, ``text.format`` other than text, ``truncation: auto``
and an input item of a type not in ``INPUT_ITEMS``.

Tools: function tools as they are; a ``namespace`` tool's functions flattened to ``<namespace>__<name>``
(vLLM's ``get_function_tools``), the model's call of one returned as a ``function_call`` with its
``name`` and ``namespace`` (and read back from the client's input the same way), as Codex CLI expects;
hosted tools (``HOSTED_TOOLS``, and any other type but ``custom``, which is refused) are left out of what
the model sees, counted and named in the ``x-asyncrl-dropped-tools`` header, or refused with
``spec.agent.gateway.hostedTools: refuse``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

import pydantic
from asyncrl_workloads.gateway import service as service_mod
from asyncrl_workloads.gateway import sessions as sessions_mod
from asyncrl_workloads.gateway.sessions import Session, SessionError
from openai.types import responses as openai_responses
from starlette.responses import Response, StreamingResponse
from vllm.entrypoints.generate.base.protocol import FunctionCall
from vllm.entrypoints.openai.responses import protocol
from vllm.entrypoints.openai.responses import utils as responses_utils
from vllm.exceptions import VLLMValidationError
from vllm.tool_parsers import utils as tool_utils

HONOURED = frozenset({
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
    "temperature", "top_p", "top_k", "stream", "store", "previous_response_id", "seed",
})  # fmt: skip
IGNORED = frozenset({
    "metadata", "user", "reasoning", "include", "prompt_cache_key", "prompt_cache_retention", "service_tier",
    "safety_identifier", "stream_options", "text", "truncation", "client_metadata",
})  # fmt: skip
"""Accepted and ignored (docs/agent-frameworks.md); ``text.format`` other than text and ``truncation:
auto`` are refused. Not handed to vLLM's model (its ``include`` and ``service_tier`` enums lag OpenAI's)."""
SERVED_TOOLS = ("function", "namespace")
HOSTED_TOOLS = (
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
    "file_search", "code_interpreter", "computer", "computer_use", "computer_use_preview",
    "image_generation", "mcp", "local_shell", "shell", "apply_patch", "tool_search",
)  # fmt: skip
"""Tools whose calls the vendor's service runs or answers with items of their own: the gateway cannot
serve them. The metric's ``type`` label is one of these or ``other``."""
DROPPED_HEADER = "x-asyncrl-dropped-tools"
INPUT_ITEMS = ("message", "function_call", "function_call_output", "reasoning")
TEXT_PARTS = ("input_text", "output_text", "text")


def _check(body: Mapping[str, Any], hosted: str = "drop") -> list[str]:
    """Refuse what cannot be honoured (400 naming the field); the types of the hosted tools to leave
    out, in order (``hosted``: drop; refuse answers 400 for the first)."""
    fields = protocol.ResponsesRequest.model_fields
    for name in sorted(set(body) - HONOURED - IGNORED):
        default = fields[name].default if name in fields else None
        if body[name] is not None and body[name] != default:
            raise SessionError(400, f"{name}: not supported by the asyncrl gateway", "unsupported_parameter")
    text = body.get("text")
    if isinstance(text, Mapping) and (text.get("format") or {}).get("type", "text") != "text":
        raise SessionError(400, "text.format: constrained output is not supported", "unsupported_parameter")
    if body.get("truncation") == "auto":
        raise SessionError(400, "truncation: auto is not supported (the gateway never drops context)",
                           "unsupported_parameter")  # fmt: skip
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("auto", "none"):
        raise SessionError(400, "tool_choice: only auto and none are supported", "unsupported_parameter")
    _check_input(body.get("input"))
    return _hosted(body.get("tools"), hosted)


def _check_input(items: Any) -> None:
    if not isinstance(items, list):
        return  # a string, or what the model's own validation names
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise SessionError(400, f"input[{i}]: an input item is a JSON object", "invalid_request")
        kind = item.get("type", "message" if "role" in item else None)
        if kind not in INPUT_ITEMS:
            raise SessionError(
                400, f"input[{i}].type: {kind} is not supported (the gateway takes {', '.join(INPUT_ITEMS)} "
                "items)", "unsupported_parameter",
            )  # fmt: skip


def _hosted(tools: Any, hosted: str) -> list[str]:
    dropped = []
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if kind in SERVED_TOOLS or not isinstance(kind, str):
            continue  # a malformed tool is the model's validation's to name
        if kind == "custom":
            raise SessionError(
                400, f"tools[{i}].type: custom (free-form) tools are not supported; function and "
                "namespace tools are", "unsupported_parameter",
            )  # fmt: skip
        if hosted == "refuse":
            raise SessionError(
                400, f"tools[{i}].type: {kind} is a hosted tool the gateway cannot run "
                "(spec.agent.gateway.hostedTools: refuse; drop leaves it out)", "unsupported_parameter",
            )  # fmt: skip
        dropped.append(kind)
    return dropped


def _served(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body vLLM's model checks: without the ignored fields and the hosted tools."""
    served = {k: v for k, v in body.items() if k not in IGNORED}
    tools = body.get("tools")
    if isinstance(tools, list):
        served["tools"] = [
            t for t in tools if not isinstance(t, Mapping) or t.get("type") in (*SERVED_TOOLS, None)
        ]
    return served


def _parse(body: Mapping[str, Any]) -> protocol.ResponsesRequest:
    try:
        return protocol.ResponsesRequest.model_validate(_served(body))
    except pydantic.ValidationError as exc:
        raise sessions_mod.invalid(exc.errors()) from None
    except VLLMValidationError as exc:  # vLLM's own checks of a field (its parameter)
        raise SessionError(400, f"{exc.parameter or 'request'}: {exc}", "invalid_request") from None


def _messages(session: Session, req: protocol.ResponsesRequest) -> list[dict[str, Any]]:
    """The chat messages of ``req``: its instructions, the chain's earlier conversation, its input."""
    earlier: list[Any] | None = None
    if req.previous_response_id is not None:
        earlier = session.responses.get(req.previous_response_id)
        if earlier is None:
            raise SessionError(
                404, f"previous_response_id: no stored response {req.previous_response_id!r} in this session",
                "previous_response_not_found",
            )  # fmt: skip
    items = req.input if isinstance(req.input, str) else [
        item for item in req.input if responses_utils._item_type(item) != "reasoning"
    ]  # fmt: skip
    try:
        messages = responses_utils.construct_input_messages(
            request_instructions=req.instructions,
            request_input=items,
            prev_msg=earlier,
        )
    except VLLMValidationError as exc:
        raise SessionError(400, f"input: {exc}", "invalid_request") from None
    return [_plain(dict(m)) for m in messages]


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    """Input and output text parts as the chat path's text content."""
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") not in TEXT_PARTS:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise SessionError(400, f"input: {kind} content is not supported (text only)",
                                   "unsupported_content")  # fmt: skip
            texts.append(str(part.get("text") or ""))
        message["content"] = "".join(texts)
    return message


def _tools(req: protocol.ResponsesRequest) -> list[dict[str, Any]]:
    """The chat tools the model sees: function tools, a namespace's functions as ``<namespace>__<name>``."""
    out = []
    for tool in tool_utils.get_function_tools(req.tools):
        assert isinstance(tool, openai_responses.FunctionTool)  # _check refused custom tools
        function = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
        out.append({"type": "function", "function": {k: v for k, v in function.items() if v is not None}})
    return out


async def create(g: service_mod.Gateway, session: Session, body: dict[str, Any]) -> Response:
    dropped = _check(body, g.s.hosted_tools)
    req = _parse(body)
    messages, tools = _messages(session, req), _tools(req)
    chat: dict[str, Any] = {"model": req.model or g.s.model_name, "messages": messages,
                            "stream": bool(req.stream)}  # fmt: skip
    for name, value in (("max_tokens", req.max_output_tokens), ("temperature", req.temperature),
                        ("top_p", req.top_p), ("top_k", req.top_k), ("seed", req.seed)):  # fmt: skip
        if value is not None:
            chat[name] = value
    if tools:
        chat["tools"], chat["tool_choice"] = tools, req.tool_choice
    prep = g.prepare_chat(session, chat)
    prep.call_id = req.request_id = "resp_" + uuid.uuid4().hex
    for kind in dropped:
        g.m.gateway_hosted_tools_dropped_by(kind if kind in HOSTED_TOOLS else "other").inc()
    headers = {DROPPED_HEADER: ",".join(dict.fromkeys(dropped))} if dropped else None
    model = str(body.get("model") or g.s.model_name)
    if req.stream:
        return StreamingResponse(
            _events(g, session, prep, req, model), media_type="text/event-stream", headers=headers
        )
    generated = await g.generate(session, prep)
    response = _response(session, req, prep, model, generated)
    body_json = response.model_dump_json(exclude_none=True)
    return Response(body_json, media_type="application/json", headers=headers)


def _response(
    session: Session, req: protocol.ResponsesRequest, prep: service_mod.Prepared, model: str,
    generated: service_mod.Generated | None,
) -> protocol.ResponsesResponse:  # fmt: skip
    """The Response of ``generated`` (None: the in-progress one a stream starts with); a finished one is
    stored for ``previous_response_id`` unless ``store`` is false."""
    output: list[Any] = []
    usage: protocol.ResponseUsage | None = None
    status: Literal["in_progress", "completed", "incomplete"] = "in_progress"
    if generated is not None:
        calls = [FunctionCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                 for c in generated.tool_calls]  # fmt: skip
        output = responses_utils.build_response_output_items(None, generated.content, calls, tools=req.tools)
        n_out = len(generated.completion.token_ids)
        usage = protocol.ResponseUsage(
            input_tokens=generated.prompt_tokens, output_tokens=n_out,
            total_tokens=generated.prompt_tokens + n_out,
            input_tokens_details=protocol.InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
            output_tokens_details=protocol.OutputTokensDetails(),
        )  # fmt: skip
        status = "incomplete" if generated.finish_reason == "length" else "completed"
        if req.store is not False and prep.messages is not None:
            reply: dict[str, Any] = {"role": "assistant", "content": generated.content}
            if generated.tool_calls:
                reply["tool_calls"] = generated.tool_calls
            session.responses[generated.id] = [*prep.messages, reply]
    return protocol.ResponsesResponse.from_request(
        req, prep.params, model, int(time.time()), output, status, usage
    )


def _dump(value: Any) -> Any:
    return (
        value.model_dump(mode="json", exclude_none=True) if isinstance(value, pydantic.BaseModel) else value
    )


async def _events(
    g: service_mod.Gateway, session: Session, prep: service_mod.Prepared, req: protocol.ResponsesRequest,
    model: str,
) -> AsyncIterator[str]:  # fmt: skip
    """response.created, response.in_progress; the message item (output_item.added, content_part.added,
    output_text.delta as the text comes - whole with tools to parse, as for chat -, output_text.done,
    content_part.done, output_item.done); per function call output_item.added,
    function_call_arguments.delta/.done, output_item.done; response.completed."""
    seq = 0

    def event(kind: str, **fields: Any) -> str:
        nonlocal seq
        seq += 1
        data = {"type": kind, "sequence_number": seq - 1, **{k: _dump(v) for k, v in fields.items()}}
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

    start = _response(session, req, prep, model, None)
    yield event("response.created", response=start)
    yield event("response.in_progress", response=start)
    msg_id, text, opened = "msg_" + uuid.uuid4().hex, "", False
    part = {"type": "output_text", "text": "", "annotations": []}
    message = {"id": msg_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    async for item in g.stream(session, prep):
        pieces = [item] if isinstance(item, str) else ([] if opened else [item.content])
        for piece in (p for p in pieces if p):
            if not opened:
                yield event("response.output_item.added", output_index=0, item=message)
                yield event("response.content_part.added", item_id=msg_id, output_index=0, content_index=0,
                            part=part)  # fmt: skip
                opened = True
            text += piece
            yield event("response.output_text.delta", item_id=msg_id, output_index=0, content_index=0,
                        delta=piece, logprobs=[])  # fmt: skip
        if isinstance(item, str):
            continue
        done = _response(session, req, prep, model, item)
        for index, out in enumerate(done.output):
            if isinstance(out, openai_responses.ResponseOutputMessage):
                out.id = msg_id
                yield event("response.output_text.done", item_id=msg_id, output_index=index, content_index=0,
                            text=text, logprobs=[])  # fmt: skip
                yield event("response.content_part.done", item_id=msg_id, output_index=index, content_index=0,
                            part={**part, "text": text})  # fmt: skip
            elif isinstance(out, openai_responses.ResponseFunctionToolCall):
                yield event("response.output_item.added", output_index=index,
                            item={**_dump(out), "arguments": "", "status": "in_progress"})  # fmt: skip
                yield event("response.function_call_arguments.delta", item_id=out.id, output_index=index,
                            delta=out.arguments)  # fmt: skip
                yield event("response.function_call_arguments.done", item_id=out.id, output_index=index,
                            name=out.name, arguments=out.arguments)  # fmt: skip
            yield event("response.output_item.done", output_index=index, item=out)
        yield event(
            "response.completed" if done.status == "completed" else "response.incomplete", response=done
        )
