"""spec.scheduling.gang with a gang scheduler, on the real control plane: the operator's PodGroup for
scheduler-plugins' coscheduling and for Volcano is stored whole by those projects' real CRDs (nothing
pruned as unknown), the trainer pods name it, a schedulerName change swaps one PodGroup for the other,
and the job owns it (its controller ownerReference: garbage collection deletes it with the job). The CRDs
come from tools/build-cluster-bins.sh gangcrds. Kueue's real gang admission: test_gang_kueue.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from asyncrl_api import models
from asyncrl_operator import render
from asyncrl_testing import cluster_wait, gang_bins, jobs, operator_proc
from asyncrl_testing.operator_proc import get_json, pods

pytestmark = pytest.mark.cluster

COSCHEDULING = "scheduler-plugins-scheduler"
GROUPS = {COSCHEDULING: "podgroups.scheduling.x-k8s.io", "volcano": "podgroups.scheduling.volcano.sh"}


@pytest.fixture(scope="module")
def operator(
    cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_proc.OperatorProcess]:
    gang_bins.install_pod_group_crds(cluster)
    with operator_proc.running(cluster, tmp_path_factory.mktemp("operator"), resync_seconds=3.0) as op:
        yield op


def job_body(namespace: str, scheduler: str) -> dict[str, Any]:
    trainer = {"replicas": 2, "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}
    return jobs.make_job("gang", namespace, trainer=trainer, scheduling={"schedulerName": scheduler})


def rendered_group(body: dict[str, Any], uid: str) -> dict[str, Any]:
    job = models.AsyncRLJob.model_validate({**body, "metadata": {**body["metadata"], "uid": uid}})
    return next(o for o in render.render(job) if o["kind"] == "PodGroup")


def stored_group(cluster: Any, namespace: str, scheduler: str) -> Any:
    return cluster_wait.wait_until(
        lambda: get_json(cluster, GROUPS[scheduler], "gang-trainer", "-n", namespace),
        bool,
        f"the {GROUPS[scheduler]} gang-trainer",
        timeout=60,
    )


def gone(cluster: Any, namespace: str, scheduler: str) -> None:
    cluster_wait.wait_until(
        lambda: get_json(cluster, GROUPS[scheduler], "gang-trainer", "-n", namespace),
        lambda found: not found,
        f"{GROUPS[scheduler]} gang-trainer deleted",
        timeout=60,
    )


def trainer_pod_meta(cluster: Any, namespace: str) -> list[Any]:
    return cluster_wait.wait_until(
        lambda: [p["metadata"] for p in pods(cluster, namespace, "gang", "trainer")],
        lambda metas: len(metas) == 2,
        "2 trainer pods of gang",
        timeout=60,
    )


def test_pod_groups_are_stored_whole_by_the_real_crds_swap_with_the_scheduler_and_go_with_the_job(
    cluster: Any, operator: Any, namespace: str
) -> None:
    body = job_body(namespace, "volcano")
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
    uid = get_json(cluster, "asyncrljob", "gang", "-n", namespace)["metadata"]["uid"]
    volcano = stored_group(cluster, namespace, "volcano")
    assert (
        volcano["spec"]
        == rendered_group(body, uid)["spec"]
        == {
            "minMember": 2,
            "minResources": {"cpu": "1", "memory": "2147483648", "nvidia.com/gpu": "2"},
            "queue": "default",
        }
    )
    assert volcano["metadata"]["ownerReferences"][0]["uid"] == uid
    assert all(
        m["annotations"]["scheduling.k8s.io/group-name"] == "gang-trainer"
        for m in trainer_pod_meta(cluster, namespace)
    )

    body = job_body(namespace, COSCHEDULING)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
    coscheduling = stored_group(cluster, namespace, COSCHEDULING)
    assert coscheduling["spec"] == rendered_group(body, uid)["spec"]
    gone(cluster, namespace, "volcano")  # pruned: the spec no longer renders it
    # The pods pick it up on the StatefulSet's rolling update, which needs a scheduler that binds them.
    template = get_json(cluster, "statefulset", "gang-trainer", "-n", namespace)["spec"]["template"]
    assert template["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "gang-trainer"
    assert template["spec"]["schedulerName"] == COSCHEDULING
    # Owned by the job as its controller: garbage collection deletes it with the job. (Waiting for that here
    # would wait for the collector's next discovery of the just-installed CRD, up to 30 s.)
    assert coscheduling["metadata"]["ownerReferences"] == volcano["metadata"]["ownerReferences"]
    assert volcano["metadata"]["ownerReferences"][0]["controller"] is True
