"""The vocabulary of the mapping tables (one per source dialect: ``verl.py``, ``verl_seed.py``, ``areal.py``,
``areal_seed.py``): what a source key becomes.

    To(target, convert, note)   the value, converted, goes to an AsyncRLJob spec field (a dotted camelCase
                                path under spec; several for a tuple of To); ``convert`` may raise Skip
                                (not mapped, with why) or Refuse (the import stops, exit 2, naming the key)
    Implied(note)               asyncrl always behaves so, whatever the value: nothing to write, mapped
    Gone(reason)                no asyncrl equivalent: listed as not mapped, with the reason

A row that is "implied" only for some values is ``To("", check, note)``: ``check`` returns the value when
it agrees and raises Skip or Refuse when it contradicts (``only``, ``choice``), so a value is never
listed as implied when asyncrl would do something else.

``convert`` gets the value and the ``Context`` (the whole resolved config, the importer's options and
what the import collects on the way), so a knob that depends on another (verl's batch is
``ppo_mini_batch_size``, its step ``require_batches`` of them) says so. A convert may return ``Many`` to
set several fields from one value (AReaL's allocation string, an algorithm aspect).

Algorithm semantics are not per key: ``Aspect`` functions read every key of one part of the algorithm
(the estimator, the loss, the correction, KL ...) with the source's own defaults and return the fields
that reproduce it, or a refusal naming the key asyncrl cannot follow; ``part(aspect)`` is the convert of
each key it reads, and ``translate.py`` also writes an aspect no key of the config mentions (a source
default that differs from asyncrl's).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from asyncrl_api import lora

from asyncrl_workloads.importer import hub


class Skip(Exception):
    """The key cannot be mapped here; ``args[0]`` says why."""


class Refuse(Skip):
    """The key defines the algorithm and asyncrl cannot keep its meaning: the import exits 2 naming it.
    ``key`` is the key to blame when a convert refuses for another key (an aspect read by several)."""

    def __init__(self, why: str, key: str | None = None) -> None:
        super().__init__(why)
        self.key = key


@dataclasses.dataclass(frozen=True)
class Derived:
    """What an aspect of the algorithm becomes: the fields to write and the importer's notes, or a
    refusal naming the key (``refused`` = (key, why))."""

    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    notes: Sequence[str] = ()
    refused: tuple[str, str] | None = None


Aspect = Callable[["Context"], Derived]


@dataclasses.dataclass
class Context:
    cfg: Mapping[str, Any]
    """Every leaf of the source config by dotted key, interpolations resolved."""
    tools: Sequence[str] = ()
    """asyncrl tool functions for an agent loop (``--tool``)."""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The environment the source would have run in (verl reads W&B and MLflow settings from it)."""
    name: str = "imported"
    """The job's name (Secret names derive from it)."""
    secrets: list[str] = dataclasses.field(default_factory=list)
    """``kubectl create secret`` commands the job's Secret references need, collected by converts."""
    flags: list[str] = dataclasses.field(default_factory=list)
    """Values the job keeps but that need the user first (a Hub id: the command that saves it)."""
    used: set[str] = dataclasses.field(default_factory=set)
    """Config keys whose secret a Secret reference of the job stands for."""
    derived: dict[Aspect, Derived] = dataclasses.field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        value = self.cfg.get(key, default)
        return default if value is None else value

    def has(self, prefix: str) -> bool:
        """A key ``prefix`` or any key under it is in the config (set to something other than null)."""
        return any(
            (k == prefix or k.startswith(prefix + ".")) and v is not None and v != {}
            for k, v in self.cfg.items()
        )

    def number(self, key: str, default: float) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Skip(f"needs {key} as a number, got {value!r}")
        return value

    def derive(self, aspect: Aspect) -> Derived:
        """The aspect's result, computed once per import."""
        if aspect not in self.derived:
            self.derived[aspect] = aspect(self)
        return self.derived[aspect]

    def flag(self, line: str) -> None:
        if line not in self.flags:
            self.flags.append(line)

    def secret_ref(self, key: str, value: str, source: str | None = None) -> dict[str, str]:
        """A reference to key ``key`` of the job's Secret, and the command that creates it (``value`` is
        what to put there, e.g. ``$WANDB_API_KEY``; ``source`` the config key holding the secret)."""
        if source is not None:
            self.used.add(source)
        ref = {"name": f"{self.name}-secrets", "key": key}
        command = f"kubectl create secret generic {ref['name']} --from-literal={key}={value}"
        if command not in self.secrets:
            self.secrets.append(command)
        return ref


