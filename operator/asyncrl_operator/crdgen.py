"""Generate the AsyncRLJob CustomResourceDefinition from the pydantic models.

Run as ``python -m asyncrl_operator.crdgen`` (writes ``crds/asyncrl.dev_asyncrljobs.yaml``; ``--check``
exits 1 when the committed file differs). The drift unit test calls ``build_crd``; the helm chart copies
the file. Pydantic's JSON schema becomes a Kubernetes *structural* schema: ``$ref`` inlined,
``Optional`` turned into an omittable field, ``int | str`` into ``x-kubernetes-int-or-string``,
JSON-Schema 2020 bounds into OpenAPI 3.0 ones, sub-objects given their full default value (so the
apiserver fills in every default and ``kubectl get -o yaml`` shows the whole job), CEL rules kept.
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import re
import sys
import typing
from collections.abc import Callable
from typing import Any

import pydantic
import yaml
from asyncrl_api import models

OUTPUT = pathlib.Path("crds") / f"{models.GROUP}_{models.PLURAL}.yaml"
_DROP_KEYS = ("title", "additionalProperties", "$defs")
_SCALARS = {"string", "integer", "number", "boolean"}
_INT_OR_STRING_BOUNDS = ("minimum", "maximum", "maxLength", "pattern")

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Policy-Ver", "type": "integer", "jsonPath": ".status.progress.paramVersion"},
    {
        "name": "Lag",
        "type": "integer",
        "jsonPath": ".status.progress.staleness.max",
        "description": "Largest staleness (policy versions) among recently consumed samples",
    },
    {
        "name": "Queue",
        "type": "integer",
        "jsonPath": ".status.progress.queueDepth",
        "description": "Trajectories waiting in the bus",
    },
    {"name": "Rollout", "type": "string", "jsonPath": ".status.rollout.ready"},
    {"name": "Trainer", "type": "string", "jsonPath": ".status.trainer.ready"},
    {
        "name": "Agents",
        "type": "string",
        "jsonPath": ".status.agents.ready",
        "description": "Ready/desired agent worker pods (spec.agent.workers); empty without workers",
    },
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": ".status.reason",
        "description": "The most pressing problem (details in kubectl describe: conditions)",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

NAME_RULE = {
    "rule": f"size(self.metadata.name) <= {models.MAX_NAME_LENGTH}",
    "message": f"metadata.name may be at most {models.MAX_NAME_LENGTH} characters "
    "(child objects and pod names derive from it)",
}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline ``$ref``s recursively, keeping a local description over the referenced one."""
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        local = {k: v for k, v in node.items() if k != "$ref"}
        return _resolve({**target, **local}, defs)
    return {key: _resolve(value, defs) for key, value in node.items()}


def _key_rule(node: dict[str, Any]) -> None:
    """A map's key constraints (pydantic's ``propertyNames``, or ``patternProperties`` for keys with a
    pattern, which a structural schema may not hold) as a CEL rule on the map: the apiserver refuses the
    CRD with ``propertyNames: field not declared``."""
    keys = node.pop("propertyNames", None)
    patterns = node.pop("patternProperties", None)
    if isinstance(patterns, dict):  # pydantic's form for keys with a pattern: one pattern, the value schema
        ((pattern, value),) = patterns.items()
        node["additionalProperties"] = value
        keys = {**(keys if isinstance(keys, dict) else {}), "pattern": pattern}
    if not isinstance(keys, dict):
        return
    checks, words = [], []
    if "minLength" in keys:
        checks.append(f"size(k) >= {keys['minLength']}")
        words.append(f"at least {keys['minLength']} characters")
    if "maxLength" in keys:
        checks.append(f"size(k) <= {keys['maxLength']}")
        words.append(f"at most {keys['maxLength']} characters")
    if "pattern" in keys:
        checks.append(f"k.matches({json.dumps(keys['pattern'])})")
        words.append(f"matching {keys['pattern']}")
    if checks:
        rule = {"rule": f"self.all(k, {' && '.join(checks)})", "message": f"each key: {', '.join(words)}"}
        node.setdefault("x-kubernetes-validations", []).append(rule)


