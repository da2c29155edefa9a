"""The Anthropic Messages API face of the gateway: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

Called by ``gateway/http.py`` for a session's request (found by the path's id and the ``x-api-key`` or
Bearer key, as Claude Code and the ``anthropic`` SDK send it). The body is checked with vLLM's Anthropic
protocol models and converted to a chat request by vLLM's own conversion
(``AnthropicServingMessages.to_chat_completion_request``, a classmethod: no serving instance), which then
takes the session's one chat path (``service.Gateway.prepare_chat`` -> ``generate``/``stream`` ->
``record``): continuation, masks, logprobs, versions, rewards, limits and expiry are chat's. The reply, its
tool calls as the job's toolParser read them, is answered as a Message (``tool_use`` blocks) or as
Anthropic's event stream.

Fields: honoured ``HONOURED``; accepted and ignored ``IGNORED`` (they steer the vendor's own features and
do not change what is sampled; ``cache_control`` and ``thinking`` blocks inside messages too); anything
else is refused with a 400 naming it, as are ``output_config.format`` (constrained decoding) and
``tool_choice`` other than auto/none. ``max_tokens`` over what the context leaves is capped to it (Claude
Code always asks for 32000).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pydantic
from asyncrl_workloads.gateway import service as service_mod
from asyncrl_workloads.gateway import sessions as sessions_mod
from asyncrl_workloads.gateway.sessions import Session, SessionError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from vllm.entrypoints.anthropic import protocol
from vllm.entrypoints.anthropic import serving as anthropic_serving

HONOURED = frozenset({
    "model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p", "top_k",
    "tools", "tool_choice", "seed",
})  # fmt: skip
"""``seed`` is the gateway's extension (as in vLLM's chat API): one seed samples the same tokens."""
IGNORED = frozenset({
    "metadata", "thinking", "context_management", "output_config", "cache_control", "service_tier", "speed",
    "inference_geo", "diagnostics", "user_profile_id", "workspace_id",
})  # fmt: skip
"""Accepted and ignored (docs/gateway.md, "Your agent framework"); ``output_config.format`` is refused."""
COUNT_HONOURED = frozenset({"model", "messages", "system", "tools", "tool_choice"})
ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
    409: "invalid_request_error", 410: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
}  # fmt: skip
KEY_HINT = (
    "set ANTHROPIC_API_KEY to the session's api_key and ANTHROPIC_BASE_URL to the session's URL ({url}, "
    "its base_url without /v1); a Claude subscription's OAuth login is not a gateway key"
)


def key(request: Request) -> str | None:
    """The session key: ``x-api-key`` (Anthropic's header) or a Bearer token."""
    api_key = request.headers.get("x-api-key", "").strip()
    if api_key:
        return api_key
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def error(exc: SessionError, request: Request, public_url: str) -> Response:
    """Anthropic's error shape; a 401 says which key and URL Claude Code needs."""
    message = str(exc)
    if exc.status == 401:
        session_id = request.path_params.get("session_id") or "<session_id>"
        message += ": " + KEY_HINT.format(url=f"{public_url}/sessions/{session_id}")
    body = {"type": "error", "error": {"type": ERROR_TYPES.get(exc.status, "api_error"), "message": message}}
    headers = {"Retry-After": str(service_mod.RETRY_AFTER_S)} if exc.status == 429 else None
    return JSONResponse(body, status_code=exc.status, headers=headers)


def _check(body: Mapping[str, Any], honoured: frozenset[str]) -> None:
    unknown = sorted(set(body) - honoured - IGNORED)
    if unknown:
        raise SessionError(
            400, f"{', '.join(unknown)}: not supported by the asyncrl gateway", "unsupported_parameter"
        )
    config = body.get("output_config")
    if isinstance(config, Mapping) and config.get("format") is not None:
        raise SessionError(
            400, "output_config.format: constrained output is not supported", "unsupported_parameter"
        )
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping):
        if choice.get("type") not in (None, "auto", "none"):
            raise SessionError(
                400, f"tool_choice.type: {choice.get('type')} is not supported (auto and none are)",
                "unsupported_parameter",
            )  # fmt: skip
        if choice.get("disable_parallel_tool_use"):
            raise SessionError(
                400, "tool_choice.disable_parallel_tool_use: not supported", "unsupported_parameter"
            )


def _parse(model: type[pydantic.BaseModel], body: Mapping[str, Any]) -> Any:
    try:
        return model.model_validate(dict(body))
    except pydantic.ValidationError as exc:
        raise sessions_mod.invalid(exc.errors()) from None


