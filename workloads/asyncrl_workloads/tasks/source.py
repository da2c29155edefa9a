"""Prompt sources for ``spec.data.prompts`` / ``spec.data.validation``: a data file or ``builtin:<task>``.

Called by the rollout entry point at start-up (before the engine starts). The file's reader is chosen by
what the path is (``data/readers.py``: parquet, JSONL, JSON, a ``datasets.save_to_disk`` directory);
every record is then checked once, streaming, so a missing file, a line that is not JSON, a record
whose ``promptKey`` is not a prompt or that lacks a field the reward needs fails fast with one line
naming the spec field, the file, the row (or line) and the record field:

    spec.data.prompts: '/data/gsm8k/train.parquet' row 17: field 'reward_model.ground_truth' is missing
    (spec.reward.groundTruthKey)

Keys may be dotted (``data/fields.py``). Records keep every field for the reward and the tools.
"""

from __future__ import annotations

import importlib
import pathlib
from collections.abc import Mapping
from typing import Any

from asyncrl_workloads.data import fields, readers

BUILTIN_PREFIX = "builtin:"
BUILTIN_TASKS = {"say_char": "asyncrl_workloads.tasks.say_char", "lookup": "asyncrl_workloads.tasks.lookup"}


class PromptSourceError(ValueError):
    """``spec.data`` does not name a readable prompt source."""


def load_prompts(
    source: str,
    prompt_key: str = "prompt",
    field: str = "spec.data.prompts",
    chat: bool = False,
    required: Mapping[str, str] | None = None,
) -> readers.Records:
    """The records of ``source``, each checked: ``prompt_key`` holds a string, or with ``chat``
    (data.format chat) also a list of ``{role, content}`` messages; every key of ``required`` is present
    and not null (parquet has no "absent": a row without a field holds null there); the values of
    ``required`` are the spec fields that name the keys, quoted in the message."""
    try:
        if source.startswith(BUILTIN_PREFIX):
            records: readers.Records = readers.ListRecords(_builtin(source[len(BUILTIN_PREFIX) :], field))
        else:
            records = readers.open_records(pathlib.Path(source))
        if not len(records):
            raise PromptSourceError(f"{field}: {source!r} holds no prompts")
        for i, record in enumerate(records):
            if problem := _problem(record, prompt_key, chat, required or {}):
                raise PromptSourceError(f"{field}: {source!r} {records.where(i)}: {problem}")
    except readers.ReadError as exc:
        raise PromptSourceError(f"{field}: {exc}") from None
    return records


def _problem(record: Mapping[str, Any], prompt_key: str, chat: bool, required: Mapping[str, str]) -> str:
    """What is wrong with one record ("" when nothing is)."""
    prompt = fields.lookup(record, prompt_key)
    if not (isinstance(prompt, str) or (chat and _is_messages(prompt))):
        what = "a string or a list of {role, content} messages" if chat else "a string (data.format raw)"
        return f"field {prompt_key!r} must be {what}, got {_kind(prompt)}"
    for key, spec_field in required.items():
        if fields.get(record, key) is None:
            return f"field {key!r} is missing ({spec_field})"
    return ""


def _kind(value: Any) -> str:
    if value is fields.MISSING:
        return "none (no such field)"
    return "null" if value is None else type(value).__name__


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
