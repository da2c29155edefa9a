"""The gateway's HTTP API: OpenAI- and Anthropic-compatible completions for sessions, plus the admin routes.

Served by each rollout replica of a `spec.agent.loop: gateway` job (``rollout/main.py`` starts it in the
rollout's own event loop, beside vLLM's front end) on spec.agent.gateway.port; Starlette routes under
uvicorn (both already installed with vLLM, whose own server uses them).

Admin key (Bearer, from the Secret in spec.agent.gateway.adminKeySecret):
    POST /rl/groups    {"n": 4, "record": {...} | null}   n sessions of one task (a GRPO group);
                       without "record" the task is the job's next data record
    POST /rl/sessions  {"record": ...}                    one session (a group of one)
Session key (Bearer; the path's session id, or the key alone under /v1/...):
    POST /sessions/{id}/v1/chat/completions, /sessions/{id}/v1/completions, GET .../v1/models
    POST /sessions/{id}/rl/reward   {"reward": 1.0, "call_id": "chatcmpl-..." | absent (last call),
                                     "session": true (the whole session)}
    POST /sessions/{id}/rl/end      the session's trajectories go to its group; the group is published
                                    when all its sessions ended, expired or were aborted
    POST /sessions/{id}/rl/abort    nothing of the session is published (counted aborted): an agent
                                    that gave up on it (``asyncrl agent`` at its --timeout)
    POST /sessions/{id}/v1/responses                 the OpenAI Responses API (``responses_api``)
Session key (x-api-key or Bearer), Anthropic's Messages API (``messages_api``):
    POST /sessions/{id}/v1/messages[?beta=true], /sessions/{id}/v1/messages/count_tokens
GET /health (no key).

The Messages and Responses routes are faces on the chat path: converted to a chat request, served and
recorded as one, answered in their own shapes. Errors are OpenAI-shaped (``{"error": {"message", "type",
"param", "code"}}``; the ``code`` is a string as OpenAI's, so vLLM's ``ErrorResponse``, whose code is the
HTTP status as an int, is not used), Anthropic-shaped on the Messages routes. Bodies
over spec.agent.gateway.maxBodyBytes get 413, invalid JSON 400, a missing or wrong key 401, an unknown
session 404, an ended one 409, an expired one 410, no admission 429 with Retry-After; nothing is recorded
for any of them. Keys are compared in constant time and never logged (uvicorn's access log is off).

Admission across replicas: a replica admits only its share of the job's groups, and an agent may reach
only one replica (a keep-alive connection to the Service sticks to one pod). So a POST /rl/groups or
/rl/sessions this replica would answer 429 for admission is first sent on to the peer replicas
(``Gateway.peers``, from one further on each time), with the same body and Authorization header and
``X-Asyncrl-Forwarded: 1`` (a forwarded request is never forwarded again), FORWARD_TIMEOUT_S per peer; the
first peer's 200 is the answer, as it is (its sessions' base_urls name that peer), else this replica's 429.
Counted in ``asyncrl_gateway_groups_forwarded_total{outcome}``, one per peer tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import uvicorn
from asyncrl_workloads.gateway import messages_api, responses_api
from asyncrl_workloads.gateway import service as service_mod
from asyncrl_workloads.gateway.sessions import Session, SessionError
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from vllm.entrypoints.generate.base import protocol as base_protocol
from vllm.entrypoints.openai.chat_completion import protocol as chat_protocol
from vllm.entrypoints.openai.completion import protocol as completion_protocol
from vllm.entrypoints.serve.engine.protocol import ModelCard, ModelList, UsageInfo

log = logging.getLogger(__name__)
CLIENT_GONE = 499
"""Counted for a request whose client disconnected before its body arrived (nginx's code for it)."""
ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 409: "conflict_error",
    410: "gone_error", 413: "invalid_request_error", 429: "rate_limit_error",
}  # fmt: skip
FORWARDED_HEADER = "X-Asyncrl-Forwarded"
"""Set on a group request one replica sends on to a peer: the peer answers it itself, never forwards it."""
FORWARD_TIMEOUT_S = 2.0
"""The most one peer may take to answer a forwarded group request (opening a group does not wait on the
engine); past it the next peer is tried."""


