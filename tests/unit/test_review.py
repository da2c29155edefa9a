"""Static review with kube-score (v1.20.0, tools/build-cluster-bins.sh kubescore) of what a user installs
and what the operator creates: `helm template` of the chart (default and all-on) and `render()` of every
example job. No CRITICAL finding may remain unless it is ignored where it is decided:

- a `kube-score/ignore` annotation set by the builder that chooses it, with the reason beside it
  (`render.pods.REVIEW_IGNORES`, `render.nats.REVIEW_IGNORES`, the chart's Deployment), or
- `ALLOWED` below, for the one check whose annotation cannot be used: ignoring `container-resources`
  also ignores the ephemeral-storage check (kube-score's implied ignores), which must stay on.

A check that kube-score skips because of an annotation must still find something to skip: an ignore
that no longer hides a finding is stale and fails too, so ignores cannot pile up unseen.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml
from asyncrl_api import models
from asyncrl_operator import render
from asyncrl_testing import chart, cluster_bins, jobs

ALL_ON = [
    "metrics.serviceMonitor.enabled=true",
    "metrics.podMonitor.enabled=true",
    "prometheusRule.enabled=true",
]
CRITICAL = 1
KUBERNETES_VERSION = "v1.37"
ALLOWED: dict[tuple[str, str, str], str] = {
    (kind, role, "container-resources"): (
        f"cpu and memory of the {role} come from spec.{role}.resources: the user's to size for the model "
        "(a vLLM engine's or an FSDP rank's memory, a CPU limit that would throttle the engine); the "
        "operator adds only GPUs and ephemeral storage"
    )
    for kind in ("StatefulSet",)
    for role in ("rollout", "trainer")
} | {
    ("Deployment", "agent", "container-resources"): (
        "cpu and memory of the agent workers come from spec.agent.workers.resources: the user's to size "
        "for their own agent program; the operator adds only ephemeral storage"
    )
}


def kube_score(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    try:
        binary = cluster_bins.kube_score()
    except cluster_bins.MissingBinaries as exc:
        pytest.fail(str(exc))
    done = subprocess.run(
        [str(binary), "score", "-o", "json", "--kubernetes-version", KUBERNETES_VERSION, "-"],
        input=yaml.safe_dump_all(documents, sort_keys=True),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode not in (0, 1):  # 1: it found something; anything else: it did not run
        raise AssertionError(f"kube-score failed ({done.returncode}): {done.stderr}")
    result: list[dict[str, Any]] = json.loads(done.stdout)
    return result


def findings(documents: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(CRITICAL findings not allowed, ignore annotations that hide nothing)."""
    critical, stale = [], []
    for obj in kube_score(documents):
        kind, name = obj["type_meta"]["kind"], obj["object_meta"]["name"]
        role = (obj["object_meta"].get("labels") or {}).get("app.kubernetes.io/component", "")
        for check in obj["checks"]:
            check_id = check["check"]["id"]
            if check["skipped"]:
                continue
            if check["grade"] == CRITICAL and (kind, role, check_id) not in ALLOWED:
                details = "; ".join(f"{c['path']}: {c['summary']}" for c in check["comments"] or [])
                critical.append(f"{kind}/{name} {check_id}: {details}")
    for i, doc in enumerate(documents):
        ignored = ((doc["metadata"].get("annotations") or {}).get("kube-score/ignore") or "").split(",")
        for check_id in filter(None, ignored):
            if not _finds(documents, i, check_id):
                stale.append(
                    f"{doc['kind']}/{doc['metadata']['name']} ignores {check_id}, which finds nothing"
                )
    return critical, stale


def _finds(documents: list[dict[str, Any]], index: int, check_id: str) -> bool:
    """Whether kube-score finds anything below OK for ``check_id`` on ``documents[index]`` once that
    object's ignore annotation is gone (the other objects as they are: some checks look across them)."""
    bare = json.loads(json.dumps(documents))
    doc = bare[index]
    doc["metadata"]["annotations"].pop("kube-score/ignore")
    for obj in kube_score(bare):
        if (obj["type_meta"]["kind"], obj["object_meta"]["name"]) != (doc["kind"], doc["metadata"]["name"]):
            continue
        for check in obj["checks"]:
            if check["check"]["id"] == check_id and not check["skipped"] and check["grade"] < 10:
                return True
    return False


def _example(example: str) -> list[dict[str, Any]]:
    body = jobs.load_example(example, namespace="team-a")
    body["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    return render.render(models.AsyncRLJob.model_validate(body))


@pytest.mark.parametrize("example", sorted(p.name for p in jobs.EXAMPLES.glob("*.yaml")))
def test_rendered_job_has_no_unexplained_critical_finding(example: str) -> None:
    critical, stale = findings(_example(example))
    assert critical == [] and stale == []


@pytest.mark.parametrize("sets", [[], ALL_ON], ids=["default", "all-on"])
def test_chart_has_no_unexplained_critical_finding(sets: list[str]) -> None:
    critical, stale = findings(chart.render(sets))
    assert critical == [] and stale == []


def test_the_review_catches_an_unhardened_pod() -> None:
    """The review is live: a rollout without its security context and probes is flagged."""
    objects = _example("tiny-cpu.yaml")
    rollout = next(
        o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "tiny-rollout"
    )
    container = rollout["spec"]["template"]["spec"]["containers"][0]
    del container["securityContext"], container["livenessProbe"]
    critical, _ = findings(objects)
    assert any("container-security-context" in f for f in critical), critical
