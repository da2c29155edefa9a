"""Dotted record keys: ``reward_model.ground_truth`` addresses ``record["reward_model"]["ground_truth"]``.

Used wherever a spec field names a record field (``data.promptKey``, ``reward.groundTruthKey``,
``reward.judge.referenceKey``): by the readers' start-up checks (``data/records.py``), the prompt
formatting (``episode/chat.py``), the rollout worker, validation, the judge and the verl-style reward
call. A key that is itself a top-level field (``"a.b"`` as one name) wins over the path, so every key
that worked before dotted keys still means what it meant. A path step into a list takes an index
(``prompt.0.content``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()
"""What ``lookup`` returns for a key the record does not hold (None is a value a field can hold)."""


def lookup(record: Mapping[str, Any], key: str) -> Any:
    """The value at ``key`` (a field name or a dotted path), or ``MISSING``."""
    if key in record:
        return record[key]
    value: Any = record
    for part in key.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, Sequence) and not isinstance(value, str) and part.isdigit():
            if int(part) >= len(value):
                return MISSING
            value = value[int(part)]
        else:
            return MISSING
    return value


def get(record: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """``lookup`` with ``default`` for a missing key (like ``dict.get``)."""
    value = lookup(record, key)
    return default if value is MISSING else value


def require(record: Mapping[str, Any], key: str) -> Any:
    """The value at ``key``; KeyError naming the key when the record does not hold it."""
    value = lookup(record, key)
    if value is MISSING:
        raise KeyError(key)
    return value
