"""What ``asyncrl import`` prints beside the job: every source key, mapped or not, and what to run.

Called by ``cli.py`` with a ``translate.Result``; pure text, so tests compare it whole.
"""

from __future__ import annotations

from asyncrl_workloads.importer import translate


def table(result: translate.Result) -> str:
    """The mapping table: mapped keys (source = value -> target, how), then the ones not mapped with
    the reason, then the Secrets to create and the importer's own decisions."""
    mapped = [r for r in result.rows if r.target is not None]
    dropped = [r for r in result.rows if r.target is None]
    width = max((len(r.source) for r in result.rows), default=0)
    lines = [f"mapped ({len(mapped)} keys):"]
    for r in mapped:
        how = f"  ({r.note})" if r.note else ""
        lines.append(f"  {r.source:<{width}} = {r.value}  ->  {r.target or '(nothing to write)'}{how}")
    lines.append(f"not mapped ({len(dropped)} keys):")
    lines += [f"  {r.source:<{width}} = {r.value}: {r.note}" for r in dropped]
    if result.secrets:
        lines.append("secrets (the job refers to them; create them before applying it):")
        lines += [f"  {command}" for command in result.secrets]
    if result.notes:
        lines.append("decided by the importer:")
        lines += [f"  {note}" for note in result.notes]
    return "\n".join(lines) + "\n"
