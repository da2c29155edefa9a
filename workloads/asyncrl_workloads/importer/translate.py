"""verl / AReaL config -> AsyncRLJob: the pure translator behind ``asyncrl import`` (``cli.py``).

    result = translate("verl", yaml.safe_load(text), overrides=[...], env=os.environ, tools=[...])
    result.job        the AsyncRLJob as a dict (the CLI checks it with the operator's admission)
    result.rows       one Row per leaf of the source config: mapped (target, how) or not (why) - none dropped
    result.secrets    the ``kubectl create secret`` commands the job's Secret references need

Every leaf key of the source is looked up in its table (``importer/verl.py``, ``importer/areal.py``; the
rule vocabulary is ``importer/rules.py``), after Hydra overrides and interpolations (``importer/hydra.py``).
A secret never reaches the job: a field that takes one gets a Secret reference; anything else that holds
one is listed as not mapped. No I/O here.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from asyncrl_workloads.importer import areal, hydra, rules, verl

TABLES: Mapping[str, rules.Table] = {"verl": verl.TABLE, "areal": areal.TABLE}
DEFAULT_NAME = "imported"
_NAME_KEYS = {"verl": "trainer.experiment_name", "areal": "experiment_name"}


@dataclasses.dataclass(frozen=True)
class Row:
    source: str
    value: str
    """As shown: a secret shows as its interpolation or as hidden, never its value."""
    target: str | None
    """The spec field(s) it sets, "" when it sets nothing (asyncrl behaves so anyway), None: not mapped."""
    note: str
    """How it maps, or why it does not."""


@dataclasses.dataclass
class Result:
    job: dict[str, Any]
    rows: list[Row]
    secrets: list[str]
    notes: list[str]
    """What the importer decided beyond single keys (the mode, the agent loop)."""


def translate(
    kind: str,
    config: Mapping[str, Any],
    *,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    name: str | None = None,
    tools: Sequence[str] = (),
    reward: str | None = None,
) -> Result:
    """The AsyncRLJob for ``config`` (see the module docstring); KeyError for an unknown ``kind``."""
    table = TABLES[kind]
    source = copy.deepcopy(dict(config))
    hydra.apply_overrides(source, overrides)
    cfg = hydra.resolve(dict(hydra.leaves(source)), env or {})
    ctx = rules.Context(cfg, tuple(tools))
    name = name or job_name(cfg.get(_NAME_KEYS[kind]))
    result = Result({}, [], [], [])
    spec = _base(kind, ctx, name, reward, result)
    for key, value in cfg.items():
        result.rows.append(_apply(_rule(table, key), key, value, ctx, spec, name, result))
    result.job = {
        "apiVersion": "asyncrl.dev/v1alpha1",
        "kind": "AsyncRLJob",
        "metadata": {"name": name},
        "spec": spec,
    }
    return result


def job_name(value: Any) -> str:
    """A DNS-1123 name from the source's experiment name (at most 40 characters)."""
    text = re.sub(r"[^a-z0-9-]+", "-", str(value or "").lower()).strip("-")[:40].strip("-")
    return text or DEFAULT_NAME


def _base(kind: str, ctx: rules.Context, name: str, reward: str | None, result: Result) -> dict[str, Any]:
    spec: dict[str, Any] = {"data": {"format": "chat"}}
    if reward:
        _set(spec, "reward.function", reward)
        result.notes.append(f"reward.function = {reward} (--reward)")
    if kind == "verl":
        spec["mode"] = "async" if verl.fully_async(ctx) else "one-step-off"
        result.notes.append(
            "mode async (async_training: verl's fully_async_policy)"
            if spec["mode"] == "async"
            else "mode one-step-off (no async_training: verl's one_step_off_policy)"
        )
        if ctx.tools and ctx.get(verl.TURN + "enable"):
            spec["agent"] = {"loop": "tool", "tools": list(ctx.tools)}
            result.notes.append(f"agent loop tool with tools {', '.join(ctx.tools)} (--tool)")
    elif any(k.startswith("rollout.agent.") for k in ctx.cfg):
        secret = {"name": f"{name}-gateway", "key": "adminKey"}
        spec["agent"] = {"loop": "gateway", "gateway": {"adminKeySecret": secret}}
        if "rollout.agent.admin_api_key" not in ctx.cfg:
            result.secrets.append(_kubectl(secret, "<an admin key of your choice>"))
        result.notes.append("agent loop gateway (AReaL's agent modes: the agent calls the policy over HTTP)")
    if ctx.tools and "agent" not in spec:
        result.notes.append("--tool ignored: the config has no agent loop (multi_turn.enable)")
    return spec


def _rule(table: rules.Table, key: str) -> rules.Rule:
    if key in table:
        return table[key]
    parts = key.split(".")
    for n in range(len(parts) - 1, 0, -1):
        if (prefix := ".".join(parts[:n]) + ".*") in table:
            return table[prefix]
    return rules.Gone(f"no asyncrl field for this {kind_of(key)} key")


def kind_of(key: str) -> str:
    return key.split(".", 1)[0] if "." in key else "top-level"


def _apply(
    rule: rules.Rule,
    key: str,
    value: Any,
    ctx: rules.Context,
    spec: dict[str, Any],
    name: str,
    result: Result,
) -> Row:
    shown = str(value) if isinstance(value, hydra.Secret | hydra.Unresolved) else _show(value)
    if isinstance(rule, rules.Gone):
        return Row(key, shown, None, rule.reason)
    if isinstance(rule, rules.Implied):
        return Row(key, shown, "", rule.note)
    if value is None:
        return Row(key, shown, None, "unset (null) in the source: asyncrl's default stands")
    written: list[str] = []
    notes: list[str] = []
    skipped: list[str] = []
    for to in rule if isinstance(rule, tuple) else (rule,):
        try:
            written.append(_write(to, value, ctx, spec, name, result))
            notes.append(to.note)
        except rules.Skip as exc:
            skipped.append(f"not {to.target}: {exc}" if isinstance(rule, tuple) else str(exc))
    if not written:
        return Row(key, shown, None, "; ".join(skipped))
    note = "; ".join(n for n in notes + skipped if n) or ("" if any(written) else "asyncrl does the same")
    return Row(key, shown, ", ".join(t for t in written if t), note)


def _write(
    to: rules.To, value: Any, ctx: rules.Context, spec: dict[str, Any], name: str, result: Result
) -> str:
    if isinstance(value, hydra.Unresolved):
        raise rules.Skip(value.why)
    if isinstance(value, hydra.Secret):
        if not to.target.endswith("Secret"):
            raise rules.Skip("holds a secret: never written into the job")
        ref = {"name": f"{name}-secrets", "key": value.env or value.key.rsplit(".", 1)[-1].replace("_", "-")}
        _set(spec, to.target, ref)
        result.secrets.append(_kubectl(ref, f"${value.env}" if value.env else "<the value in your config>"))
        return to.target
    converted = to.convert(value, ctx)
    if isinstance(converted, rules.Many):
        for target, item in converted.values.items():
            _set(spec, target, item)
        return ", ".join(converted.values)
    if to.target:
        _set(spec, to.target, converted)
    return to.target


def _set(spec: dict[str, Any], target: str, value: Any) -> None:
    *parents, last = target.split(".")
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _kubectl(ref: Mapping[str, str], value: str) -> str:
    return f"kubectl create secret generic {ref['name']} --from-literal={ref['key']}={value}"


def _show(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."
