"""The judge: a generative reward model behind an OpenAI-compatible endpoint (``reward.type: judge``).

Called by ``rewards.scorer.Scorer`` for every finished sample a rollout replica publishes. The judge renders
``reward.judge.template`` over the record's fields, the response and the whole conversation (multi-turn
episodes and gateway sessions are judged on all of it, tool messages included), asks the endpoint for one
chat completion through the endpoints room (token bucket, concurrency cap, classified errors, retries with
back-off; on the room's own event-loop thread, so the engine's loop never waits on HTTP), and reads the
reply with the score parser: the first number in [min, max] mapped to [0, 1], or the first verdict word.

A reply the parser cannot read is a ``JudgeError`` (the sample is dropped and counted
``dropped{reason="reward_error"}``, never given a made-up reward); so is an endpoint error that retries
did not cure (``endpoints.errors.EndpointError``). Template placeholders are checked at start-up against
the names every sample has and the fields of the job's first record (``check_template``).
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from asyncrl_api import task as task_api

from asyncrl_workloads.data import fields

BUILTIN_FIELDS = ("prompt", "response", "conversation", "reference")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_QUOTE = 200


class JudgeError(ValueError):
    """The judge's reply could not be turned into a reward, or the template needs a field the record
    lacks."""


def template_fields(template: str) -> list[str]:
    """The ``{name}`` placeholders of a template (ValueError: a placeholder that is not a plain name,
    e.g. ``{a.b}``, ``{a[0]}`` or a format spec: the template is data, not code)."""
    names = []
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(
                f"placeholder {{{name}}} must be a plain {{name}} (no attributes, indices, formats)"
            )
        names.append(name)
    return names


def check_template(judge: task_api.JudgeSpec, record_keys: Iterable[str] | None) -> None:
    """ValueError naming the placeholder that no sample could fill; ``record_keys`` None: the job has
    no records (a gateway whose agents bring their own task), so only the built-in names exist."""
    known = set(BUILTIN_FIELDS) | set(record_keys or ())
    for field, text in (("template", judge.template), ("system", judge.system or "")):
        for name in template_fields(text):
            if name not in known:
                raise ValueError(
                    f"spec.reward.judge.{field}: placeholder {{{name}}} is neither one of "
                    f"{', '.join(BUILTIN_FIELDS)} nor a field of the data's records"
                )


def _content(value: Any) -> str:
    """A message's content as text (OpenAI content parts joined)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(str(p.get("text", "")) for p in value if isinstance(p, Mapping))
    return "" if value is None else str(value)


def render_conversation(messages: Sequence[Mapping[str, Any]]) -> str:
    """``role: content`` lines; an assistant's tool calls are shown as ``-> name(arguments)``."""
    lines = []
    for m in messages:
        text = _content(m.get("content"))
        for call in m.get("tool_calls") or ():
            fn = call.get("function") or {}
            text += f"\n-> {fn.get('name', '?')}({fn.get('arguments', '')})"
        lines.append(f"{m.get('role', '?')}: {text}")
    return "\n".join(lines)


def prompt_messages(record: Mapping[str, Any], prompt_key: str) -> list[dict[str, Any]]:
    """The record's prompt as chat messages (a string is one user message)."""
    prompt = fields.get(record, prompt_key)
    if isinstance(prompt, list):
        return [dict(m) for m in prompt if isinstance(m, Mapping)]
    return [] if prompt is None else [{"role": "user", "content": str(prompt)}]


def build_messages(
    judge: task_api.JudgeSpec,
    record: Mapping[str, Any],
    response: str,
    conversation: Sequence[Mapping[str, Any]] | None,
    prompt_key: str,
) -> list[dict[str, str]]:
    """The judge's chat messages for one sample. ``conversation`` is the episode's whole conversation
    (agent loop, gateway) or None for a single-turn sample (then: the record's prompt + the response)."""
    asked = prompt_messages(record, prompt_key)
    if conversation is None:
        conversation = [*asked, {"role": "assistant", "content": response}]
    users = [_content(m.get("content")) for m in asked if m.get("role") == "user"]
    values = {str(k): v if isinstance(v, str) else str(v) for k, v in record.items()}
    reference = fields.get(record, judge.reference_key)
    values.update(
        prompt=users[-1] if users else "",
        response=response,
        conversation=render_conversation(conversation),
        reference="" if reference is None else str(reference),
    )
    try:
        user = judge.template.format_map(values)
        system = judge.system.format_map(values) if judge.system else None
    except KeyError as exc:
        raise JudgeError(f"the record has no field {exc.args[0]!r} for the judge template") from None
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def parse_score(judge: task_api.JudgeSpec, reply: str) -> float:
    """The reward a reply means: the first verdict word it contains (``verdicts``), or its first number
    mapped from [score.min, score.max] to [0, 1]."""
    if judge.verdicts:
        hits = []
        for word, value in judge.verdicts.items():
            found = re.search(rf"(?<!\w){re.escape(word)}(?!\w)", reply, flags=re.IGNORECASE)
            if found:
                hits.append((found.start(), -len(word), value))
        if not hits:
            raise JudgeError(
                f"no verdict of {sorted(judge.verdicts)} in the judge's reply {reply[:_QUOTE]!r}"
            )
        return float(min(hits)[2])
    found = _NUMBER.search(reply)
    if found is None:
        raise JudgeError(f"no number in the judge's reply {reply[:_QUOTE]!r}")
    value = float(found.group())
    low, high = judge.score.min, judge.score.max
    if not low <= value <= high:
        raise JudgeError(
            f"the judge's score {value:g} is outside [{low:g}, {high:g}] (reply {reply[:_QUOTE]!r})"
        )
    return (value - low) / (high - low)
