"""The API as a user meets it: every spec map, list and string has a bound (the apiserver's CEL cost
budget and a malformed spec's size depend on it), every doc the CRD cites is in the repo, the API table
of docs/api.md names every top-level spec field, and the constants the API mirrors from the workloads
agree."""

from __future__ import annotations

import pathlib
import re
from typing import Any

from asyncrl_api import config, infra, models
from asyncrl_operator import crdgen
from asyncrl_workloads.tasks import source

REPO = pathlib.Path(__file__).resolve().parents[2]


def _unbounded(node: dict[str, Any], path: str) -> list[str]:
    out = []
    kind = node.get("type")
    if kind == "string" and "maxLength" not in node and "enum" not in node:
        out.append(f"{path}: string without maxLength")
    if kind == "array" and "maxItems" not in node:
        out.append(f"{path}: list without maxItems")
    if isinstance(node.get("additionalProperties"), dict) and "maxProperties" not in node:
        out.append(f"{path}: map without maxProperties")
    if node.get("x-kubernetes-int-or-string") and "maxLength" not in node:
        out.append(f"{path}: int-or-string without maxLength")
    for name, prop in (node.get("properties") or {}).items():
        out += _unbounded(prop, f"{path}.{name}")
    for key, suffix in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(node.get(key), dict):
            out += _unbounded(node[key], path + suffix)
    return out


def test_every_map_list_and_string_of_the_spec_is_bounded() -> None:
    spec = crdgen.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert _unbounded(spec, "spec") == []


def test_every_doc_the_crd_cites_is_in_the_repo() -> None:
    text = crdgen.render_yaml()
    cited = set(re.findall(r"\bdocs/[\w./-]+\.md\b", text))
    assert cited, "the CRD cites docs/weight-sync.md"
    assert [doc for doc in cited if not (REPO / doc).is_file()] == []
    assert "design.md" not in text  # a file outside the repo


def test_the_api_page_table_names_every_top_level_spec_field() -> None:
    page = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    section = page.split("# The AsyncRLJob API", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1) for m in re.finditer(r"^\| `([A-Za-z]+)` \|", section, re.MULTILINE)}
    fields = {f.alias or name for name, f in models.AsyncRLJobSpec.model_fields.items()}
    assert fields - rows == set()
    assert rows - fields == set()


def test_mirrored_constants_match_their_source() -> None:
    assert infra.METRICS_PORT == config.DEFAULT_METRICS_PORT
    assert config.DEFAULT_TORCH_MASTER_PORT in infra.TRAINER_PORTS
    assert set(models.BUILTIN_TASKS) == set(source.BUILTIN_TASKS)
