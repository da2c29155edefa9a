"""Builders for AsyncRLJob test objects (operator engineer's addition; used by unit and cluster tests).

body = jobs.make_job("demo", "ns", rollout={"replicas": 2})   # a dict ready for kubectl apply
job = jobs.parse(body)                                         # the validated pydantic model
"""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
MALFORMED = REPO / "tests" / "unit" / "golden" / "malformed.yaml"

# A small job that fits the test cluster's kwok GPU nodes (8 GPUs each) and validates.
BASE_SPEC: dict[str, Any] = {
    "model": {"path": "/models/tiny", "dtype": "float32"},
    "rollout": {"replicas": 2, "gpusPerReplica": 1},
    "trainer": {"replicas": 2, "gpusPerReplica": 1},
    "data": {"prompts": "builtin:say_char", "format": "raw"},
}


def deep_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``patch`` recursively; a ``None`` in the patch deletes the key."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def make_job(
    name: str = "demo", namespace: str = "default", base: dict[str, Any] | None = None, **spec_patch: Any
) -> dict[str, Any]:
    """An AsyncRLJob body: ``BASE_SPEC`` (or ``base``) deep-merged with ``spec_patch``."""
    spec = deep_merge(base if base is not None else BASE_SPEC, spec_patch)
    return {
        "apiVersion": "asyncrl.dev/v1alpha1",
        "kind": "AsyncRLJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def load_example(file_name: str, namespace: str = "default") -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / file_name).read_text())
    body["metadata"]["namespace"] = namespace
    return body


def malformed_cases() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(base spec, cases) from tests/unit/golden/malformed.yaml."""
    data = yaml.safe_load(MALFORMED.read_text())
    return data["base"], data["cases"]


def to_yaml(body: dict[str, Any]) -> str:
    return yaml.safe_dump(body, sort_keys=False)


LOCAL_CONFIG_PATH = pathlib.Path("/runs/x/job.json")


def expand_locally(body: dict[str, Any]) -> tuple[list[dict[str, Any]], Any, list[Any]]:
    """What the local runner makes of a job body, without running anything: the rendered manifests, the
    localized config (NATS and the trainer's ports on 127.0.0.1, fixed) and the `LocalPod`s, with
    metrics ports counted from 40000 and the config at `LOCAL_CONFIG_PATH`."""
    import itertools

    from asyncrl_api import models
    from asyncrl_operator import render
    from asyncrl_workloads.local import pods

    manifests = render.render(models.AsyncRLJob.model_validate(body))
    cfg = pods.localize_config(pods.job_json(manifests), "nats://127.0.0.1:4333", 31001, 31002, 31003)
    ports = itertools.count(40000)
    return manifests, cfg, list(pods.expand(manifests, LOCAL_CONFIG_PATH, cfg, lambda: next(ports)))