Convert = Callable[[Any, Context], Any]


def same(value: Any, ctx: Context) -> Any:
    return value


@dataclasses.dataclass(frozen=True)
class Many:
    """Several targets set from one value (``note``: how, or what of the value could not be mapped)."""

    values: Mapping[str, Any]
    note: str = ""


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


ALGORITHM = "trainer.algorithm"
"""The target of every aspect's rule (the fields it writes are the aspect's)."""


def part(aspect: Aspect, *fields: str, note: str = "", unset: str = "") -> To:
    """The rule of every key an aspect reads: it writes the aspect's fields (those named, when some are:
    ``part(estimator, "gamma")``) or refuses, naming the key; ``unset`` is the row's note when the aspect
    writes nothing (``LoRA off``)."""

    def convert(value: Any, ctx: Context) -> Many:
        derived = ctx.derive(aspect)
        if derived.refused is not None:
            key, why = derived.refused
            raise Refuse(why, key)
        wanted = tuple(f"{ALGORITHM}.{f}" for f in fields)
        values = {k: v for k, v in derived.fields.items() if not wanted or k in wanted}
        return Many(values, "" if values else unset)

    return To(ALGORITHM, convert, note)


def refused(key: str, why: str) -> Derived:
    return Derived(refused=(key, why))


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
    files counts as one). A Hub dataset name is kept and flagged with the command that saves it."""
    if isinstance(value, str) and value.strip().startswith("["):
        import yaml

        value = yaml.safe_load(value)
    if isinstance(value, list):
        if len(value) != 1:
            raise Skip(f"{len(value)} files: asyncrl reads one path (put parquet files in one folder)")
        value = value[0]
    if not isinstance(value, str) or not value:
        raise Skip(f"not a path: {value!r}")
    if (line := hub.dataset_flag(value)) is not None:
        ctx.flag(line)
    return value


def model_path(value: Any, ctx: Context) -> str:
    """A model directory; a Hub id is kept and flagged with the command that saves it to a volume."""
    if not isinstance(value, str) or not value:
        raise Skip(f"not a path: {value!r}")
    if (line := hub.model_flag(value)) is not None:
        ctx.flag(line)
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


LORA_ALL_LINEAR = (
    "all-linear: peft adapts every linear layer but the LM head, on a Llama/Qwen-style decoder its seven"
    " projections (targetModules' default)"
)


def lora_modules(value: Any, exclude: Any = None) -> list[str]:
    """peft's ``target_modules`` (a list of module names, or ``"all-linear"`` alone or as the only item)
    less ``exclude_modules``, as spec.trainer.lora.targetModules; Skip names what asyncrl cannot adapt."""
    names = [value] if isinstance(value, str) else list(value or [])
    if not names or names == ["all-linear"]:
        names = list(lora.ALL_MODULES)
    excluded = [exclude] if isinstance(exclude, str) else list(exclude or [])
    odd = [n for n in [*names, *excluded] if n not in lora.ALL_MODULES]
    if odd:
        raise Skip(
            f"{', '.join(map(str, odd))}: asyncrl adapts only the decoder projections"
            f" {', '.join(lora.ALL_MODULES)} (by name, or all-linear)"
        )
    kept = [n for n in dict.fromkeys(names) if n not in excluded]
    if not kept:
        raise Skip("exclude_modules removes every target module")
    return kept


def lora_bounds(key: str, rank: Any, alpha: Any) -> Derived | None:
    """A refusal when rank or alpha is outside spec.trainer.lora's bounds (asyncrl_api/lora.py), or None."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= 512:
        return refused(key, f"LoRA rank {rank!r}: asyncrl's rank is 1 to 512 (vLLM's largest max_lora_rank)")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha <= 4096:
        return refused(key, f"lora_alpha {alpha!r}: asyncrl's alpha is above 0 and at most 4096")
    return None