def _chat(req: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    """(messages, tools, tool_choice) of the chat request vLLM converts ``req`` to."""
    try:
        chat = anthropic_serving.AnthropicServingMessages.to_chat_completion_request(req)
    except ValueError as exc:  # a tool_addition / tool_removal naming no declared tool
        raise SessionError(400, f"messages: {exc}", "invalid_request") from None
    tools = [t.model_dump(exclude_none=True) for t in chat.tools or []]
    return [dict(m) for m in chat.messages], tools, chat.tool_choice


async def create(g: service_mod.Gateway, session: Session, body: dict[str, Any]) -> Response:
    _check(body, HONOURED)
    req = _parse(protocol.AnthropicMessagesRequest, body)
    messages, tools, tool_choice = _chat(req)
    chat: dict[str, Any] = {"model": req.model, "messages": messages, "max_tokens": req.max_tokens,
                            "stream": bool(req.stream)}  # fmt: skip
    for name, value in (("stop", req.stop_sequences), ("temperature", req.temperature), ("top_p", req.top_p),
                        ("top_k", req.top_k), ("seed", body.get("seed"))):  # fmt: skip
        if value is not None:
            chat[name] = value
    if tools:
        chat["tools"], chat["tool_choice"] = tools, tool_choice
    prep = g.prepare_chat(session, chat)
    prep.call_id = "msg_" + uuid.uuid4().hex
    if req.stream:
        return StreamingResponse(_events(g, session, prep, req.model), media_type="text/event-stream")
    generated = await g.generate(session, prep)
    reason, sequence = _stop(generated)
    message = protocol.AnthropicMessagesResponse(
        id=generated.id, content=_blocks(generated), model=req.model, stop_reason=reason,
        stop_sequence=sequence, usage=_usage(generated),
    )  # fmt: skip
    return Response(message.model_dump_json(exclude_none=True), media_type="application/json")


async def count_tokens(g: service_mod.Gateway, session: Session, body: dict[str, Any]) -> Response:
    """The tokens the conversation takes as the session would render it (nothing is recorded)."""
    session.check_open()
    _check(body, COUNT_HONOURED)
    messages, tools, _ = _chat(_parse(protocol.AnthropicCountTokensRequest, body))
    try:
        ids = g.chat.messages_ids(sessions_mod.normalise_messages(messages), tools)
    except ValueError as exc:  # chat.FormatError
        raise SessionError(400, f"messages: {exc}") from None
    return JSONResponse(
        protocol.AnthropicCountTokensResponse(input_tokens=len(ids)).model_dump(exclude_none=True)
    )


def _blocks(generated: service_mod.Generated) -> list[protocol.AnthropicContentBlock]:
    blocks = (
        [protocol.AnthropicContentBlock(type="text", text=generated.content)] if generated.content else []
    )
    for call in generated.tool_calls:
        blocks.append(
            protocol.AnthropicContentBlock(
                type="tool_use", id=call["id"], name=call["function"]["name"],
                input=_input(call["function"]["arguments"]),
            )
        )  # fmt: skip
    return blocks


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as a tool_use input (an object; arguments that are not one give {})."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _stop(generated: service_mod.Generated) -> tuple[Any, str | None]:
    c, called = generated.completion, bool(generated.tool_calls)
    return anthropic_serving._to_anthropic_stop_reason(
        c.finish_reason or "stop", c.stop_reason, called, called
    )


def _usage(generated: service_mod.Generated) -> protocol.AnthropicUsage:
    return protocol.AnthropicUsage(
        input_tokens=generated.prompt_tokens, output_tokens=len(generated.completion.token_ids)
    )


def _event(event: protocol.AnthropicStreamEvent | dict[str, Any]) -> str:
    if isinstance(event, dict):
        return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
    return f"event: {event.type}\ndata: {event.model_dump_json(exclude_none=True)}\n\n"


async def _events(
    g: service_mod.Gateway, session: Session, prep: service_mod.Prepared, model: str
) -> AsyncIterator[str]:
    """message_start, ping, a text block (deltas as they come; with tools to parse the text is held
    back and sent whole, as for chat), one block per tool_use (its input as one input_json_delta),
    message_delta (stop_reason, usage), message_stop."""
    usage = {"input_tokens": len(prep.episode.context_ids), "output_tokens": 0}
    start: dict[str, Any] = {
        "id": prep.call_id, "type": "message", "role": "assistant", "content": [], "model": model,
        "stop_reason": None, "stop_sequence": None, "usage": usage,
    }  # fmt: skip
    yield _event({"type": "message_start", "message": start})
    yield _event({"type": "ping"})
    index, text_open = 0, False
    async for item in g.stream(session, prep):
        if isinstance(item, str):
            if not item:
                continue
            if not text_open:
                yield _block_start(index, protocol.AnthropicContentBlock(type="text", text=""))
                text_open = True
            yield _delta(index, protocol.AnthropicDelta(type="text_delta", text=item))
            continue
        if not text_open and item.content:
            yield _block_start(index, protocol.AnthropicContentBlock(type="text", text=""))
            yield _delta(index, protocol.AnthropicDelta(type="text_delta", text=item.content))
            text_open = True
        if text_open:
            yield _event(protocol.AnthropicStreamEvent(type="content_block_stop", index=index))
            index += 1
        for block in _blocks(item)[1 if item.content else 0 :]:
            yield _block_start(index, block.model_copy(update={"input": {}}))
            partial = json.dumps(block.input)
            yield _delta(index, protocol.AnthropicDelta(type="input_json_delta", partial_json=partial))
            yield _event(protocol.AnthropicStreamEvent(type="content_block_stop", index=index))
            index += 1
        reason, sequence = _stop(item)
        yield _event({
            "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": {"output_tokens": len(item.completion.token_ids)},
        })  # fmt: skip
        yield _event({"type": "message_stop"})


def _block_start(index: int, block: protocol.AnthropicContentBlock) -> str:
    return _event(protocol.AnthropicStreamEvent(type="content_block_start", index=index, content_block=block))


def _delta(index: int, delta: protocol.AnthropicDelta) -> str:
    return _event(protocol.AnthropicStreamEvent(type="content_block_delta", index=index, delta=delta))
