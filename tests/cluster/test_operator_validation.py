"""Malformed AsyncRLJobs on the real apiserver: each is rejected with a field-level message (schema
bounds, enums, CEL rules, immutability, name length), or -- where the CRD leaves it to the operator --
accepted, marked InvalidSpec, and nothing is created."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from asyncrl_testing import cluster_wait, jobs, operator_proc
from asyncrl_testing.operator_proc import condition, get_json, job_status

pytestmark = pytest.mark.cluster

BASE, CASES = jobs.malformed_cases()
BY_APISERVER = [c for c in CASES if c["by"] == "apiserver"]
BY_OPERATOR = [c for c in CASES if c["by"] == "operator"]


@pytest.fixture(scope="module")
def operator(
    cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_proc.OperatorProcess]:
    with operator_proc.running(cluster, tmp_path_factory.mktemp("operator-validation")) as op:
        yield op


def _apply(cluster: Any, body: dict[str, Any]) -> Any:
    return cluster.kubectl("apply", "-f", "-", input=json.dumps(body), check=False)


def test_at_least_fifteen_malformed_specs_are_covered() -> None:
    assert len(CASES) >= 15


@pytest.mark.parametrize("case", BY_APISERVER, ids=[c["name"] for c in BY_APISERVER])
def test_apiserver_rejects_with_a_field_level_message(cluster, namespace, operator, case):
    body = jobs.make_job("bad", namespace, base=BASE, **case["patch"])
    done = _apply(cluster, body)
    assert done.returncode != 0, f"accepted: {case['name']}"
    field = case["field"]
    leaf = re.sub(r"\[\d+\]", "", field.rsplit(".", 1)[-1])
    assert leaf in done.stderr and "spec" in done.stderr, done.stderr
    assert get_json(cluster, "asyncrljob", "bad", "-n", namespace) == {}


@pytest.mark.parametrize("case", BY_OPERATOR, ids=[c["name"] for c in BY_OPERATOR])
def test_operator_marks_invalid_spec_and_creates_nothing(cluster, namespace, operator, case):
    body = jobs.make_job("bad", namespace, base=BASE, **case["patch"])
    done = _apply(cluster, body)
    assert done.returncode == 0, done.stderr
    status = cluster_wait.wait_until(
        lambda: job_status(cluster, namespace, "bad"),
        lambda st: condition(st, "InvalidSpec").get("status") == "True",
        "InvalidSpec True",
        timeout=30,
    )
    assert status["phase"] == "Failed" and case["field"] in condition(status, "InvalidSpec")["message"]
    items = get_json(
        cluster, "configmap,statefulset,service,role", "-n", namespace, "-l", "asyncrl.dev/job=bad"
    ).get("items")
    assert items == []


def test_over_long_name_is_rejected(cluster, namespace, operator):
    done = _apply(cluster, jobs.make_job("x" * 41, namespace))
    assert done.returncode != 0 and "metadata.name" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"trainer": {"backend": "megatron"}}, "trainer.backend"),
        ({"model": {"path": "/models/other"}}, "model.path"),
        ({"bus": {"nats": {"storage": "1Gi"}}}, "bus.nats.storage"),
    ],
)
def test_immutable_fields_cannot_change(cluster, namespace, operator, patch, field):
    assert _apply(cluster, jobs.make_job("stable", namespace)).returncode == 0
    done = _apply(cluster, jobs.make_job("stable", namespace, **patch))
    assert done.returncode != 0 and f"{field} is immutable" in done.stderr, done.stderr


def test_a_fixed_spec_recovers_from_invalid(cluster, namespace, operator):
    bad = jobs.make_job(
        "fixme", namespace, volumes=[{"name": "c", "claimName": "c", "mountPath": "/dev/shm"}]
    )
    assert _apply(cluster, bad).returncode == 0
    cluster_wait.wait_until(
        lambda: job_status(cluster, namespace, "fixme"),
        lambda st: st.get("phase") == "Failed",
        "Failed",
        timeout=30,
    )
    cluster.kubectl(
        "patch",
        "asyncrljob",
        "fixme",
        "-n",
        namespace,
        "--type=json",
        "-p",
        '[{"op":"remove","path":"/spec/volumes"}]',
    )
    status = cluster_wait.wait_until(
        lambda: job_status(cluster, namespace, "fixme"),
        lambda st: st.get("phase") == "Running",
        "Running",
        timeout=90,
    )
    assert condition(status, "InvalidSpec")["status"] == "False"
