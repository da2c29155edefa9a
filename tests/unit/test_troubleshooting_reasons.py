"""docs/troubleshooting.md documents every reason the operator can set: the conditions' reasons, the
job's REASON column, the autoscaler's decisions and Events, and the trackers' reasons it copies. The
reasons are collected from the code (the `reason` argument of every call that makes a condition, a
problem, a decision or an Event, and the module constants that list them), so a new one cannot go
undocumented."""

from __future__ import annotations

import ast
import pathlib
import re

from asyncrl_api import status as api_status
from asyncrl_operator import diagnose, failures

REPO = pathlib.Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "troubleshooting.md"
OPERATOR = REPO / "operator" / "asyncrl_operator"
SOURCES = [
    *(OPERATOR / f"{name}.py" for name in ("status", "failures", "diagnose", "reconcile", "autoscaler")),
    REPO / "operator" / "asyncrl_api" / "autoscale.py",  # the autoscaler's decisions
    REPO / "workloads" / "asyncrl_workloads" / "tracking" / "tracker.py",  # TrackingReady's, copied
]
# The position of the reason among each maker's positional arguments.
REASON_ARG = {"_cond": 2, "_problem": 1, "Problem": 1, "with_condition": 3, "_event": 3, "Decision": 1}
CAMEL = re.compile(r"^[A-Z][A-Za-z]+$")


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def reasons_in(source: str) -> set[str]:
    """Every CamelCase string the code passes as a reason, returns as one, or stores under "reason"."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _name(node.func) in REASON_ARG:
            at = REASON_ARG[_name(node.func)]
            args = [*node.args[at : at + 1], *(k.value for k in node.keywords if k.arg == "reason")]
            for arg in args:
                found |= _strings(arg)
        elif isinstance(node, ast.FunctionDef) and node.name in ("pressing", "classify"):
            returned = [n.value for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None]
            for value in returned:
                found |= _strings(value.elts[0] if isinstance(value, ast.Tuple) else value)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Attribute) and t.attr == "reason" for t in node.targets
        ):
            found |= _strings(node.value)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "reason" and value is not None:
                    found |= _strings(value)
    return {s for s in found if CAMEL.match(s)}


def all_reasons() -> set[str]:
    found = set().union(*(reasons_in(path.read_text()) for path in SOURCES))
    found |= {*diagnose.ENDPOINT_KINDS, *diagnose.WAITING_REASONS, *diagnose.ORDER, failures.BUDGET_EXHAUSTED}
    return found | set(api_status.PHASES)  # Ready's and Progressing's reason is the phase


def test_the_collector_finds_reasons_of_every_kind() -> None:
    found = all_reasons()
    for reason in ("SchedulingGated", "ApplyFailed", "ScaleUpUndone", "MaxReplicasUnschedulable", "Stalled"):
        assert reason in found
    assert "PodFailed" in found and "Unauthorized" in found and "Logging" in found
    code = '_cond("Ready", ok, "Aa" if ok else "Bb")\nst.reason = "Cc"\nx = {"reason": "Dd", "kind": "Ee"}'
    assert reasons_in(code) == {"Aa", "Bb", "Cc", "Dd"}


def test_every_reason_is_documented_on_the_troubleshooting_page() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert sorted(r for r in all_reasons() if f"`{r}`" not in page) == [], f"document them in {PAGE.name}"


def test_every_condition_type_is_in_the_table_of_every_reason() -> None:
    section = PAGE.read_text(encoding="utf-8").split("### Every reason the operator sets", 1)[1]
    section = section.split("\n### ", 1)[0]
    assert [t for t in api_status.CONDITION_TYPES if f"`{t}`" not in section] == []


def test_each_symptom_of_the_seeds_list_has_a_section() -> None:
    headings = re.findall(r"^### (.+)$", PAGE.read_text(encoding="utf-8"), re.MULTILINE)
    for symptom in ("401", "Connection refused", "without `choices`", "OAuth", "Weight sync", "agent loop"):
        assert any(symptom in h for h in headings), symptom
