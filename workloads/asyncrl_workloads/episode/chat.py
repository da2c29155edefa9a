"""Prompt and between-turn tokens from the model's own chat template (``data.format``).

Called by the rollout (``rollout/main.py`` builds the formatter once; the worker asks it for each
group's prompt ids) and by the agent loop (``between`` after every tool turn). Two formats:

- ``RawFormat`` (``data.format: raw``, base models): the prompt string tokenized as it is.
- ``ChatFormat`` (``data.format: chat``): ``tokenizer.apply_chat_template`` (transformers) on the record's
  messages, with the tool schemas when the agent loop is on.

Generated tokens are never re-tokenized: the next turn is generated from prompt ids + the tokens the engine
sampled + the tokens *between* the turns, which come from rendering the conversation twice with a
placeholder for the assistant turn just generated (AReaL's and verl's way, done generically):

    C = template(history + [assistant: PH])                       (no generation prompt)
    D = template(history + [assistant: PH] + tool messages, add_generation_prompt=True)
    between = (what C puts after PH, less the end-of-turn token the model already generated) + D[len(C):]

This needs a template that renders a conversation as a prefix of its extensions (D starts with C); the
formatter checks that once at start on a probe conversation (``FormatError``: one line, the rollout exits).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from asyncrl_workloads.data import fields

PLACEHOLDER = "\u2063asyncrl-turn\u2063"
"""Stands for the generated assistant turn while the template renders around it."""


class FormatError(ValueError):
    """The model's tokenizer cannot format prompts the way spec.data.format asks."""


def messages_of(record: Mapping[str, Any], prompt_key: str) -> list[dict[str, Any]]:
    """The record's prompt as chat messages: a string is one user message; a list is taken as
    ``{role, content}`` messages."""
    prompt = fields.require(record, prompt_key)
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(m) for m in prompt]


class RawFormat:
    """data.format raw: the prompt string tokenized as it is (the tokenizer adds its BOS)."""

    def __init__(self, tokenizer: Any, prompt_key: str) -> None:
        self.tokenizer, self.prompt_key = tokenizer, prompt_key

    def prompt_ids(self, record: Mapping[str, Any], tools: Sequence[Mapping[str, Any]] = ()) -> list[int]:
        del tools
        return list(self.tokenizer(str(fields.require(record, self.prompt_key)))["input_ids"])


class ChatFormat:
    """data.format chat: prompts and between-turn tokens from the tokenizer's chat template."""

    def __init__(self, tokenizer: Any, prompt_key: str) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise FormatError(
                "spec.data.format: chat, but the model's tokenizer has no chat template "
                "(set data.format: raw for a base model)"
            )
        self.tokenizer, self.prompt_key = tokenizer, prompt_key
        self._probe()

    def _render(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]], gen: bool
    ) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                list(messages), tools=list(tools) or None, add_generation_prompt=gen, tokenize=False
            )
        except Exception as exc:  # jinja's TemplateError, a template's raise_exception(...), bad messages
            raise FormatError(f"spec.data.format: chat: the model's chat template failed: {exc}") from exc
        return str(text)

    def _probe(self) -> None:
        tools = [{"type": "function", "function": {"name": "probe", "description": "p", "parameters": {}}}]
        try:
            self.between([{"role": "user", "content": "x"}], tools, "", [{"role": "tool", "content": "y"}])
        except FormatError:
            raise
        except Exception as exc:  # jinja errors, templates that reject tool messages
            raise FormatError(f"spec.data.format: chat: the model's chat template failed: {exc}") from None

    def messages(self, record: Mapping[str, Any]) -> list[dict[str, Any]]:
        return messages_of(record, self.prompt_key)

    def prompt_ids(self, record: Mapping[str, Any], tools: Sequence[Mapping[str, Any]] = ()) -> list[int]:
        return self.messages_ids(self.messages(record), tools)

    def messages_ids(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()
    ) -> list[int]:
        """A conversation rendered with the generation prompt, as ids (the gateway's new roots)."""
        return self.encode(self._render(messages, tools, True))

    def encode(self, text: str) -> list[int]:
        """Rendered template text -> ids (the template carries its own special tokens)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def between(
        self,
        history: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        end_text: str,
        new_messages: Sequence[Mapping[str, Any]],
    ) -> str:
        """The text between an assistant turn that ended with ``end_text`` (the decoded last generated
        token) and the next turn's first generated token, with ``new_messages`` in between."""
        turn = [*history, {"role": "assistant", "content": PLACEHOLDER}]
        closed = self._render(turn, tools, False)
        extended = self._render([*turn, *new_messages], tools, True)
        if PLACEHOLDER not in closed or not extended.startswith(closed):
            raise FormatError(
                "spec.data.format: chat: the model's chat template does not render a conversation as a "
                "prefix of its continuation, so turns cannot be appended token-exactly"
            )
        closure = closed[closed.rindex(PLACEHOLDER) + len(PLACEHOLDER) :]
        if end_text and closure.startswith(end_text):
            closure = closure[len(end_text) :]
        return closure + extended[len(closed) :]
