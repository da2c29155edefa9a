"""Gateway sessions: the calls an agent makes, turned into trajectories with the episode recorder.

Used by ``gateway/server.py`` (one ``Sessions`` per rollout replica). No HTTP and no engine here, so
the rules are unit-tested on their own:

- **Extension.** A chat call whose messages start with an earlier call's messages followed by the
  assistant message that call returned (content and tool calls compared as values, not as text) and
  whose tools are the same *continues* that call: its tokens are the earlier call's prompt and
  generated tokens, then the tokens between the turns from the chat template (``episode.chat.between``,
  mask 0), then this call's generated tokens (mask 1). Generated tokens are never re-tokenized. Any
  other call starts a new root (its whole rendered conversation is its prompt). A completions call
  continues an earlier one when its prompt token ids start with that call's prompt + generated ids.
- **Export** (``spec.agent.gateway.export``) when the session ends: ``concat``, one trajectory per leaf
  (a call no later call continued), or ``individual``, one per call (its context as the prompt, its
  generated tokens as the response).
- **Rewards** (``/rl/reward``): on the last call, a named call, or the session. concat: a leaf's reward
  is the sum of the rewards set on the calls of its chain plus the session's. individual: a call's is
  its own plus ``turnDiscount`` times the mean of its continuations' (the session's reward counts as
  each leaf's own), AReaL's backward discount. No reward anywhere on a trajectory leaves it ``None``:
  the rollout then scores it with the job's reward function on the session's record, or drops it
  (counted), never a made-up number.
- **Groups.** Sessions are opened in groups of ``n`` (one record, GRPO); a group is handed to the
  rollout worker when every member has ended or expired. An expired session publishes nothing.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

from asyncrl_workloads.episode import recorder
from asyncrl_workloads.rollout import group as group_mod

SESSION_STATES = ("open", "ended", "expired", "aborted")
FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*|\[\d+\])+")
"""A dotted field path ("thinking.budget_tokens", "tools[0].type"): how a whole-request check's message
names the field it is about."""


@dataclasses.dataclass
class Call:
    """One completion of a session.

    Memory: a call's chain (its prompt and every token up to its reply) is a prefix of any call that
    continues it, so once continued a call keeps no arrays of its own: ``holder`` (the continuation)
    has them, and ``episode`` cuts this call's chain out of the holder's on demand. A session of k calls
    on one conversation holds one conversation's tokens, not k copies."""

    id: str
    parent: Call | None
    own: recorder.Episode | None
    """The chain up to and including this call's generated tokens (arrays over the chain's response;
    ``messages``: the request's messages and the reply); None once ``holder`` holds it."""
    generated_from: int
    """Index in the chain's response where this call's generated tokens start."""
    chat: bool = False
    tools_key: str = ""
    assistant: dict[str, Any] | None = None
    """Chat calls: the assistant message returned (normalised for comparison)."""
    reward: float | None = None
    children: int = 0
    holder: Call | None = None
    length: int = dataclasses.field(init=False, default=0)
    """The chain's response length at this call's end."""
    n_messages: int = dataclasses.field(init=False, default=0)
    """Chat calls: how many messages the request had."""
    final_text: str = dataclasses.field(init=False, default="")

    def __post_init__(self) -> None:
        assert self.own is not None
        self.length = len(self.own.response_ids)
        self.n_messages = max(0, len(self.own.messages) - 1) if self.chat else 0
        self.final_text = self.own.final_text

    @property
    def episode(self) -> recorder.Episode:
        """This call's chain, its own or cut out of its holder's."""
        if self.own is not None:
            return self.own
        holder = self.holder
        while holder is not None and holder.own is None:
            holder = holder.holder
        assert holder is not None and holder.own is not None
        full, n = holder.own, self.length
        return recorder.Episode(
            prompt_ids=full.prompt_ids, messages=full.messages[: self.n_messages + 1],
            response_ids=full.response_ids[:n], logprobs=full.logprobs[:n], versions=full.versions[:n],
            mask=full.mask[:n], final_text=self.final_text,
        )  # fmt: skip

    @property
    def messages(self) -> list[dict[str, Any]] | None:
        """Chat calls: the request's messages (normalised); None for completions calls."""
        return self.episode.messages[: self.n_messages] if self.chat else None

    @property
    def full_ids(self) -> list[int]:
        return self.episode.context_ids