class GatewayApp:
    def __init__(
        self,
        gateway: service_mod.Gateway,
        admin_key: str,
        max_body_bytes: int,
        forward_timeout_s: float = FORWARD_TIMEOUT_S,
    ) -> None:
        self.g, self.admin_key, self.max_body = gateway, admin_key, max_body_bytes
        self.forward_timeout_s = forward_timeout_s
        # Peers are pods of the same job: no proxy from the environment, no redirects.
        self.peer_client = httpx.AsyncClient(
            timeout=forward_timeout_s, trust_env=False, follow_redirects=False
        )
        self._failing: set[int] = set()
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/rl/groups", self._admin("groups", self.groups), methods=["POST"]),
            Route("/rl/sessions", self._admin("sessions", self.one_session), methods=["POST"]),
        ]
        for prefix in ("/sessions/{session_id}", ""):
            routes += [
                Route(f"{prefix}/v1/chat/completions", self._user("chat", self.chat), methods=["POST"]),
                Route(
                    f"{prefix}/v1/completions", self._user("completions", self.completions), methods=["POST"]
                ),
                Route(f"{prefix}/v1/models", self._route("models", self.models), methods=["GET"]),
                Route(f"{prefix}/rl/reward", self._user("reward", self.reward), methods=["POST"]),
                Route(f"{prefix}/rl/end", self._user("end", self.end), methods=["POST"]),
                Route(f"{prefix}/rl/abort", self._user("abort", self.abort), methods=["POST"]),
                Route(
                    f"{prefix}/v1/messages",
                    self._anthropic("messages", messages_api.create),
                    methods=["POST"],
                ),
                Route(
                    f"{prefix}/v1/responses", self._face("responses", responses_api.create), methods=["POST"]
                ),
                Route(
                    f"{prefix}/v1/messages/count_tokens",
                    self._anthropic("count_tokens", messages_api.count_tokens),
                    methods=["POST"],
                ),
            ]
        self.app = Starlette(routes=routes)

    # ---- plumbing -----------------------------------------------------------------------------
    async def _body(self, request: Request) -> dict[str, Any]:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise SessionError(
                413, f"request body over {self.max_body} bytes (spec.agent.gateway.maxBodyBytes)"
            )
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body:
                raise SessionError(
                    413, f"request body over {self.max_body} bytes (spec.agent.gateway.maxBodyBytes)"
                )
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise SessionError(400, f"invalid JSON body: {exc}", "invalid_json") from None
        if not isinstance(body, dict):
            raise SessionError(400, "the body must be a JSON object", "invalid_json")
        return body

    @staticmethod
    def _bearer(request: Request) -> str | None:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None

    def _count(self, route: str, code: int) -> None:
        self.g.m.gateway_requests_by(route, code).inc()

    def _route(
        self,
        route: str,
        handler: Callable[[Request], Awaitable[Response]],
        shape: Callable[[SessionError, Request], Response] | None = None,
    ) -> Any:
        """The endpoint for ``handler``: a SessionError becomes its answer in the API's error shape
        (``shape``; OpenAI's by default), every answer is counted under ``route``."""

        async def endpoint(request: Request) -> Response:
            try:
                response = await handler(request)
            except SessionError as exc:
                response = error(exc) if shape is None else shape(exc, request)
            except ClientDisconnect:  # the agent went away mid-request (stopped): nothing to answer
                response = Response(status_code=CLIENT_GONE)
            self._count(route, response.status_code)
            return response

        return endpoint

    def _is_admin(self, request: Request) -> bool:
        key = self._bearer(request)
        return key is not None and hmac.compare_digest(key.encode(), self.admin_key.encode())

    def _admin(self, route: str, handler: Callable[[dict[str, Any]], Awaitable[Response]]) -> Any:
        """An admin route; a group it cannot admit (429) goes to the peers unless it came from one."""

        async def call(request: Request) -> Response:
            if not self._is_admin(request):
                raise SessionError(401, "missing or invalid admin key", "invalid_api_key")
            body = await self._body(request)
            try:
                return await handler(body)
            except SessionError as exc:
                if exc.status != 429 or request.headers.get(FORWARDED_HEADER):
                    raise
                answer = await self._forward(request.url.path, body, request.headers["authorization"])
                if answer is None:
                    raise
                return answer

        return self._route(route, call)

    async def _forward(self, path: str, body: dict[str, Any], authorization: str) -> Response | None:
        """The first peer's 200 to the same request, as it is; None when every peer refused or failed."""
        content = json.dumps(body).encode()
        headers = {
            "Authorization": authorization, "Content-Type": "application/json", FORWARDED_HEADER: "1",
        }  # fmt: skip
        for ordinal, url in self.g.peers():
            try:
                answer = await asyncio.wait_for(
                    self.peer_client.post(url + path, content=content, headers=headers),
                    self.forward_timeout_s,
                )
            except (httpx.HTTPError, httpx.InvalidURL, TimeoutError) as exc:
                self._peer_failed(ordinal, url, type(exc).__name__)
                continue
            if answer.status_code == 200:
                self._failing.discard(ordinal)
                self.g.m.gateway_groups_forwarded["admitted"].inc()
                media = answer.headers.get("content-type", "application/json")
                return Response(answer.content, status_code=200, media_type=media)
            if answer.status_code == 429:
                self._failing.discard(ordinal)
                self.g.m.gateway_groups_forwarded["refused"].inc()
            else:
                self._peer_failed(ordinal, url, f"HTTP {answer.status_code}")
        return None

    def _peer_failed(self, ordinal: int, url: str, why: str) -> None:
        """Counted every time; logged when the peer starts failing (a request's headers are never logged)."""
        self.g.m.gateway_groups_forwarded["error"].inc()
        if ordinal not in self._failing:
            self._failing.add(ordinal)
            log.warning("gateway peer %d (%s) did not take a forwarded group: %s", ordinal, url, why)

    async def aclose(self) -> None:
        await self.peer_client.aclose()

    def _user(self, route: str, handler: Callable[[Session, dict[str, Any]], Awaitable[Response]]) -> Any:
        async def call(request: Request) -> Response:
            session = self.g.session(request.path_params.get("session_id"), self._bearer(request))
            return await handler(session, await self._body(request))

        return self._route(route, call)

    def _face(
        self,
        route: str,
        handler: Callable[[service_mod.Gateway, Session, dict[str, Any]], Awaitable[Response]],
    ) -> Any:
        """A route of another OpenAI API (errors in OpenAI's shape) served by a face module."""

        async def call(request: Request) -> Response:
            session = self.g.session(request.path_params.get("session_id"), self._bearer(request))
            return await handler(self.g, session, await self._body(request))

        return self._route(route, call)

    def _anthropic(
        self,
        route: str,
        handler: Callable[[service_mod.Gateway, Session, dict[str, Any]], Awaitable[Response]],
    ) -> Any:
        """A Messages API route: the key from x-api-key or Bearer, errors in Anthropic's shape."""

        async def call(request: Request) -> Response:
            session = self.g.session(request.path_params.get("session_id"), messages_api.key(request))
            return await handler(self.g, session, await self._body(request))

        def shape(exc: SessionError, request: Request) -> Response:
            return messages_api.error(exc, request, self.g.s.public_url)

        return self._route(route, call, shape)

    # ---- routes -------------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        del request
        return JSONResponse(
            {"status": "ok", "sessions": len(self.g.sessions), "version": self.g.engine.version}
        )

    async def groups(self, body: dict[str, Any]) -> Response:
        return JSONResponse(self.g.open_group(body))

    async def one_session(self, body: dict[str, Any]) -> Response:
        if "n" in body:
            raise SessionError(400, "n: use /rl/groups for several sessions", "invalid_value")
        group = self.g.open_group({**body, "n": 1})
        (session,) = group.pop("sessions")
        return JSONResponse({**session, **group})

    async def models(self, request: Request) -> Response:
        """The job's policy (any model name is served: agents keep theirs); a session's or the admin key."""
        if not self._is_admin(request):
            self.g.session(request.path_params.get("session_id"), self._bearer(request))
        card = ModelCard(id=self.g.s.model_name, owned_by="asyncrl", max_model_len=self.g.s.max_model_len)
        return Response(ModelList(data=[card]).model_dump_json(), media_type="application/json")

    async def reward(self, session: Session, body: dict[str, Any]) -> Response:
        return JSONResponse(self.g.set_reward(session, body))

    async def end(self, session: Session, body: dict[str, Any]) -> Response:
        del body
        return JSONResponse(self.g.end(session))

    async def abort(self, session: Session, body: dict[str, Any]) -> Response:
        del body
        return JSONResponse(self.g.abort(session))

    async def chat(self, session: Session, body: dict[str, Any]) -> Response:
        prep = self.g.prepare_chat(session, body)
        model = str(body.get("model") or self.g.s.model_name)
        if prep.req.stream:
            return _sse(self._chat_chunks(session, prep, model))
        generated = await self.g.generate(session, prep)
        message = chat_protocol.ChatMessage(
            role="assistant",
            content=generated.content if generated.content or not generated.tool_calls else None,
            tool_calls=_tool_calls(generated.tool_calls),
        )
        choice = chat_protocol.ChatCompletionResponseChoice(
            index=0, message=message, finish_reason=generated.finish_reason,
            logprobs=self._chat_logprobs(generated) if prep.req.logprobs else None,
            token_ids=generated.completion.token_ids if prep.req.return_token_ids else None,
        )  # fmt: skip
        response = chat_protocol.ChatCompletionResponse(
            id=generated.id, model=model, choices=[choice], usage=_usage(generated),
            prompt_token_ids=(
                prep.episode.context_ids[: generated.prompt_tokens] if prep.req.return_token_ids else None
            ),
        )  # fmt: skip
        return Response(response.model_dump_json(exclude_none=True), media_type="application/json")

    async def _chat_chunks(
        self, session: Session, prep: service_mod.Prepared, model: str
    ) -> AsyncIterator[str]:
        created = int(time.time())
        prep.call_id = chunk_id = "chatcmpl-" + uuid.uuid4().hex  # one id for the stream and the call

        def chunk(
            delta: base_protocol.DeltaMessage | None, finish: str | None = None, usage: Any = None
        ) -> str:
            choices = [] if delta is None else [
                chat_protocol.ChatCompletionResponseStreamChoice(index=0, delta=delta, finish_reason=finish)
            ]  # fmt: skip
            body = chat_protocol.ChatCompletionStreamResponse(
                id=chunk_id, created=created, model=model, choices=choices, usage=usage
            )
            return body.model_dump_json(exclude_none=True)

        yield chunk(base_protocol.DeltaMessage(role="assistant", content=""))
        async for item in self.g.stream(session, prep):
            if isinstance(item, str):
                yield chunk(base_protocol.DeltaMessage(content=item))
                continue
            if prep.parse_tools:
                deltas = [
                    base_protocol.DeltaToolCall(
                        index=i, id=call["id"], type="function",
                        function=dict(call["function"]),
                    )
                    for i, call in enumerate(item.tool_calls)
                ]  # fmt: skip
                yield chunk(base_protocol.DeltaMessage(content=item.content or None, tool_calls=deltas))
            yield chunk(base_protocol.DeltaMessage(), item.finish_reason)
            options = prep.req.stream_options
            if options is not None and options.include_usage:
                yield chunk(None, usage=_usage(item))

    async def completions(self, session: Session, body: dict[str, Any]) -> Response:
        prep = self.g.prepare_completion(session, body)
        model = str(body.get("model") or self.g.s.model_name)
        if prep.req.stream:
            return _sse(self._completion_chunks(session, prep, model))
        generated = await self.g.generate(session, prep)
        choice = completion_protocol.CompletionResponseChoice(
            index=0, text=generated.content, finish_reason=generated.finish_reason,
            token_ids=generated.completion.token_ids if prep.req.return_token_ids else None,
        )  # fmt: skip
        response = completion_protocol.CompletionResponse(
            id=generated.id, model=model, choices=[choice], usage=_usage(generated)
        )
        return Response(response.model_dump_json(exclude_none=True), media_type="application/json")

    async def _completion_chunks(
        self, session: Session, prep: service_mod.Prepared, model: str
    ) -> AsyncIterator[str]:
        created = int(time.time())
        prep.call_id = chunk_id = "cmpl-" + uuid.uuid4().hex

        def chunk(text: str | None, finish: str | None = None, usage: Any = None) -> str:
            choices = [] if text is None else [
                completion_protocol.CompletionResponseStreamChoice(index=0, text=text, finish_reason=finish)
            ]  # fmt: skip
            body = completion_protocol.CompletionStreamResponse(
                id=chunk_id, created=created, model=model, choices=choices, usage=usage
            )
            return body.model_dump_json(exclude_none=True)

        async for item in self.g.stream(session, prep):
            if isinstance(item, str):
                yield chunk(item)
                continue
            yield chunk("", item.finish_reason)
            options = prep.req.stream_options
            if options is not None and options.include_usage:
                yield chunk(None, usage=_usage(item))

    def _chat_logprobs(self, generated: service_mod.Generated) -> chat_protocol.ChatCompletionLogProbs:
        tok = self.g.tokenizer
        content = [
            chat_protocol.ChatCompletionLogProbsContent(
                token=tok.decode([t]), logprob=lp, bytes=list(tok.decode([t]).encode()), top_logprobs=[]
            )
            for t, lp in zip(generated.completion.token_ids, generated.completion.logprobs, strict=True)
        ]
        return chat_protocol.ChatCompletionLogProbs(content=content)


