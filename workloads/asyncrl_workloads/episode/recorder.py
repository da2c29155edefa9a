"""The episode recorder: the token arrays of one multi-turn trajectory as it grows, turn by turn.

Used by the agent loop (``episode/loop.py``) and handed to the rollout worker, which scores it and
publishes it as a ``bus.trajectory.Trajectory``. The arrays line up over response tokens (R,) exactly
as the trajectory's do:

    response_ids  (R,)  every token after the prompt: generated turns and the template/tool tokens
                        between them
    logprobs      (R,)  the engine's behaviour logprob for generated tokens; 0.0 for context tokens
                        (never used: their mask is 0, and the loss multiplies by the mask)
    versions      (R,)  the policy version of each generated token; a context token repeats the version of the
                        generated token before it, so min(versions) is the oldest *generated* token's version
                        and the trainer's staleness rule needs no change for multi-turn trajectories
    mask          (R,)  1 = generated (trained), 0 = tool output and template tokens between turns

``ENDED`` lists why an episode can end; ``ended`` is always one of them once the loop returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

ENDED = ("stop", "max_turns", "length", "budget", "invalid_calls", "empty", "error")
"""stop: answered without a tool call; max_turns: maxAssistantTurns or maxUserTurns reached; length: the
context (maxModelLen) or the turn's maxTokens cut it; budget: maxEpisodeTokens; invalid_calls:
maxConsecutiveInvalidCalls turns in a row had only invalid calls; empty: the engine returned no token;
error: the chat template or the tool parser failed on this episode (the loop logs the first of a kind)."""


@dataclasses.dataclass
class Episode:
    prompt_ids: list[int]
    messages: list[dict[str, Any]]
    """The conversation in OpenAI form: the prompt's messages, then assistant turns (content and
    tool_calls) and tool results, as the reward function sees it."""
    response_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    """Turns of tool responses (verl counts them as user turns)."""
    tool_calls: list[Any] = dataclasses.field(default_factory=list)
    """The ``episode.tools.CallResult`` of every call whose answer reached the model, in order
    (parse failures included)."""
    ended: str = ""
    final_text: str = ""
    """The last assistant turn's text without tool-call markup: what a rule reward scores."""

    def add_generated(
        self, token_ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int]
    ) -> None:
        """One assistant turn as the engine sampled it (mask 1)."""
        self.response_ids.extend(token_ids)
        self.logprobs.extend(logprobs)
        self.versions.extend(versions)
        self.mask.extend([1] * len(token_ids))
        self.assistant_turns += 1

    def add_context(self, token_ids: Sequence[int]) -> None:
        """Tokens the model did not generate (the end of its turn, tool messages, the next turn's
        header): mask 0, logprob 0.0, the version of the last generated token."""
        version = self.versions[-1] if self.versions else 0
        self.response_ids.extend(token_ids)
        self.logprobs.extend([0.0] * len(token_ids))
        self.versions.extend([version] * len(token_ids))
        self.mask.extend([0] * len(token_ids))

    @property
    def context_ids(self) -> list[int]:
        """What the next turn is generated from: the prompt and everything since."""
        return self.prompt_ids + self.response_ids

    @property
    def generated_tokens(self) -> int:
        return sum(self.mask)

    def trim_context_tail(self) -> None:
        """Drop trailing mask-0 tokens (nothing was generated after them; they would only cost the
        trainer compute)."""
        while self.mask and self.mask[-1] == 0:
            for column in (self.response_ids, self.logprobs, self.versions, self.mask):
                column.pop()
