"""Generate the AsyncRLJob API reference (``docs/reference/api.md``) from the CRD the models make.

Run as ``python -m asyncrl_operator.apidocs`` (``--check`` exits 1 when the committed page differs);
``tests/unit/test_apidocs_generated.py`` diffs it as ``test_crd_generated.py`` diffs ``crds/``. It reads
``crdgen.build_crd()``, so the page shows exactly what the apiserver holds: each field's type, default,
bounds, whether it is required or immutable, its CEL rules with their messages, and its description, in
the layout of the Kubernetes API reference (one section per object, one bullet per field). Pure text
from a dict: deterministic, no clock.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
from collections.abc import Iterator
from typing import Any

from asyncrl_api import models

from asyncrl_operator import crdgen

OUTPUT = pathlib.Path("docs") / "reference" / "api.md"
COMMAND = "python -m asyncrl_operator.apidocs"
MAX_DEFAULT = 100
"""A default longer than this (as JSON) is shown as "see its fields": the fields carry their own."""

Node = dict[str, Any]


def anchor(path: str) -> str:
    """The heading's anchor as GitHub and mkdocs both make it from "`spec.rollout`": punctuation dropped."""
    return re.sub(r"[^\w-]", "", path.lower())


def _object_of(node: Node) -> tuple[Node, str] | None:
    """The object a field holds (itself, a list's item, a map's value) and the suffix of its section."""
    if node.get("properties"):
        return node, ""
    items = node.get("items")
    if isinstance(items, dict) and items.get("properties"):
        return items, "[]"
    values = node.get("additionalProperties")
    if isinstance(values, dict) and values.get("properties"):
        return values, "{}"
    return None


def type_of(node: Node, path: str) -> str:
    """A field's type as the Kubernetes reference writes it, linking to the object's section."""
    if node.get("x-kubernetes-int-or-string"):
        return "int-or-string"
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return "any scalar"
    kind = node.get("type", "")
    held = _object_of(node)
    if held is not None:
        section = f"{path}{held[1]}"
        name = {"": "object", "[]": "[]object", "{}": "map[string]object"}[held[1]]
        return f"[{name}](#{anchor(section)})"
    if kind == "array":
        return f"[]{type_of(node.get('items') or {}, path + '[]')}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{type_of(node['additionalProperties'], path + '{}')}"
    if "enum" in node:
        return f"{kind}, one of " + ", ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    return str(kind or "object")


def _number(node: Node, key: str, flag: str, strict: str, loose: str) -> list[str]:
    if key not in node:
        return []
    return [f"{strict if node.get(flag) is True else loose} {node[key]}"]


def bounds_of(node: Node) -> list[str]:
    """Bounds and formats of a field (and of a list's items or a map's values)."""
    out = _number(node, "minimum", "exclusiveMinimum", ">", "≥")
    out += _number(node, "maximum", "exclusiveMaximum", "<", "≤")
    words = (
        ("minLength", "length ≥"), ("maxLength", "length ≤"), ("minItems", "items ≥"),
        ("maxItems", "items ≤"), ("minProperties", "keys ≥"), ("maxProperties", "keys ≤"),
    )  # fmt: skip
    out += [f"{word} {node[key]}" for key, word in words if key in node]
    if "pattern" in node:
        out.append(f"pattern `{node['pattern']}`")
    if "format" in node:
        out.append(f"format {node['format']}")
    for key, what in (("items", "each item"), ("additionalProperties", "each value")):
        inner = node.get(key)
        if isinstance(inner, dict) and not inner.get("properties"):
            out += [f"{what}: {b}" for b in bounds_of(inner)]
    return out


def prose(text: str) -> str:
    """Text from the models as Markdown shows it verbatim: ``*``, ``[``, ``]``, ``<`` and ``\\`` escaped
    outside its code spans (a CEL message's ``[a-z]([-a-z]*)`` is not a link, ``tp * pp`` not emphasis)."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        for char in ("\\", "*", "[", "]", "_"):
            parts[i] = parts[i].replace(char, "\\" + char)
        parts[i] = parts[i].replace("<", "&lt;")
    return "`".join(parts)


def _rules(node: Node) -> list[Node]:
    return list(node.get("x-kubernetes-validations") or [])


def _rule_text(rule: Node) -> str:
    where = f" (field `{rule['fieldPath']}`)" if rule.get("fieldPath") else ""
    message = prose(str(rule.get("message") or "must hold"))
    return f"{message}{where}: `{rule['rule']}`"


def field_line(name: str, node: Node, path: str, required: bool) -> str:
    """One field's bullet: name, type, default, bounds, required/immutable, rules, description."""
    facts = [type_of(node, path)]
    if required:
        facts.append("required")
    if "default" in node:
        text = json.dumps(node["default"], ensure_ascii=False)
        facts.append(f"default `{text}`" if len(text) <= MAX_DEFAULT else "default: see its fields")
    facts += bounds_of(node)
    rules = _rules(node)
    if any(r.get("rule") == "self == oldSelf" for r in rules):
        facts.append("immutable")
    line = f"- **`{name}`** ({'; '.join(facts)})"
    description = prose(str(node.get("description") or "").strip())
    if description:
        line += f" — {description}"
    extra = [r for r in rules if r.get("rule") != "self == oldSelf"]
    if extra:
        line += " Rules: " + "; ".join(_rule_text(r) for r in extra) + "."
    return line


def sections(node: Node, path: str) -> Iterator[list[str]]:
    """The section of the object at ``path``, then those of the objects its fields hold, depth first."""
    lines = [f"## `{path}`", ""]
    description = prose(str(node.get("description") or "").strip())
    if description:
        lines += [description, ""]
    rules = _rules(node)
    if rules:
        lines.append("Validation rules (CEL, checked by the apiserver; the message is what it answers):")
        lines += [f"- {_rule_text(r)}" for r in rules]
        lines.append("")
    required = set(node.get("required") or [])
    properties: dict[str, Node] = node.get("properties") or {}
    lines += [field_line(name, prop, f"{path}.{name}", name in required) for name, prop in properties.items()]
    yield lines
    for name, prop in properties.items():
        held = _object_of(prop)
        if held is not None:
            yield from sections(held[0], f"{path}.{name}{held[1]}")


def render_markdown() -> str:
    """The page's text."""
    crd = crdgen.build_crd()
    version = crd["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    head = [
        f"<!-- Generated by `{COMMAND}` from asyncrl_api.models (through the CRD). Do not edit. -->",
        "",
        f"# API reference: {models.KIND} ({models.GROUP}/{version['name']})",
        "",
        "Every field of the spec and the status, as the apiserver holds them in the CRD "
        f"(`{crdgen.OUTPUT.as_posix()}`): type, default, bounds, whether it is required or immutable, "
        "the CEL rules with the message the apiserver answers when one fails, and the description "
        "(`kubectl explain asyncrljob.spec.<field>` shows the same). What each group does, and what is "
        "refused: [the AsyncRLJob API](../api.md). Regenerate after changing the models: "
        f"`{COMMAND}`.",
        "",
    ]
    if _rules(root):
        head.append("Rules on the whole object:")
        head += [f"- {_rule_text(r)}" for r in _rules(root)]
        head.append("")
    body: list[str] = []
    for part in ("spec", "status"):
        for lines in sections(root["properties"][part], part):
            body += [*lines, ""]
    return "\n".join(head + body).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, verify) the reference page."""
    description = __doc__.splitlines()[0] if __doc__ else None
    return crdgen.write_or_check(argv, description, OUTPUT, render_markdown, COMMAND)


if __name__ == "__main__":
    sys.exit(main())
