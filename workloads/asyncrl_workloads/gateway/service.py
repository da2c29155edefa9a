"""The gateway's work behind the HTTP routes: open session groups, serve completions, end sessions.

Called by ``gateway/http.py`` (one ``Gateway`` per rollout replica) with request bodies already
parsed as JSON. Requests are checked with vLLM's own OpenAI protocol models
(``ChatCompletionRequest``, ``CompletionRequest``) and answered with its response models; tool calls are
read with vLLM's tool parser (``episode.parser``). Generation does not go through vLLM's serving class
(``OpenAIServingChat``): that class renders the whole conversation again on every call, so an assistant
turn the model generated would be re-tokenized and its trained tokens would differ from the sampled
ones. Here each call is generated from token ids (``sessions`` module: a continuation's tokens are the
earlier call's ids plus the template's tokens between turns) and every token keeps its logprob and policy
version, as in the rollout's own agent loop.

Admission: a group (``n`` sessions of one record) takes one slot of the rollout worker's admission
(``RolloutWorker.start_group``: ``maxInflightPrompts`` and the staleness bound); refused, the caller
answers 429 with Retry-After. The group's trajectories reach the worker, which scores and publishes them
like its own, when every session has ended or expired. Each replica admits only its own share, so a refused
request is first offered to the peer replicas (``peers``: their URLs; ``http.GatewayApp`` forwards).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pydantic
from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.episode import chat as chat_mod
from asyncrl_workloads.episode import parser as parser_mod
from asyncrl_workloads.episode import recorder
from asyncrl_workloads.gateway import sessions as sessions_mod
from asyncrl_workloads.gateway.sessions import SessionError
from asyncrl_workloads.rollout import engine as engine_mod
from asyncrl_workloads.rollout import group as group_mod
from vllm.entrypoints.openai.chat_completion import protocol as chat_protocol
from vllm.entrypoints.openai.completion import protocol as completion_protocol
from vllm.exceptions import VLLMValidationError

log = logging.getLogger(__name__)
MAX_GROUP_SIZE = 256
RETRY_AFTER_S = 1
CLOSED_KEPT = 100_000
"""Ended and expired session ids remembered (to answer 410/409 rather than 404)."""

CHAT_SUPPORTED = {
    "messages", "model", "max_tokens", "max_completion_tokens", "n", "seed", "stop", "stream",
    "stream_options", "temperature", "top_p", "top_k", "tools", "tool_choice", "parallel_tool_calls", "user",
    "logprobs", "top_logprobs", "return_token_ids",
}  # fmt: skip
COMPLETION_SUPPORTED = {
    "prompt", "model", "max_tokens", "n", "seed", "stop", "stream", "stream_options", "temperature",
    "top_p", "user", "logprobs", "return_token_ids",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class GatewaySettings:
    public_url: str
    """This replica's base URL as agents reach it (the pod's DNS name in the rollout's headless Service)."""
    model_name: str
    max_model_len: int
    max_tokens: int
    """Default max_tokens of a call (rollout.sampling.maxTokens)."""
    temperature: float = 1.0
    top_p: float = 1.0
    group_size: int = 1
    """Sessions per group when the agent does not say (rollout.sampling.n)."""
    session_timeout_s: float = 600.0
    export: str = "concat"
    turn_discount: float = 1.0
    max_calls: int = 4
    """Completions per session (agent.maxAssistantTurns)."""
    max_episode_tokens: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    hosted_tools: str = "drop"
    """Responses API tools the gateway cannot run (web_search, ...): drop (left out of what the model
    sees, counted, named in a header) or refuse (400) - spec.agent.gateway.hostedTools."""
    replica: int = 0
    """This replica's ordinal (ASYNCRL_REPLICA): left out of its own peers."""
    peer_url: str = ""
    """Where the peer replicas' gateways are (ASYNCRL_GATEWAY_PEER_URL), in one of two forms:
    a template whose ``{replica}`` is a peer's ordinal (on a cluster:
    ``http://<job>-rollout-{replica}.<job>-rollout.<namespace>.svc:<port>``), for any number of replicas;
    or a comma-separated list of URLs indexed by ordinal (the local runner's, whose ports are not one
    pattern). Empty: no peers, a refused group is answered 429 at once."""


