"""The agent loop (``spec.agent.loop: tool``, verl's ``tool_agent``): one multi-turn episode per sample.

Called by the rollout worker for each sample of a group (the ``n`` episodes of a group run side by
side). One episode:

    prompt (chat template with the sample's tool schemas)
    repeat:  generate one assistant turn on the rollout's engine (mask 1, the engine's logprobs and versions)
             parse tool calls (vLLM's tool parser)         -> none: the episode ends "stop"
             run them, at most maxParallelCalls at once, each under toolTimeoutSeconds
             append the end of the turn + tool messages + the next turn's header (mask 0)
    until a limit ends it: maxAssistantTurns / maxUserTurns ("max_turns"), the context or a cut turn
    ("length"), maxEpisodeTokens ("budget"), maxConsecutiveInvalidCalls ("invalid_calls").

Termination: every pass through the loop generates one assistant turn and the loop leaves once
``max_assistant_turns`` were generated, so an episode ends after at most that many engine requests,
whatever the model and the tools do; every tool call has a deadline. Each turn is its own engine request
(generated from the token ids so far), so a weight update between or during turns is handled exactly
as for single-turn generation: ``partialRollout`` decides whether a request in flight freezes and goes on
under the new weights, every token carries the version that produced it, and a request submitted after
the update is salted with the new version (no KV of the old policy is reused, ``kvCacheOnUpdate``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.episode import chat as chat_mod
from asyncrl_workloads.episode import parser as parser_mod
from asyncrl_workloads.episode import recorder
from asyncrl_workloads.episode import tools as tools_mod

log = logging.getLogger(__name__)


class Engine(Protocol):
    """What the loop needs of ``rollout.engine.RolloutEngine``."""

    def sampling(
        self, n: int, max_tokens: int, temperature: float, top_p: float, seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
    ) -> Any: ...  # fmt: skip

    async def generate(self, prompt_ids: Sequence[int], params: Any) -> list[Any]: ...


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    max_tokens: int
    """Per assistant turn (rollout.sampling.maxTokens)."""
    max_model_len: int
    temperature: float = 1.0
    top_p: float = 1.0
    max_user_turns: int = 4
    max_assistant_turns: int = 4
    max_parallel_calls: int = 1
    tool_timeout_s: float = 30.0
    max_tool_response_chars: int = 256
    max_consecutive_invalid: int = 3
    max_episode_tokens: int | None = None
    stop_token_ids: tuple[int, ...] = ()


def settings_from_spec(
    agent: Any, sampling: Any, max_model_len: int, stop_token_ids: Sequence[int]
) -> LoopSettings:
    """LoopSettings from spec.agent and spec.rollout.sampling."""
    return LoopSettings(
        max_tokens=sampling.max_tokens,
        max_model_len=max_model_len,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_user_turns=agent.max_user_turns,
        max_assistant_turns=agent.max_assistant_turns,
        max_parallel_calls=agent.max_parallel_calls,
        tool_timeout_s=agent.tool_timeout_seconds,
        max_tool_response_chars=agent.max_tool_response_chars,
        max_consecutive_invalid=agent.max_consecutive_invalid_calls,
        max_episode_tokens=agent.max_episode_tokens,
        stop_token_ids=tuple(stop_token_ids),
    )


class ToolLoop:
    def __init__(
        self,
        settings: LoopSettings,
        engine: Engine,
        chat: chat_mod.ChatFormat,
        parser: parser_mod.ToolCallParser,
        tools: Mapping[str, tools_mod.Tool],
        metrics: metrics_mod.Bound | None = None,
    ) -> None:
        self.s, self.engine, self.chat, self.parser = settings, engine, chat, parser
        self.tools, self.m = tools, metrics
        self._logged: set[str] = set()

    def tools_for(self, record: Mapping[str, Any]) -> dict[str, tools_mod.Tool]:
        """The record's ``tools`` subset (names, checked at start by ``tools.check_record_tools``), or
        every tool."""
        names = record.get("tools")
        if names is None:
            return dict(self.tools)
        return {name: self.tools[name] for name in names}

    async def run(self, record: Mapping[str, Any], seed: int | None) -> recorder.Episode:
        """One episode of ``record``; ``seed`` (None: unseeded) seeds each turn's request.

        The engine's failures propagate (the replica restarts); a failure of the chat template or the
        tool parser on this episode's text ends the episode ``error`` (counted, logged once per kind)
        and the replica goes on: one odd record or turn must not crash-loop the pod."""
        ep = recorder.Episode(prompt_ids=[], messages=[])
        try:
            await self._run(record, seed, ep)
        except (chat_mod.FormatError, parser_mod.ParseError) as exc:
            ep.ended = "error"
            if type(exc).__name__ not in self._logged:
                self._logged.add(type(exc).__name__)
                log.warning("agent episode ended on an error (further ones are counted only): %s", exc)
        ep.trim_context_tail()
        self._count(ep)
        return ep

    async def _run(self, record: Mapping[str, Any], seed: int | None, ep: recorder.Episode) -> None:
        s = self.s
        tools = self.tools_for(record)
        schemas = [t.schema for t in tools.values()]
        ep.messages = self.chat.messages(record)
        ep.prompt_ids = self.chat.prompt_ids(record, schemas)
        invalid_streak = 0
        while not ep.ended:
            room = s.max_model_len - len(ep.prompt_ids) - len(ep.response_ids)
            budget = s.max_episode_tokens - len(ep.response_ids) if s.max_episode_tokens else room
            max_tokens = min(s.max_tokens, room, budget)
            if max_tokens <= 0:
                ep.ended = "budget" if budget < room else "length"
                break
            turn_seed = None if seed is None else seed + 7919 * ep.assistant_turns
            params = self.engine.sampling(1, max_tokens, s.temperature, s.top_p, seed=turn_seed,
                                          stop_token_ids=s.stop_token_ids)  # fmt: skip
            (c,) = await self.engine.generate(ep.context_ids, params)
            if not c.token_ids:
                ep.ended = "empty"
                break
            ep.add_generated(c.token_ids, c.logprobs, c.versions)
            parsed = self.parser.parse(self.parser.decode(c.token_ids), schemas, turn=ep.assistant_turns)
            assistant: dict[str, Any] = {"role": "assistant", "content": parsed.content}
            if parsed.calls:
                assistant["tool_calls"] = [call.openai() for call in parsed.calls]
            history = list(ep.messages)
            ep.messages.append(assistant)
            ep.final_text = parsed.content
            if c.finish_reason == "length":  # cut mid-turn (its calls may be cut too): run none
                ep.ended = "budget" if budget < min(s.max_tokens, room) else "length"
            elif not parsed.calls and not parsed.malformed:
                ep.ended = "stop"
            elif ep.assistant_turns >= s.max_assistant_turns or ep.user_turns >= s.max_user_turns:
                ep.ended = "max_turns"
            if ep.ended:
                break
            results = await self._run_calls(parsed, tools, record)
            invalid_streak = invalid_streak + 1 if all(r.outcome in INVALID for r in results) else 0
            tool_messages = [
                {"role": "tool", "tool_call_id": call_id, "name": r.name,
                 "content": tools_mod.truncate_middle(r.text, s.max_tool_response_chars)}
                for call_id, r in zip(_call_ids(parsed), results, strict=True)
            ]  # fmt: skip
            end_text = self.parser.tokenizer.decode(c.token_ids[-1:], skip_special_tokens=False)
            ids = self.chat.encode(self.chat.between(history, schemas, end_text, tool_messages))
            if len(ep.prompt_ids) + len(ep.response_ids) + len(ids) >= s.max_model_len:
                ep.ended = "length"  # the tool output leaves no room for another turn
            elif s.max_episode_tokens and len(ep.response_ids) + len(ids) >= s.max_episode_tokens:
                ep.ended = "budget"
            else:
                ep.add_context(ids)
                ep.tool_calls.extend(results)  # only calls whose output reached the model
                ep.messages.extend(tool_messages)
                ep.user_turns += 1
                if invalid_streak >= s.max_consecutive_invalid:
                    ep.ended = "invalid_calls"

    async def _run_calls(
        self, parsed: parser_mod.ParsedTurn, tools: Mapping[str, tools_mod.Tool], record: Mapping[str, Any]
    ) -> list[tools_mod.CallResult]:
        """Every call of the turn, at most maxParallelCalls at once (per turn, as verl's
        max_parallel_calls); each outcome counted. A turn that started a call no call came out of is one
        ``malformed`` result."""
        slots = asyncio.Semaphore(self.s.max_parallel_calls)

        async def one(call: parser_mod.ParsedCall) -> tools_mod.CallResult:
            if call.error is not None:
                return tools_mod.CallResult(call.name, "bad_arguments", f"error: {call.error}", 0.0)
            async with slots:
                return await tools_mod.call(tools, call.name, call.arguments, record, self.s.tool_timeout_s)

        if parsed.malformed and not parsed.calls:
            results = [tools_mod.CallResult("", "malformed", "error: the tool call could not be parsed", 0.0)]
        else:
            results = list(await asyncio.gather(*(one(call) for call in parsed.calls)))
        if self.m is not None:
            for r in results:
                label = (
                    r.name
                    if r.name in self.tools
                    else "(unparsed)"
                    if r.outcome == "malformed"
                    else "(unknown)"
                )
                self.m.tool_calls_by(label, r.outcome).inc()
                if r.outcome in RAN:
                    self.m.tool_seconds.observe(r.seconds)
        return results

    def _count(self, ep: recorder.Episode) -> None:
        if self.m is not None:
            self.m.agent_turns.observe(ep.assistant_turns)
            self.m.agent_episodes_by(ep.ended).inc()


INVALID = ("malformed", "bad_arguments", "unknown_tool")
"""Call outcomes that count toward maxConsecutiveInvalidCalls (the model's fault, not the tool's)."""
RAN = ("ok", "error", "timeout")
"""Outcomes of calls that reached the tool (their latency is observed)."""


def _call_ids(parsed: parser_mod.ParsedTurn) -> list[str]:
    if parsed.malformed and not parsed.calls:
        return ["call_malformed"]
    return [call.id for call in parsed.calls]