class SessionError(Exception):
    """A request the session cannot serve: ``status`` (HTTP) and an OpenAI-style ``code``."""

    def __init__(self, status: int, message: str, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.code = status, code


def invalid(errors: Sequence[Mapping[str, Any]]) -> SessionError:
    """The 400 for a body a protocol model refused (``pydantic.ValidationError.errors()``), starting
    with the field: the first error's location, or, for a check of the whole request (no location), the
    field its message names first ("thinking.budget_tokens must be less than max_tokens")."""
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    if not where:
        field, _, rest = message.partition(" ")
        if rest and FIELD.fullmatch(field):
            where, message = field, rest
    return SessionError(400, f"{where}: {message}" if where else message, "invalid_request")


@dataclasses.dataclass
class Session:
    id: str
    key: str
    group: Group
    created: float
    last_active: float
    state: str = "open"
    calls: list[Call] = dataclasses.field(default_factory=list)
    session_reward: float | None = None
    responses: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    """Responses API: a stored response's conversation (its request's messages and its reply), what a
    later call's ``previous_response_id`` continues."""

    def check_open(self) -> None:
        if self.state == "expired":
            raise SessionError(
                410, f"session {self.id} expired (no request for sessionTimeoutSeconds)", "session_expired"
            )
        if self.state != "open":
            raise SessionError(409, f"session {self.id} is {self.state}", "session_closed")

    # ---- continuation ------------------------------------------------------------------------
    def parent_for_chat(self, messages: Sequence[Mapping[str, Any]], tools_key: str) -> Call | None:
        """The deepest earlier call this chat request continues (latest on ties), or None."""
        best: Call | None = None
        for call in self.calls:
            if not call.chat or call.assistant is None or call.tools_key != tools_key:
                continue
            k = call.n_messages
            if len(messages) <= k or normalise_assistant(messages[k]) != call.assistant:
                continue
            if messages[:k] != call.messages:
                continue
            if best is None or k >= best.n_messages:
                best = call
        return best

    def parent_for_ids(self, prompt_ids: Sequence[int]) -> Call | None:
        """The longest earlier completions call whose prompt + generated ids start ``prompt_ids``."""
        best: Call | None = None
        for call in self.calls:
            if call.chat:
                continue
            full = call.full_ids
            extends = len(full) <= len(prompt_ids) and list(prompt_ids[: len(full)]) == full
            if extends and (best is None or len(full) >= len(best.full_ids)):
                best = call
        return best

    def add(self, call: Call) -> None:
        parent = call.parent
        if parent is not None:
            parent.children += 1
            if parent.own is not None:  # its chain is a prefix of the continuation's: keep one copy
                parent.own, parent.holder = None, call
        self.calls.append(call)

    # ---- rewards -----------------------------------------------------------------------------
    def set_reward(self, reward: float, call_id: str | None, whole_session: bool) -> str:
        """Returns what got the reward: "session" or a call id."""
        if whole_session:
            self.session_reward = reward
            return "session"
        if not self.calls:
            raise SessionError(400, "the session has no call to reward yet (set session: true to reward it)")
        if call_id is None:
            self.calls[-1].reward = reward
            return self.calls[-1].id
        for call in self.calls:
            if call.id == call_id:
                call.reward = reward
                return call.id
        raise SessionError(404, f"no call {call_id!r} in session {self.id}", "call_not_found")

    # ---- export ------------------------------------------------------------------------------
    def export(self, mode: str, discount: float) -> list[group_mod.Sample]:
        if mode == "concat":
            return [self._leaf(call) for call in self.calls if call.children == 0]
        values = self._values(discount)
        out = []
        for call in self.calls:
            ep, start = call.episode, call.generated_from
            out.append(
                group_mod.Sample(
                    ep.context_ids[: len(ep.prompt_ids) + start],
                    ep.response_ids[start:],
                    ep.logprobs[start:],
                    ep.versions[start:],
                    ep.mask[start:],
                    ep.final_text,
                    ep,
                    values[call.id],
                )
            )
        return out

    def _leaf(self, leaf: Call) -> group_mod.Sample:
        rewards = [self.session_reward]
        node: Call | None = leaf
        while node is not None:
            rewards.append(node.reward)
            node = node.parent
        given = [r for r in rewards if r is not None]
        ep = leaf.episode
        return group_mod.Sample(
            list(ep.prompt_ids), list(ep.response_ids), list(ep.logprobs), list(ep.versions), list(ep.mask),
            ep.final_text, ep, sum(given) if given else None,
        )  # fmt: skip

    def _values(self, discount: float) -> dict[str, float | None]:
        """individual export: value(c) = own(c) [+ session if c is a leaf] + discount * mean(value of
        c's continuations that have one); None when nothing in c's subtree was rewarded."""
        children: dict[str, list[Call]] = {c.id: [] for c in self.calls}
        for c in self.calls:
            if c.parent is not None:
                children[c.parent.id].append(c)
        values: dict[str, float | None] = {}
        for c in reversed(self.calls):  # a continuation always comes after the call it continues
            own = [
                r for r in (c.reward, self.session_reward if not children[c.id] else None) if r is not None
            ]
            below = [v for v in (values[k.id] for k in children[c.id]) if v is not None]
            if not own and not below:
                values[c.id] = None
                continue
            values[c.id] = sum(own) + (discount * sum(below) / len(below) if below else 0.0)
        return values


@dataclasses.dataclass
class Group:
    """Sessions opened together on one record; handed to the worker when all have finished."""

    id: str
    record: Mapping[str, Any] | None
    size: int
    sessions: list[Session] = dataclasses.field(default_factory=list)
    done: asyncio.Future[list[group_mod.Sample]] | None = None
    trajectories: list[group_mod.Sample] = dataclasses.field(default_factory=list)

    def finished(self) -> bool:
        return len(self.sessions) == self.size and all(s.state != "open" for s in self.sessions)


def new_session_key() -> str:
    return "sk-sess-" + secrets.token_urlsafe(24)


def new_session_id() -> str:
    return "sess-" + secrets.token_hex(8)


def normalise_content(content: Any) -> str:
    """An OpenAI message content (a string, None, or a list of text parts) as one string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, Mapping)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise SessionError(400, "only text content parts are supported", "unsupported_content")
            texts.append(part["text"])
        return "".join(texts)
    raise SessionError(400, "message content must be a string or a list of text parts")


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            return raw
    return raw


def normalise_assistant(message: Mapping[str, Any]) -> dict[str, Any] | None:
    """An assistant message as compared for continuation: role, content text, and tool calls as
    (name, decoded arguments) - ids and formatting of the arguments' JSON do not matter."""
    if message.get("role") != "assistant":
        return None
    calls = [
        (c.get("function", {}).get("name"), _arguments(c.get("function", {}).get("arguments")))
        for c in message.get("tool_calls") or []
    ]
    return {"content": normalise_content(message.get("content")), "tool_calls": calls}


def normalise_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Request messages as the chat template gets them: content as one string, only the fields a
    template reads (role, content, name, tool_calls, tool_call_id)."""
    out = []
    for m in messages:
        msg: dict[str, Any] = {"role": m.get("role"), "content": normalise_content(m.get("content"))}
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None:
                msg[key] = m[key]
        if m.get("tool_calls"):
            msg["tool_calls"] = copy.deepcopy(list(m["tool_calls"]))
        out.append(msg)
    return out


def tools_key(tools: Sequence[Mapping[str, Any]]) -> str:
    return json.dumps(list(tools), sort_keys=True)


def now() -> float:
    return time.monotonic()
