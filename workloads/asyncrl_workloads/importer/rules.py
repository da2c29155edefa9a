"""The vocabulary of the mapping tables (``importer/tables.py``): what a source key becomes.

    To(target, convert, note)   the value, converted, goes to an AsyncRLJob spec field (a dotted camelCase
                                path under spec; several for a tuple of To); ``convert`` may raise Skip
    Implied(note)               asyncrl always behaves so: nothing to write, listed as mapped
    Gone(reason)                no asyncrl equivalent: listed as not mapped, with the reason

``convert`` gets the value and the ``Context`` (the whole resolved config and the importer's options),
so a knob that depends on another (verl's batch is ``ppo_mini_batch_size * require_batches``) says so.
A convert may return ``Many`` to set several fields from one value (AReaL's allocation string).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class Skip(Exception):
    """The key cannot be mapped here; ``args[0]`` says why."""


@dataclasses.dataclass(frozen=True)
class Context:
    cfg: Mapping[str, Any]
    """Every leaf of the source config by dotted key, interpolations resolved."""
    tools: Sequence[str] = ()
    """asyncrl tool functions for an agent loop (``--tool``)."""

    def get(self, key: str, default: Any = None) -> Any:
        value = self.cfg.get(key, default)
        return default if value is None else value

    def number(self, key: str, default: float) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Skip(f"needs {key} as a number, got {value!r}")
        return value


Convert = Callable[[Any, Context], Any]


def same(value: Any, ctx: Context) -> Any:
    return value


@dataclasses.dataclass(frozen=True)
class Many:
    """Several targets set from one value."""

    values: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class To:
    target: str
    convert: Convert = same
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Implied:
    note: str


@dataclasses.dataclass(frozen=True)
class Gone:
    reason: str


Rule = To | Implied | Gone | tuple[To, ...]
Table = Mapping[str, Rule]
"""Exact dotted keys, or ``prefix.*`` for every key under a prefix (the longest prefix wins)."""


def integer(value: Any, ctx: Context) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise Skip(f"not an integer: {value!r}")
    return int(value)


def positive(value: Any, ctx: Context) -> int:
    number = integer(value, ctx)
    if number <= 0:
        raise Skip(f"{number} (unset or derived in the source): asyncrl's default stands")
    return number


def only(expected: Any, reason: str) -> Convert:
    """A knob asyncrl supports at one value: that value maps to nothing to write, any other is skipped."""

    def check(value: Any, ctx: Context) -> Any:
        if value != expected:
            raise Skip(reason)
        return value

    return check


def one_path(value: Any, ctx: Context) -> str:
    """verl's data.train_files: a path or a list of them; asyncrl reads one path (a folder of parquet
    files counts as one)."""
    if isinstance(value, str) and value.strip().startswith("["):
        import yaml

        value = yaml.safe_load(value)
    if isinstance(value, list):
        if len(value) != 1:
            raise Skip(f"{len(value)} files: asyncrl reads one path (put parquet files in one folder)")
        value = value[0]
    if not isinstance(value, str) or not value:
        raise Skip(f"not a path: {value!r}")
    if not value.startswith(("/", ".", "~")) and "." not in value.rsplit("/", 1)[-1]:
        raise Skip(
            f"{value!r} looks like a Hub dataset name: nothing is downloaded at run time; save it with"
            " datasets' save_to_disk (or as parquet) on a volume and give that path"
        )
    return value


def ceil_div(a: float, b: float) -> int:
    return max(1, math.ceil(a / b))


def choice(mapping: Mapping[Any, Any], reason: str) -> Convert:
    """A value asyncrl has under another name (``{"xccl": "nccl"}``); any other is skipped with the
    reason (``{value}`` in it is the value)."""

    def pick(value: Any, ctx: Context) -> Any:
        if value not in mapping:
            raise Skip(reason.format(value=repr(value)))
        return mapping[value]

    return pick
