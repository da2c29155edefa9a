"""Is this body a job the operator will run? The one admission check, with field-level messages.

Called by ``reconcile`` for every job it reads (an invalid one gets InvalidSpec and no children) and by
``asyncrl render`` (``asyncrl_workloads.cli``), which prints the same messages for a job file before it
is ever applied. Pure: no I/O. The checks are the API models' (pydantic types, bounds and the cross-field
rules that the CRD carries as CEL) plus the name rule of ``lifecycle.name_problem``; what the apiserver
checks beyond them (the kind, the API version) is ``check_kind``'s, which only ``asyncrl render`` needs
(the operator reads only AsyncRLJobs).
"""

from __future__ import annotations

from typing import Any

import pydantic
from asyncrl_api import models

from asyncrl_operator import lifecycle

Body = dict[str, Any]


def format_validation_error(exc: pydantic.ValidationError) -> str:
    """Field-level messages: ``spec.trainer.parallelism: tp * pp * cp must divide ...``."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        # Cross-field rules name their field relative to the model: ".parallelism.tp: ...".
        lines.append(f"{where}{msg}" if msg.startswith(".") else f"{where}: {msg}")
    return "; ".join(lines)


def check_kind(body: Any) -> str | None:
    """What the apiserver would say of a document that is not an AsyncRLJob of this API version."""
    if not isinstance(body, dict):
        return "expected a mapping (an AsyncRLJob object)"
    kind, version = body.get("kind"), body.get("apiVersion")
    if kind != models.KIND:
        return f"kind: expected {models.KIND}, got {kind!r}"
    if version != models.API_VERSION:
        return f"apiVersion: expected {models.API_VERSION}, got {version!r}"
    if not isinstance(body.get("spec"), dict):
        return "spec: required"
    return None


def parse(body: Body) -> tuple[models.AsyncRLJob | None, str | None]:
    """The validated job, or None and the reason it is invalid."""
    meta = body.get("metadata") or {}
    problem = lifecycle.name_problem(str(meta.get("name", "")))
    if problem:
        return None, problem
    try:
        return models.AsyncRLJob.from_body(body), None
    except pydantic.ValidationError as exc:
        return None, format_validation_error(exc)
