"""Prompt sources for ``spec.data.prompts``: a JSONL file, or ``builtin:<task>``.

Called by the rollout worker at start-up (before the engine starts), so a missing file or a
record without ``promptKey`` fails fast with the field named.
"""

from __future__ import annotations

import importlib
import json
import pathlib
from typing import Any

BUILTIN_PREFIX = "builtin:"
BUILTIN_TASKS = {"say_char": "asyncrl_workloads.tasks.say_char", "lookup": "asyncrl_workloads.tasks.lookup"}


class PromptSourceError(ValueError):
    """``spec.data`` does not name a readable prompt source."""


def load_prompts(
    source: str, prompt_key: str = "prompt", field: str = "spec.data.prompts", chat: bool = False
) -> list[dict[str, Any]]:
    """Read every prompt record; each record is a dict that holds ``prompt_key`` as a string, or with
    ``chat`` (data.format chat) also as a list of ``{role, content}`` messages."""
    if source.startswith(BUILTIN_PREFIX):
        records = _builtin(source[len(BUILTIN_PREFIX) :], field)
    else:
        records = _jsonl(pathlib.Path(source), field)
    if not records:
        raise PromptSourceError(f"{field}: {source!r} holds no prompts")
    for i, rec in enumerate(records):
        prompt = rec.get(prompt_key)
        if isinstance(prompt, str) or (chat and _is_messages(prompt)):
            continue
        what = "a string or a list of {role, content} messages" if chat else "a string (data.format raw)"
        raise PromptSourceError(f"{field}: record {i} of {source!r}: field {prompt_key!r} must be {what}")
    return records


def _is_messages(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in value)
    )


def _builtin(task: str, field: str) -> list[dict[str, Any]]:
    if task not in BUILTIN_TASKS:
        raise PromptSourceError(f"{field}: unknown builtin task {task!r} (known: {', '.join(BUILTIN_TASKS)})")
    module = importlib.import_module(BUILTIN_TASKS[task])
    return list(module.records())


def _jsonl(path: pathlib.Path, field: str) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise PromptSourceError(f"{field}: cannot read {str(path)!r} ({exc.strerror})") from None
    records: list[dict[str, Any]] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptSourceError(f"{field}: {str(path)!r} line {n} is not JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise PromptSourceError(f"{field}: {str(path)!r} line {n} is not a JSON object")
        records.append(rec)
    return records