def error(exc: SessionError) -> Response:
    body = {"error": {"message": str(exc), "type": ERROR_TYPES.get(exc.status, "server_error"), "param": None,
                      "code": exc.code}}  # fmt: skip
    headers = {"Retry-After": str(service_mod.RETRY_AFTER_S)} if exc.status == 429 else None
    return JSONResponse(body, status_code=exc.status, headers=headers)


def _usage(generated: service_mod.Generated) -> UsageInfo:
    completion = len(generated.completion.token_ids)
    return UsageInfo(
        prompt_tokens=generated.prompt_tokens, completion_tokens=completion,
        total_tokens=generated.prompt_tokens + completion,
    )  # fmt: skip


def _tool_calls(calls: list[dict[str, Any]]) -> list[Any]:
    return [
        base_protocol.ToolCall(
            id=c["id"],
            function=base_protocol.FunctionCall(
                name=c["function"]["name"], arguments=c["function"]["arguments"]
            ),
        )
        for c in calls
    ]


def _sse(chunks: AsyncIterator[str]) -> StreamingResponse:
    async def events() -> AsyncIterator[str]:
        async for data in chunks:
            yield f"data: {data}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the rollout's own SIGTERM handling stops the gateway."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return contextlib.nullcontext()


def listen(port: int, host: str = "0.0.0.0") -> socket.socket:
    """Bind the gateway's port (OSError: taken or not allowed), before the engine starts."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def serve(
    app: GatewayApp, sock: socket.socket, stop: asyncio.Event, abort: Callable[[], Awaitable[None]]
) -> None:
    """Serve until ``stop``; then open sessions are aborted (counted) and ``abort`` (the worker's
    ``abort_generating``) drops the groups still waiting for them: a group is published whole or not at
    all."""
    # Keep-alive well above the 5 s idle expiry of httpx (the openai SDK's client): with equal timeouts a
    # client may send on a connection the server is closing that moment (seen as ReadError in the e2e).
    config = uvicorn.Config(
        app.app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5,
        timeout_keep_alive=75,
    )  # fmt: skip
    server = _Server(config)
    expiry = asyncio.create_task(app.g.expire_loop(stop))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await stop.wait()
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serving, 10)
        expiry.cancel()
        aborted = app.g.abort_open()
        if aborted:
            log.info("stopping: %d open gateway sessions aborted (not published)", aborted)
        await app.aclose()
        await abort()
