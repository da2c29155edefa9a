"""The base every API model derives from, and the CEL-rule helpers the models attach to themselves.

Imported by every module of ``asyncrl_api``. A rule is written once here as a pair: a CEL expression
that the CRD carries (``x-kubernetes-validations``, checked by the apiserver) and a Python predicate
that pydantic runs (so the local runner and the operator's handler reject the same specs without an
apiserver). ``asyncrl_operator.crdgen`` copies the CEL half into the schema; the cluster tests prove
that both halves reject the same malformed specs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pydantic
import pydantic.alias_generators


class APIModel(pydantic.BaseModel):
    """camelCase in YAML/JSON, snake_case in Python, unknown fields rejected, docstrings as descriptions."""

    model_config = pydantic.ConfigDict(
        extra="forbid",
        populate_by_name=True,
        alias_generator=pydantic.alias_generators.to_camel,
        use_attribute_docstrings=True,
        validate_default=False,
    )

    def to_api(self) -> dict[str, Any]:
        """The object as the Kubernetes API and the ConfigMap see it: camelCase, no ``None`` fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


@dataclasses.dataclass(frozen=True)
class Rule:
    """One cross-field rule on one model: the CEL text for the CRD and the same check in Python.

    ``cel`` is evaluated with ``self`` bound to the model's object (and ``oldSelf`` for transition
    rules); ``check`` gets the validated model and returns True when the rule holds. ``field_path``
    is the JSONPath (relative to the model) the apiserver names in its error, so users see which field
    is wrong. Transition rules (immutability) have ``check=None``: Python never sees the old object.
    """

    cel: str
    message: str
    field_path: str | None = None
    check: Callable[[Any], bool] | None = None

    def to_cel(self) -> dict[str, str]:
        """The ``x-kubernetes-validations`` entry."""
        entry = {"rule": self.cel, "message": self.message}
        if self.field_path:
            entry["fieldPath"] = self.field_path
        return entry


RULES_KEY = "x-kubernetes-validations"


def cel_extra(*rules: Rule) -> dict[str, Any]:
    """``json_schema_extra`` for a model or field: its CEL rules, ready for the CRD generator."""
    return {RULES_KEY: [rule.to_cel() for rule in rules]}


def immutable(what: str) -> dict[str, Any]:
    """``json_schema_extra`` for a field that may not change once the job exists (a CEL transition rule)."""
    return cel_extra(Rule(cel="self == oldSelf", message=f"{what} is immutable"))


def check_rules(model: pydantic.BaseModel, rules: tuple[Rule, ...]) -> None:
    """Raise ``ValueError`` naming the field and message of the first rule the model breaks.

    Called from each model's ``model_validator(mode="after")``; pydantic wraps the error into a
    ``ValidationError`` whose location is the model, and the message carries the field path.
    """
    for rule in rules:
        if rule.check is not None and not rule.check(model):
            where = f"{rule.field_path}: " if rule.field_path else ""
            raise ValueError(f"{where}{rule.message}")
