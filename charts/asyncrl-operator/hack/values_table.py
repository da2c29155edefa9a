"""Writes the values table of charts/asyncrl-operator/README.md from values.yaml (helm-docs style).

Each documented key in values.yaml has a `# -- description` comment (continued on following `#` lines)
right above it; the table lists key, type, default and that description. Run by hand after editing
values.yaml: `python charts/asyncrl-operator/hack/values_table.py`; tests/unit/test_chart.py fails when
the README's table is out of date. Called by nothing else.
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import yaml

CHART = pathlib.Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- values-table:begin -->", "<!-- values-table:end -->"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):")


def documented_keys(text: str) -> list[tuple[str, str]]:
    """(dotted key, description) for every key with a `# --` comment, in file order."""
    out: list[tuple[str, str]] = []
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#") and pending is not None:
            pending.append(stripped[1:].strip())
            continue
        match = KEY.match(line)
        if not match:
            if not stripped:
                pending = None
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        if pending is not None:
            out.append((".".join(k for _, k in stack), " ".join(pending)))
        pending = None
    return out


def lookup(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        node = node[part]
    return node


def table() -> str:
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    rows = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    for key, doc in documented_keys(text):
        value = lookup(values, key)
        kind = {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "object"}[
            type(value)
        ]
        default = json.dumps(value, separators=(",", ":")).replace("|", "\\|")
        doc = doc.replace("|", "\\|")
        rows.append(f"| `{key}` | {kind} | `{default}` | {doc} |")
    return "\n".join(rows)


def readme_with_table(readme: str) -> str:
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


if __name__ == "__main__":
    path = CHART / "README.md"
    path.write_text(readme_with_table(path.read_text()))
    print(f"wrote {path}")