def _structural(node: dict[str, Any], with_defaults: bool) -> dict[str, Any]:
    """Turn one resolved pydantic schema node into a structural OpenAPI v3 node."""
    node = dict(node)
    if "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        types = {b.get("type") for b in branches}
        if len(branches) == 1:
            node = {**branches[0], **node}
        elif types == {"integer", "string"}:
            node["x-kubernetes-int-or-string"] = True
            for branch in branches:  # as controller-gen does for resource.Quantity; each applies to one type
                node.update({k: branch[k] for k in _INT_OR_STRING_BOUNDS if k in branch})
        elif types <= _SCALARS:
            node["x-kubernetes-preserve-unknown-fields"] = True
            for branch in branches:  # JSON Schema: maxLength bounds a string value and ignores the others
                node.update({k: branch[k] for k in ("maxLength",) if k in branch})
        else:
            raise ValueError(f"cannot express anyOf {branches} structurally")
    if isinstance(node.get("description"), str):
        node["description"] = " ".join(node["description"].split())
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in node and not isinstance(node[bound], bool):
            node[flag] = node.pop(bound)
            node[bound] = True
    _key_rule(node)
    additional = node.get("additionalProperties")
    for key in _DROP_KEYS:
        node.pop(key, None)
    if "default" in node and (node["default"] is None or not with_defaults):
        node.pop("default")
    if isinstance(additional, dict):
        node["additionalProperties"] = _structural(additional, with_defaults)
    if "items" in node:
        node["items"] = _structural(node["items"], with_defaults)
    if "properties" in node:
        node["properties"] = {
            name: _structural(prop, with_defaults) for name, prop in node["properties"].items()
        }
    return node


def _model_in(annotation: Any) -> type[pydantic.BaseModel] | None:
    """The pydantic model inside an annotation (``X``, ``X | None``, ``list[X]``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _fill_model_defaults(node: dict[str, Any], model: type[pydantic.BaseModel]) -> None:
    """Give every sub-object with a default (``default_factory=Model``) its full default value.

    A bare ``default: {}`` is not enough: the apiserver checks defaults against the CEL rules without
    defaulting inside them first, so a rule reading ``self.batch.prompts`` would fail on ``{}``.
    """
    for name, field in model.model_fields.items():
        prop = (node.get("properties") or {}).get(field.alias or name)
        if prop is None:
            continue
        if field.default_factory is not None:
            value = field.default_factory()  # type: ignore[call-arg]
            if isinstance(value, pydantic.BaseModel):
                prop["default"] = value.model_dump(mode="json", by_alias=True, exclude_none=True)
        sub = _model_in(field.annotation)
        if sub is not None:
            _fill_model_defaults(prop.get("items", prop), sub)


def model_schema(model: type[pydantic.BaseModel], with_defaults: bool) -> dict[str, Any]:
    """The structural schema of one model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema = _structural(_resolve(raw, raw.get("$defs", {})), with_defaults)
    if with_defaults:
        _fill_model_defaults(schema, model)
    return schema


def build_crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    spec = model_schema(models.AsyncRLJobSpec, with_defaults=True)
    status = model_schema(models.AsyncRLJobStatus, with_defaults=False)
    root = {
        "type": "object",
        "description": "AsyncRLJob runs fully asynchronous reinforcement learning of an LLM: rollout "
        "replicas generate with vLLM while a trainer gang updates the policy.",
        "required": ["spec"],
        "x-kubernetes-validations": [NAME_RULE],
        "properties": {
            "apiVersion": {"type": "string", "description": "API version (asyncrl.dev/v1alpha1)."},
            "kind": {"type": "string", "description": "Kind (AsyncRLJob)."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{models.PLURAL}.{models.GROUP}"},
        "spec": {
            "group": models.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": models.KIND,
                "listKind": f"{models.KIND}List",
                "plural": models.PLURAL,
                "singular": models.SINGULAR,
                "shortNames": list(models.SHORT_NAMES),
                "categories": ["all", "asyncrl"],
            },
            "versions": [
                {
                    "name": models.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.rollout.replicas",
                            "statusReplicasPath": ".status.rollout.replicas",
                            "labelSelectorPath": ".status.rollout.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Quotes y/Y/n/N: YAML 1.1 readers (kubectl's) take them for booleans; PyYAML would not quote them."""


_Dumper.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))


def render_yaml() -> str:
    """The CRD file's text."""
    header = "# Generated by `python -m asyncrl_operator.crdgen` from asyncrl_api.models. Do not edit.\n"
    return header + yaml.dump(build_crd(), Dumper=_Dumper, sort_keys=False, width=100)


def write_or_check(
    argv: list[str] | None,
    description: str | None,
    output: pathlib.Path,
    render: Callable[[], str],
    command: str,
) -> int:
    """A generated file's command line: write ``render()`` to --output, or with --check exit 1 (naming
    ``command``) when the committed file differs. Used by this module and apidocs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--output", type=pathlib.Path, default=output)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is not up to date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run {command}", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, verify) the CRD file."""
    description = __doc__.splitlines()[0] if __doc__ else None
    return write_or_check(argv, description, OUTPUT, render_yaml, "python -m asyncrl_operator.crdgen")


if __name__ == "__main__":
    sys.exit(main())
