"""What ``asyncrl import`` prints beside the job: every source key, mapped or not, and what to do next.

Called by ``cli.py`` with a ``translate.Result`` (and by ``translate.Refused`` for its message); pure
text, so tests compare it whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncrl_workloads.importer import translate


def table(result: translate.Result) -> str:
    """The mapping table: mapped keys (source = value -> target, how), the ones not mapped with the
    reason, the refused ones, then conflicts, what to do before applying the job (Hub ids, Secrets) and
    the importer's own decisions."""
    mapped = [r for r in result.rows if r.target is not None]
    dropped = [r for r in result.rows if r.target is None and not r.refused]
    width = max((len(r.source) for r in result.rows), default=0)
    lines = [f"mapped ({len(mapped)} keys):"]
    for r in mapped:
        how = f"  ({r.note})" if r.note else ""
        lines.append(f"  {r.source:<{width}} = {r.value}  ->  {r.target or '(nothing to write)'}{how}")
    lines.append(f"not mapped ({len(dropped)} keys):")
    lines += [f"  {r.source:<{width}} = {r.value}: {r.note}" for r in dropped]
    sections = (
        ("refused (the import stops: asyncrl would train something else)", [
            f"{key}: {why}" for key, why in result.refused
        ]),
        ("conflicts (two keys, one field)", result.conflicts),
        ("before applying the job", result.flags),
        ("secrets (create them before applying the job; values are never shown)", result.secrets),
        ("decided by the importer", result.notes),
    )  # fmt: skip
    for title, items in sections:
        if items:
            lines.append(f"{title}:")
            lines += [f"  {item}" for item in items]
    return "\n".join(lines) + "\n"