@dataclasses.dataclass
class Generated:
    """One served call: what the HTTP layer turns into an OpenAI response."""

    id: str
    completion: engine_mod.Completion
    prompt_tokens: int
    content: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str


class Gateway:
    def __init__(
        self,
        settings: GatewaySettings,
        engine: engine_mod.RolloutEngine,
        chat: chat_mod.ChatFormat,
        parser: parser_mod.ToolCallParser,
        worker: Any,
        metrics: metrics_mod.Bound,
    ) -> None:
        self.s, self.engine, self.chat, self.parser, self.worker, self.m = (
            settings, engine, chat, parser, worker, metrics,
        )  # fmt: skip
        self.sessions: dict[str, sessions_mod.Session] = {}
        self.by_key: dict[str, sessions_mod.Session] = {}
        self.closed: dict[str, str] = {}
        self.tokenizer = parser.tokenizer
        self._peer_turn = 0

    def peers(self) -> list[tuple[int, str]]:
        """(ordinal, base URL) of the peer replicas to offer a refused group, this replica left out, starting
        one further on each call so forwarded groups spread. The count is the worker's admission's
        (``members``: the replicas of the latest weight-sync plan), so a scaled job needs no new env."""
        count = max(1, int(self.worker.admission.members))
        ordinals = [i for i in range(count) if i != self.s.replica]
        urls = dict(peer_urls(self.s.peer_url, ordinals))
        ordinals = [i for i in ordinals if i in urls and urls[i].rstrip("/") != self.s.public_url]
        if not ordinals:
            return []
        start = self._peer_turn % len(ordinals)
        self._peer_turn += 1
        return [(i, urls[i]) for i in ordinals[start:] + ordinals[:start]]

    # ---- admin: groups and sessions -----------------------------------------------------------
    def open_group(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``{"n": int, "record": {...} | null}`` -> the group and its sessions. ``record`` absent: the
        next record of the job's data; null: none (the agent sets every reward)."""
        n = body.get("n", self.s.group_size)
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_GROUP_SIZE:
            raise SessionError(400, f"n: an integer from 1 to {MAX_GROUP_SIZE}", "invalid_value")
        record = body.get("record")
        if record is not None and not isinstance(record, Mapping):
            raise SessionError(400, "record: a JSON object or null", "invalid_value")
        from_data = "record" not in body
        messages = None
        group = sessions_mod.Group(id="", record=record, size=n)
        loop = asyncio.get_running_loop()
        group.done = loop.create_future()
        done = group.done

        async def produce() -> list[group_mod.Sample]:
            return await done

        started = self.worker.start_group(produce, record, from_data=from_data)
        if started is None:
            raise SessionError(
                429,
                "the staleness bound or maxInflightPrompts admits no new group now; retry",
                "rate_limited",
            )
        index, record = started
        group.record = record
        group.id = self.worker.group_id(index)  # the id its trajectories carry on the bus
        if record is not None:
            try:
                messages = self.chat.messages(record)
            except (KeyError, TypeError, ValueError):
                messages = None
        now = sessions_mod.now()
        for _ in range(n):
            session = sessions_mod.Session(
                sessions_mod.new_session_id(), sessions_mod.new_session_key(), group, now, now
            )
            group.sessions.append(session)
            self.sessions[session.id] = session
            self.by_key[session.key] = session
            self.m.gateway_sessions["started"].inc()
        self.m.gateway_sessions_active.inc(n)
        return {
            "group_id": group.id,
            "group_size": n,
            "record": record,
            "messages": messages,
            "sessions": [
                {"session_id": s.id, "api_key": s.key, "base_url": f"{self.s.public_url}/sessions/{s.id}/v1"}
                for s in group.sessions
            ],
        }

    def session(self, session_id: str | None, key: str | None) -> sessions_mod.Session:
        """The session a request names (path id and bearer key must agree; a bare ``/v1`` call is found
        by its key). 401 for a missing or wrong key, 404 for an unknown id, 410/409 once closed."""
        if not key:
            raise SessionError(
                401, "missing API key: send the session's key as a Bearer token", "invalid_api_key"
            )
        by_key = self.by_key.get(key)
        if session_id is None:
            if by_key is None:
                raise SessionError(401, "invalid API key", "invalid_api_key")
            return by_key
        session = self.sessions.get(session_id)
        if session is None:
            state = self.closed.get(session_id)
            if state == "expired":
                raise SessionError(410, f"session {session_id} expired", "session_expired")
            if state is not None:
                raise SessionError(409, f"session {session_id} is {state}", "session_closed")
            raise SessionError(404, f"unknown session {session_id}", "session_not_found")
        if by_key is not session:
            raise SessionError(401, "invalid API key for this session", "invalid_api_key")
        return session

    # ---- completions --------------------------------------------------------------------------
    def prepare_chat(self, session: sessions_mod.Session, body: Mapping[str, Any]) -> Prepared:
        session.check_open()
        req = _validate(chat_protocol.ChatCompletionRequest, body, CHAT_SUPPORTED)
        _common_checks(req)
        if req.top_logprobs:
            raise SessionError(
                400,
                "top_logprobs > 0 is not supported (logprobs of the sampled tokens are)",
                "unsupported_parameter",
            )
        if req.tool_choice not in (None, "auto", "none"):
            raise SessionError(400, "tool_choice: only auto and none are supported", "unsupported_parameter")
        if req.parallel_tool_calls is False:
            raise SessionError(400, "parallel_tool_calls false is not supported", "unsupported_parameter")
        messages = sessions_mod.normalise_messages(body["messages"])
        if not messages:
            raise SessionError(400, "messages: at least one message")
        tools = [dict(t) for t in body.get("tools") or []]
        key = sessions_mod.tools_key(tools)
        parent = session.parent_for_chat(messages, key)
        try:
            if parent is None:
                ep = recorder.Episode(prompt_ids=self.chat.messages_ids(messages, tools), messages=[])
            else:
                ep = _copy(parent.episode)
                end_text = self.tokenizer.decode(ep.response_ids[-1:], skip_special_tokens=False)
                k = parent.n_messages
                ep.add_context(
                    self.chat.encode(self.chat.between(messages[:k], tools, end_text, messages[k + 1 :]))
                )
        except chat_mod.FormatError as exc:
            raise SessionError(400, f"messages: {exc}") from None
        ep.messages = messages
        prepared = self._limits(session, req, ep, parent)
        prepared.messages, prepared.tools, prepared.tools_key = messages, tools, key
        prepared.parse_tools = bool(tools) and req.tool_choice != "none"
        return prepared

    def prepare_completion(self, session: sessions_mod.Session, body: Mapping[str, Any]) -> Prepared:
        session.check_open()
        req = _validate(completion_protocol.CompletionRequest, body, COMPLETION_SUPPORTED)
        _common_checks(req)
        if req.logprobs:
            raise SessionError(
                400, "logprobs (top-k) is not supported on /v1/completions", "unsupported_parameter"
            )
        prompt = req.prompt
        if isinstance(prompt, str):
            ids = list(self.tokenizer(prompt)["input_ids"])
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
        else:
            raise SessionError(400, "prompt: one string or one list of token ids", "invalid_value")
        parent = session.parent_for_ids(ids)
        if parent is None:
            ep = recorder.Episode(prompt_ids=ids, messages=[])
        else:
            ep = _copy(parent.episode)
            ep.add_context(ids[len(parent.full_ids) :])
        return self._limits(session, req, ep, parent)

    def _limits(
        self, session: sessions_mod.Session, req: Any, ep: recorder.Episode, parent: sessions_mod.Call | None
    ) -> Prepared:
        session.last_active = sessions_mod.now()  # a long generation does not count as idle time
        if len(session.calls) >= self.s.max_calls:
            raise SessionError(
                400,
                f"the session reached spec.agent.maxAssistantTurns ({self.s.max_calls} calls)",
                "session_limit",
            )
        room = self.s.max_model_len - len(ep.context_ids)
        if room <= 0:
            raise SessionError(
                400,
                f"the conversation is {len(ep.context_ids)} tokens; "
                f"the model's context is {self.s.max_model_len}",
                "context_length_exceeded",
            )
        requested = getattr(req, "max_completion_tokens", None) or req.max_tokens
        max_tokens = min(requested or self.s.max_tokens, room)
        if self.s.max_episode_tokens is not None:
            left = self.s.max_episode_tokens - len(ep.response_ids)
            if left <= 0:
                raise SessionError(
                    400,
                    f"the trajectory reached spec.agent.maxEpisodeTokens ({self.s.max_episode_tokens})",
                    "session_limit",
                )
            max_tokens = min(max_tokens, left)
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        temperature = self.s.temperature if req.temperature is None else req.temperature
        top_p = self.s.top_p if req.top_p is None else req.top_p
        try:
            params = self.engine.sampling(
                1, max_tokens, temperature, top_p, seed=req.seed, stop_token_ids=self.s.stop_token_ids,
                stop=stop, stream=bool(req.stream), top_k=getattr(req, "top_k", None),
            )  # fmt: skip
        except (ValueError, VLLMValidationError) as exc:  # vLLM's own checks of the sampling parameters
            raise SessionError(400, str(exc), "invalid_value") from None
        return Prepared(
            req=req, episode=ep, parent=parent, params=params, generated_from=len(ep.response_ids)
        )

    async def generate(self, session: sessions_mod.Session, prep: Prepared) -> Generated:
        started = time.monotonic()
        (c,) = await self.engine.generate(prep.episode.context_ids, prep.params)
        generated = self.record(session, prep, c)
        self.m.gateway_request_seconds.observe(time.monotonic() - started)
        return generated

    async def stream(self, session: sessions_mod.Session, prep: Prepared) -> AsyncIterator[str | Generated]:
        """Text pieces as they come, then the recorded call. With tools to parse, the text is held back
        and sent whole (the tool parser needs the whole turn to tell content from a call)."""
        started = time.monotonic()
        first = True
        async for item in self.engine.stream(prep.episode.context_ids, prep.params):
            if isinstance(item, str):
                if first:
                    self.m.gateway_ttft.observe(time.monotonic() - started)
                    first = False
                if not prep.parse_tools:
                    yield item
                continue
            generated = self.record(session, prep, item)
            self.m.gateway_request_seconds.observe(time.monotonic() - started)
            yield generated

    def record(self, session: sessions_mod.Session, prep: Prepared, c: engine_mod.Completion) -> Generated:
        """Add the generated turn to the session (a call that generated nothing is not recorded)."""
        ep = prep.episode
        session.last_active = sessions_mod.now()
        self.m.gateway_tokens["prompt"].inc(len(ep.context_ids))
        self.m.gateway_tokens["completion"].inc(len(c.token_ids))
        call_id = prep.call_id or ("chatcmpl-" if prep.messages is not None else "cmpl-") + uuid.uuid4().hex
        content, calls, finish = c.text, [], c.finish_reason or "stop"
        if prep.messages is not None and prep.parse_tools and c.token_ids:
            try:
                parsed = self.parser.parse(
                    self.parser.decode(c.token_ids), prep.tools, turn=len(session.calls)
                )
            except parser_mod.ParseError:
                parsed = None
            if parsed is not None:
                content = parsed.content
                calls = [call.openai() for call in parsed.calls]
                if calls and finish == "stop":
                    finish = "tool_calls"
        if c.token_ids and session.state == "open":
            ep.add_generated(c.token_ids, c.logprobs, c.versions)
            assistant_msg: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                assistant_msg["tool_calls"] = calls
            if prep.messages is not None:
                ep.messages = [*prep.messages, assistant_msg]
            ep.final_text = content
            chat = prep.messages is not None
            call = sessions_mod.Call(
                call_id, prep.parent, ep, prep.generated_from, chat=chat, tools_key=prep.tools_key,
                assistant=sessions_mod.normalise_assistant(assistant_msg) if chat else None,
            )  # fmt: skip
            session.add(call)
        return Generated(call_id, c, len(ep.context_ids) - len(c.token_ids), content, calls, finish)

    # ---- rewards and ends ---------------------------------------------------------------------
    def set_reward(self, session: sessions_mod.Session, body: Mapping[str, Any]) -> dict[str, Any]:
        session.check_open()
        reward = body.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward:
            raise SessionError(400, "reward: a number", "invalid_value")
        call_id = body.get("call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise SessionError(400, "call_id: a completion id", "invalid_value")
        target = session.set_reward(float(reward), call_id, bool(body.get("session", False)))
        session.last_active = sessions_mod.now()
        return {"session_id": session.id, "rewarded": target, "reward": float(reward)}

    def end(self, session: sessions_mod.Session) -> dict[str, Any]:
        session.check_open()
        trajectories = session.export(self.s.export, self.s.turn_discount)
        self._close(session, "ended")
        session.group.trajectories.extend(trajectories)
        self._settle(session.group)
        return {
            "session_id": session.id,
            "trajectories": len(trajectories),
            "group_id": session.group.id,
            "group_complete": session.group.finished(),
        }

    def abort(self, session: sessions_mod.Session) -> dict[str, Any]:
        """The agent gave up on the session (``asyncrl agent`` killed its process at --timeout): nothing of
        it is published, it is counted ``aborted``, and its group goes out without it, as for an expired
        session."""
        session.check_open()
        self._close(session, "aborted")
        self._settle(session.group)
        return {
            "session_id": session.id,
            "group_id": session.group.id,
            "group_complete": session.group.finished(),
        }

    def expire(self, now: float) -> int:
        """Expire open sessions idle longer than the timeout; returns how many."""
        stale = [
            s for s in self.sessions.values()
            if s.state == "open" and now - s.last_active > self.s.session_timeout_s
        ]  # fmt: skip
        for session in stale:
            log.info(
                "session %s expired after %.0f s without a request (not published)",
                session.id,
                self.s.session_timeout_s,
            )
            self._close(session, "expired")
            self._settle(session.group)
        return len(stale)

    async def expire_loop(self, stop: asyncio.Event) -> None:
        period = min(5.0, max(0.05, self.s.session_timeout_s / 4))
        while not stop.is_set():
            self.expire(sessions_mod.now())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)

    def abort_open(self) -> int:
        """The replica stops: open sessions are never published (counted ``aborted``)."""
        open_ = [s for s in self.sessions.values() if s.state == "open"]
        for session in open_:
            self._close(session, "aborted")
        return len(open_)

    def _close(self, session: sessions_mod.Session, state: str) -> None:
        session.state = state
        self.sessions.pop(session.id, None)
        self.by_key.pop(session.key, None)
        self.closed[session.id] = state
        if len(self.closed) > CLOSED_KEPT:
            self.closed.pop(next(iter(self.closed)))
        self.m.gateway_sessions[state].inc()
        self.m.gateway_sessions_active.dec()

    @staticmethod
    def _settle(group: sessions_mod.Group) -> None:
        if group.finished() and group.done is not None and not group.done.done():
            group.done.set_result(group.trajectories)


@dataclasses.dataclass
class Prepared:
    req: Any
    episode: recorder.Episode
    parent: sessions_mod.Call | None
    params: Any
    generated_from: int
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    tools_key: str = ""
    parse_tools: bool = False
    call_id: str = ""
    """The id the call will be recorded under; set by a face that must name it before it is generated
    (a stream's first event), otherwise made when it is recorded."""


def peer_urls(peer_url: str, ordinals: list[int]) -> list[tuple[int, str]]:
    """(ordinal, URL) of each of ``ordinals`` that ``peer_url`` names (``GatewaySettings.peer_url``'s two
    forms; a list names only as many replicas as it has URLs)."""
    peer_url = peer_url.strip()
    if not peer_url:
        return []
    if "{replica}" in peer_url:
        return [(i, peer_url.replace("{replica}", str(i)).rstrip("/")) for i in ordinals]
    urls = [u.strip().rstrip("/") for u in peer_url.split(",")]
    return [(i, urls[i]) for i in ordinals if i < len(urls) and urls[i]]


def _validate(model: type[pydantic.BaseModel], body: Mapping[str, Any], supported: set[str]) -> Any:
    try:
        req = model.model_validate(dict(body))
    except pydantic.ValidationError as exc:
        raise sessions_mod.invalid(exc.errors()) from None
    for name in sorted(req.model_fields_set - supported):
        if getattr(req, name) != type(req).model_fields[name].default:
            raise SessionError(400, f"{name}: not supported by the asyncrl gateway", "unsupported_parameter")
    return req


def _common_checks(req: Any) -> None:
    if req.n != 1:
        raise SessionError(
            400,
            "n: only 1 is supported (open a group of sessions for several samples)",
            "unsupported_parameter",
        )


def _copy(ep: recorder.Episode) -> recorder.Episode:
    copied = copy.copy(ep)
    for name in ("prompt_ids", "messages", "response_ids", "logprobs", "versions", "mask", "tool_calls"):
        setattr(copied, name, list(getattr(ep, name)))
    return copied
