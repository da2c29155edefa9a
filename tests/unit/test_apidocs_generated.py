"""The committed API reference (docs/reference/api.md) is exactly what the models generate, as
test_crd_generated.py checks crds/: every spec and status field, with its type, bounds and rules."""

from __future__ import annotations

import pathlib

from asyncrl_api import models
from asyncrl_operator import apidocs, crdgen

REPO = pathlib.Path(__file__).resolve().parents[2]
COMMITTED = REPO / apidocs.OUTPUT


def test_committed_reference_matches_the_models() -> None:
    assert COMMITTED.read_text(encoding="utf-8") == apidocs.render_markdown(), f"run: {apidocs.COMMAND}"


def test_check_mode_reports_drift(tmp_path: pathlib.Path) -> None:
    stale = tmp_path / "api.md"
    stale.write_text("# old\n")
    assert apidocs.main(["--check", "--output", str(stale)]) == 1
    apidocs.main(["--output", str(stale)])
    assert apidocs.main(["--check", "--output", str(stale)]) == 0


def test_every_top_level_spec_field_and_every_cel_message_is_on_the_page() -> None:
    text = apidocs.render_markdown()
    spec = models.AsyncRLJobSpec.model_fields
    assert [f.alias or n for n, f in spec.items() if f"- **`{f.alias or n}`**" not in text] == []
    schema = crdgen.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            rules.extend(r["rule"] for r in node.get("x-kubernetes-validations", []))
            for value in node.values():
                walk(value)

    walk(schema)
    assert rules and [r for r in rules if f"`{r}`" not in text and r != "self == oldSelf"] == []


def test_a_field_line_shows_type_default_bounds_and_rules() -> None:
    node = {
        "type": "integer", "default": 1, "minimum": 0, "maximum": 8, "exclusiveMaximum": True,
        "description": "Replicas, e.g. tp * pp.",
        "x-kubernetes-validations": [{"rule": "self == oldSelf"}, {"rule": "self > 0", "message": "[x] > 0"}],
    }  # fmt: skip
    assert apidocs.field_line("replicas", node, "spec.replicas", required=True) == (
        "- **`replicas`** (integer; required; default `1`; ≥ 0; < 8; immutable) — Replicas, e.g. tp \\* pp."
        " Rules: \\[x\\] > 0: `self > 0`."
    )
    assert apidocs.anchor("spec.trainer.lora") == "spectrainerlora"
