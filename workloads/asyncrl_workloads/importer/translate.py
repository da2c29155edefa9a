"""verl / AReaL config -> AsyncRLJob: the pure translator behind ``asyncrl import`` (``cli.py``).

    result = translate("verl", yaml.safe_load(text), overrides=[...], env=os.environ, tools=[...])
    result.job        the AsyncRLJob as a dict (the CLI checks it with the operator's admission)
    result.rows       one Row per leaf of the source config: mapped (target, how), not mapped (why) or
                      refused (why) - none dropped
    result.refused    the algorithm-defining keys asyncrl cannot keep, with what the job would do instead
                      (``translate`` raises ``Refused`` when there are any, unless ``refuse=False``)
    result.conflicts  two keys that wanted one field with different values (the first kept, both named)
    result.flags      values the job keeps but the user must act on first (Hub ids: the download command)
    result.secrets    the ``kubectl create secret`` commands the job's Secret references need, and every
                      other secret-holding key (named, never its value)

Four dialects, one table each: verl's resolved config (``verl.py``) or the seed documents' verl layout
(``verl_seed.py``: ``rollouter``, ``agent_loop``, ``resource_pool``), AReaL (``areal.py``) or the seeds'
AReaL layout (``areal_seed.py``: ``train``, ``async``, ``agent``), told apart by their top-level keys
(``asyncrl import verl|areal`` picks the family). The rule vocabulary is ``importer/rules.py``; the
algorithm aspects (checked by value, with the source's defaults) are ``verl_algorithm.py`` and
``areal_algorithm.py``; Hydra overrides and interpolations are ``importer/hydra.py``. No I/O here.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from asyncrl_workloads.importer import areal, areal_seed, hydra, report, rules, verl, verl_seed

DIALECTS: Mapping[str, tuple[ModuleType, ...]] = {"verl": (verl_seed, verl), "areal": (areal_seed, areal)}
"""Per ``asyncrl import`` kind, its dialect modules: the first whose ``matches`` accepts the config."""
DEFAULT_NAME = "imported"
_ALGORITHM = "trainer.algorithm."


@dataclasses.dataclass(frozen=True)
class Row:
    source: str
    value: str
    """As shown: a secret shows as its interpolation or as hidden, never its value."""
    target: str | None
    """The spec field(s) it sets, "" when it sets nothing (asyncrl behaves so anyway), None: not mapped."""
    note: str
    """How it maps, or why it does not."""
    refused: bool = False
    """The key defines the algorithm and asyncrl cannot keep it: the import stops (exit 2)."""


@dataclasses.dataclass
class Result:
    job: dict[str, Any]
    rows: list[Row]
    secrets: list[str]
    notes: list[str]
    """What the importer decided beyond single keys (the mode, the agent loop, the source's defaults)."""
    dialect: str = ""
    refused: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    """(key, why) for every key asyncrl cannot keep, set in the config or left at the source's default."""
    conflicts: list[str] = dataclasses.field(default_factory=list)
    flags: list[str] = dataclasses.field(default_factory=list)


class Refused(hydra.OverrideError):
    """The config asks for an algorithm asyncrl would not train: no job is written. An OverrideError
    (what ``asyncrl import`` catches to print one message and exit 2) whose message names every refused
    key and carries the whole mapping table."""

    def __init__(self, result: Result) -> None:
        self.result = result
        lines = [f"  {key}: {why}" for key, why in result.refused]
        super().__init__(
            f"refused: asyncrl would train something else than this config asks for"
            f" ({len(lines)} key{'s' if len(lines) > 1 else ''})\n"
            + "\n".join(lines)
            + "\nno job is written; the mapping table:\n"
            + report.table(result)
        )


def translate(
    kind: str,
    config: Mapping[str, Any],
    *,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    name: str | None = None,
    tools: Sequence[str] = (),
    reward: str | None = None,
    refuse: bool = True,
) -> Result:
    """The AsyncRLJob for ``config`` (see the module docstring); KeyError for an unknown ``kind``;
    ``Refused`` when an algorithm-defining key cannot be kept (``refuse=False``: the result instead)."""
    source = copy.deepcopy(dict(config))
    hydra.apply_overrides(source, overrides)
    cfg = hydra.resolve(dict(hydra.leaves(source)), env or {})
    module = next(m for m in DIALECTS[kind] if m.matches(cfg))
    name = name or job_name(cfg.get(module.NAME_KEY))
    ctx = rules.Context(cfg, tuple(tools), dict(env or {}), name)
    result = Result({}, [], [], [], dialect=module.DIALECT)
    writer = _Writer({"data": {"format": "chat"}}, result)
    if reward:
        writer.set("reward.function", reward, "--reward")
        result.notes.append(f"reward.function = {reward} (--reward)")
    start = module.base(ctx)
    for target, value in start.fields.items():
        writer.set(target, value, "(the importer)")
    result.notes += start.notes
    if ctx.tools and "agent" not in writer.spec:
        result.notes.append("--tool ignored: the config has no agent loop")
    for key, value in cfg.items():
        result.rows.append(_apply(_rule(module.TABLE, key), key, value, ctx, writer))
    _algorithm(module, ctx, writer, result)
    _secrets(cfg, ctx, result)
    result.flags = list(ctx.flags)
    result.job = {
        "apiVersion": "asyncrl.dev/v1alpha1",
        "kind": "AsyncRLJob",
        "metadata": {"name": name},
        "spec": writer.spec,
    }
    if refuse and result.refused:
        raise Refused(result)
    return result


def job_name(value: Any) -> str:
    """A DNS-1123 name from the source's experiment name (at most 40 characters)."""
    text = re.sub(r"[^a-z0-9-]+", "-", str(value or "").lower()).strip("-")[:40].strip("-")
    return text or DEFAULT_NAME


@dataclasses.dataclass
class _Writer:
    """The spec being built, with the source key behind each field, so that two keys wanting one field
    with different values are reported (the first kept) instead of the later one winning silently."""

    spec: dict[str, Any]
    result: Result
    sources: dict[str, tuple[str, Any]] = dataclasses.field(default_factory=dict)

    def set(self, target: str, value: Any, source: str) -> str | None:
        """Write ``target``; on a conflict keep the earlier value and return why."""
        earlier = self.sources.get(target)
        if earlier is not None and earlier[0] != source and earlier[1] != value:
            why = f"{target}: {source} wants {_show(value)}, {earlier[0]} {_show(earlier[1])}"
            self.result.conflicts.append(f"{why}; the job keeps {_show(earlier[1])} ({earlier[0]})")
            if target.startswith(_ALGORITHM):
                self.result.refused.append((source, f"conflicts with {earlier[0]} on {target}"))
            return f"conflicts with {earlier[0]} ({target} stays {_show(earlier[1])})"
        self.sources.setdefault(target, (source, value))
        *parents, last = target.split(".")
        node = self.spec
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
        return None


def _rule(table: rules.Table, key: str) -> rules.Rule:
    bare = re.sub(r"\[\d+\]", "", key)
    if bare.rsplit(".", 1)[-1] == "_target_":
        return rules.Implied("the Python class Hydra builds its section with")
    if bare in table:
        return table[bare]
    parts = bare.split(".")
    for n in range(len(parts) - 1, 0, -1):
        if (prefix := ".".join(parts[:n]) + ".*") in table:
            return table[prefix]
    return rules.Gone(f"no asyncrl field for this {kind_of(key)} key")


def kind_of(key: str) -> str:
    return key.split(".", 1)[0] if "." in key else "top-level"


def _apply(rule: rules.Rule, key: str, value: Any, ctx: rules.Context, writer: _Writer) -> Row:
    shown = _show(value)
    if isinstance(rule, rules.Gone):
        return Row(key, shown, None, rule.reason)
    if isinstance(rule, rules.Implied):
        return Row(key, shown, "", rule.note)
    tos = rule if isinstance(rule, tuple) else (rule,)
    if value is None and not any(to.target == rules.ALGORITHM for to in tos):
        return Row(key, shown, None, "unset (null) in the source: asyncrl's default stands")
    written: list[str] = []
    notes: list[str] = []
    skipped: list[str] = []
    for to in tos:
        try:
            targets, conflicts, extra = _write(to, key, value, ctx, writer)
        except rules.Refuse as exc:
            if exc.key not in (None, key):
                skipped.append(f"follows {exc.key}, which is refused")
                continue
            writer.result.refused.append((key, str(exc)))
            return Row(key, shown, None, str(exc), refused=True)
        except rules.Skip as exc:
            skipped.append(f"not {to.target}: {exc}" if len(tos) > 1 else str(exc))
            continue
        if targets or not conflicts:
            written.append(", ".join(targets))
            notes += [to.note, *extra]
        skipped += conflicts
    if not written:
        return Row(key, shown, None, "; ".join(skipped))
    note = "; ".join(n for n in notes + skipped if n) or ("" if any(written) else "asyncrl does the same")
    return Row(key, shown, ", ".join(t for t in written if t), note)


def _write(
    to: rules.To, key: str, value: Any, ctx: rules.Context, writer: _Writer
) -> tuple[list[str], list[str], list[str]]:
    """(the targets written, the conflicts that kept others from being written, and a Many's note)."""
    if isinstance(value, hydra.Unresolved):
        raise rules.Skip(value.why)
    extra: list[str] = []
    if isinstance(value, hydra.Secret):
        if not to.target.endswith("Secret"):
            raise rules.Skip("holds a secret: never written into the job (listed under secrets)")
        ref = ctx.secret_ref(
            value.env or value.key.rsplit(".", 1)[-1].replace("_", "-"),
            f"${value.env}" if value.env else f"<the value of {value.key} in your config>",
            value.key,
        )
        values: Mapping[str, Any] = {to.target: ref}
    else:
        converted = to.convert(value, ctx)
        if isinstance(converted, rules.Many):
            values = converted.values
            extra = [converted.note] if converted.note else []
        else:
            values = {to.target: converted} if to.target else {}
    targets: list[str] = []
    conflicts: list[str] = []
    for target, item in values.items():
        why = writer.set(target, item, key)
        conflicts += [why] if why else []
        targets += [] if why else [target]
    return targets, conflicts, extra


def _algorithm(module: ModuleType, ctx: rules.Context, writer: _Writer, result: Result) -> None:
    """Every aspect of the source's algorithm, whether or not a key of the config names it: a refusal of
    a key left at the source's default, and fields where the source's default differs from asyncrl's."""
    refused = {key for key, _ in result.refused}
    for aspect in module.ASPECTS:
        derived = ctx.derive(aspect)
        if derived.refused is not None:
            key, why = derived.refused
            if key not in refused:
                result.refused.append((key, why))
                refused.add(key)
            continue
        for target, value in derived.fields.items():
            if target not in writer.sources:
                writer.set(target, value, f"({module.DIALECT}'s default)")
        result.notes += [n for n in derived.notes if n not in result.notes]


def _secrets(cfg: Mapping[str, Any], ctx: rules.Context, result: Result) -> None:
    """The commands the job's Secret references need, then every other secret the config holds: named
    with the Secret to create should the user's own code need it, never shown."""
    result.secrets = list(ctx.secrets)
    used = " ".join(ctx.secrets)
    seen: set[str] = set()
    for value in cfg.values():
        for secret in hydra.secrets_in(value):
            variable = secret.env or _variable(secret.key)
            if secret.key in ctx.used or f"--from-literal={variable}=" in used or secret.key in seen:
                continue
            seen.add(secret.key)
            where = f"${secret.env}" if secret.env else f"<the value of {secret.key} in your config>"
            result.secrets.append(
                f"{secret.key}: a secret, not shown and not written; nothing in the job uses it (for your"
                f" reward, tools or agent: kubectl create secret generic {ctx.name}-secrets"
                f" --from-literal={variable}={where})"
            )


def _variable(key: str) -> str:
    last = re.split(r"[.\[\]]+", key.strip("]"))[-1]
    return last if re.fullmatch(r"[A-Z][A-Z0-9_]*", last) else last.upper().replace("-", "_")


def _show(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."
