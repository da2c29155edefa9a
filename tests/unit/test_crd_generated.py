"""The committed CRD is exactly what the models generate, and it is a structural schema that teaches
every knob (`kubectl explain asyncrljob.spec.async`)."""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterator
from typing import Any

import yaml
from asyncrl_operator import crdgen

REPO = pathlib.Path(__file__).resolve().parents[2]
COMMITTED = REPO / crdgen.OUTPUT


def _schema() -> dict[str, Any]:
    version = crdgen.build_crd()["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _nodes(node: dict[str, Any], where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield where, node
    for name, child in (node.get("properties") or {}).items():
        yield from _nodes(child, f"{where}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _nodes(node["items"], f"{where}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{where}{{}}")


def test_committed_crd_matches_the_models() -> None:
    assert COMMITTED.read_text() == crdgen.render_yaml(), "run: python -m asyncrl_operator.crdgen"


def test_check_mode_reports_drift(tmp_path: pathlib.Path) -> None:
    stale = tmp_path / "crd.yaml"
    stale.write_text("# old\n")
    assert crdgen.main(["--check", "--output", str(stale)]) == 1
    crdgen.main(["--output", str(stale)])
    assert crdgen.main(["--check", "--output", str(stale)]) == 0


def test_schema_is_structural() -> None:
    for where, node in _nodes(_schema()):
        assert "$ref" not in node and "anyOf" not in node and "allOf" not in node, where
        special = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        assert "type" in node or special, f"{where} has no type"
        assert not ("properties" in node and "additionalProperties" in node), where
        assert "propertyNames" not in node, f"{where}: the apiserver refuses propertyNames (use CEL)"


def test_map_key_bounds_become_a_cel_rule() -> None:
    verdicts = _schema()["properties"]["spec"]["properties"]["reward"]["properties"]["judge"]["properties"]
    rules = [r["rule"] for r in verdicts["verdicts"]["x-kubernetes-validations"]]
    assert rules == ["self.all(k, size(k) >= 1 && size(k) <= 64)"]


def test_every_spec_and_status_field_has_a_description() -> None:
    missing = [w for w, n in _nodes(_schema()["properties"]["spec"], ".spec") if "description" not in n]
    missing += [w for w, n in _nodes(_schema()["properties"]["status"], ".status") if "description" not in n]
    missing = [w for w in missing if not w.endswith(("{}", "[]"))]
    assert missing == []


def test_bounds_enums_and_defaults_reach_the_schema() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    replicas = spec["rollout"]["properties"]["replicas"]
    assert (replicas["minimum"], replicas["default"]) == (0, 1)
    assert spec["mode"]["enum"] == ["async", "one-step-off", "sync"]
    assert spec["async"]["properties"]["queue"]["properties"]["whenFull"]["enum"] == ["dropOldest", "block"]
    assert spec["async"]["default"] == {
        "syncEverySteps": 1,
        "requireBatches": 1,
        "queue": {"maxSize": 512, "whenFull": "dropOldest"},
    }
    lr = spec["trainer"]["properties"]["optimizer"]["properties"]["lr"]
    assert lr["exclusiveMinimum"] is True and lr["minimum"] == 0.0
    assert spec["model"]["required"] == ["path"] and "status" not in _schema()["required"]


def test_cel_rules_cover_cross_field_and_immutable_fields() -> None:
    rules = [r["rule"] for _, n in _nodes(_schema()) for r in n.get("x-kubernetes-validations", [])]
    spec = _schema()["properties"]["spec"]["properties"]
    for immutable in (spec["model"]["properties"]["path"], spec["trainer"]["properties"]["backend"]):
        assert {"rule": "self == oldSelf"}.items() <= immutable["x-kubernetes-validations"][0].items()
    assert any("self.metadata.name" in r for r in rules)
    assert any("parallelism.tp" in r for r in rules)
    assert len(rules) >= 12


def test_subresources_printer_columns_and_names() -> None:
    crd = yaml.safe_load(COMMITTED.read_text())
    version = crd["spec"]["versions"][0]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.rollout.replicas"
    assert version["subresources"]["status"] == {}
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"]]
    assert columns == [
        "PHASE", "STEP", "POLICY-VER", "LAG", "QUEUE", "ROLLOUT", "TRAINER", "AGENTS", "REASON", "AGE"
    ]  # fmt: skip
    assert crd["spec"]["names"]["shortNames"] == ["arj"]


class _Yaml11Loader(yaml.SafeLoader):
    """Reads y/n/on/off as booleans, as kubectl's YAML reader (go-yaml v2) does."""

    bool_values = {**yaml.SafeLoader.bool_values, "y": True, "n": False}


_Yaml11Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N|yes|no|on|off)$"), list("yYnNo")
)


def test_kubectl_reads_the_crd_and_examples_as_we_wrote_them() -> None:
    assert yaml.load(COMMITTED.read_text(), Loader=_Yaml11Loader) == crdgen.build_crd()
    for example in (REPO / "examples").glob("*.yaml"):
        assert yaml.load(example.read_text(), Loader=_Yaml11Loader) == yaml.safe_load(example.read_text()), (
            example
        )
