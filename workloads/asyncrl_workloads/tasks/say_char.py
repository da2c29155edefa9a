"""A tiny synthetic task: "say X" -> answer with the character X.

Used by the local runner's default job and the data-plane tests: a randomly initialised
2-layer model learns it within minutes on 2 CPU cores, so reward visibly rises.

The reward is graded so that a random policy already gets a signal (the tiny model's
character-level vocabulary has ~100 tokens, so a random policy names X first ~1% of the time):

    1.0  the first non-space character of the response is X
    0.3  it is another letter of the task's alphabet
    0.1  it is some other ASCII lowercase letter
    0.0  anything else (digits, punctuation, bytes, an empty completion)

Referenced in a job as ``data.prompts: builtin:say_char`` and
``reward.function: asyncrl_workloads.tasks.say_char:reward``.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

ALPHABET = "abcdefgh"
"""The letters the prompts ask for; few enough that every one is seen in every step."""


def records() -> list[dict[str, Any]]:
    """One prompt record per letter: ``{"prompt": "say a:", "answer": "a"}``."""
    return [{"prompt": f"say {ch}:", "answer": ch} for ch in ALPHABET]


def reward(record: Mapping[str, Any], response: str) -> float:
    """Graded reward for the first non-space character of ``response`` (see module docstring)."""
    text = response.lstrip()
    if not text:
        return 0.0
    first = text[0]
    if first == record["answer"]:
        return 1.0
    if first in ALPHABET:
        return 0.3
    if first in string.ascii_lowercase:
        return 0.1
    return 0.0
