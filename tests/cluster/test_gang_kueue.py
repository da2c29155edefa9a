"""Real gang admission with Kueue (sigs.k8s.io/kueue, StatefulSet and pod integrations) on the real
control plane: a job with scheduling.queueName whose trainer gang does not fit its ClusterQueue's GPU
quota waits whole (every trainer pod created, gated by Kueue, none bound to a node) while its rollout
pods, each its own workload, run; raising the quota admits the whole gang at once and both trainer pods
run; a failed trainer pod then restarts the gang through Kueue (the deleted pods released, the new ones
admitted); resizing the queued gang is refused by Kueue and the job says so (Degraded, ApplyFailed, with
Kueue's message). Kueue runs from tools/build-cluster-bins.sh kueue (asyncrl_testing.kueue)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from asyncrl_testing import cluster_wait, jobs, kueue, operator_proc
from asyncrl_testing.operator_proc import get_json, pods

pytestmark = pytest.mark.cluster

GATE = "kueue.x-k8s.io/admission"


@pytest.fixture(scope="module")
def operator(
    cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_proc.OperatorProcess]:
    with (
        kueue.running(cluster, tmp_path_factory.mktemp("kueue")),
        operator_proc.running(cluster, tmp_path_factory.mktemp("operator"), resync_seconds=3.0) as op,
    ):
        yield op


def live(items: list[Any]) -> list[Any]:
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def gated(pod: Any) -> bool:
    return GATE in [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def running(pod: Any) -> bool:
    return bool(pod["status"].get("phase") == "Running")


def explain(cluster: Any, namespace: str) -> str:
    return str(
        cluster.kubectl(
            "get", "pods,workloads,clusterqueues", "-n", namespace, "-o", "wide", check=False
        ).stdout
    )


def test_a_trainer_gang_that_does_not_fit_waits_whole_and_starts_whole_when_quota_appears(
    cluster: Any, operator: Any, namespace: str
) -> None:
    # 2 GPUs of quota: the two 1-GPU rollout pods fit, the 2 x 2-GPU trainer gang never does.
    cluster.kubectl("apply", "-f", "-", input=kueue.queues_yaml("team", namespace, gpus=2))
    body = jobs.make_job(
        "queued",
        namespace,
        trainer={"replicas": 2, "gpusPerReplica": 2},
        rollout={"replicas": 2, "gpusPerReplica": 1},
        scheduling={"queueName": "team"},
    )
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
    try:
        cluster_wait.wait_until(
            lambda: (
                live(pods(cluster, namespace, "queued", "rollout")),
                live(pods(cluster, namespace, "queued", "trainer")),
            ),
            lambda both: len(both[0]) == 2 and all(map(running, both[0])) and len(both[1]) == 2,
            "2 rollout pods Running and 2 trainer pods created",
            timeout=90,
        )
        time.sleep(3)  # time for a partial admission to show, were there one
        trainers = live(pods(cluster, namespace, "queued", "trainer"))
        waited = {p["metadata"]["uid"] for p in trainers}
        assert len(trainers) == 2 and all(gated(p) for p in trainers), [p["spec"] for p in trainers]
        assert not [p for p in trainers if p["spec"].get("nodeName") or running(p)]
        workloads = get_json(cluster, "workloads.kueue.x-k8s.io", "-n", namespace).get("items") or []
        gang = [w for w in workloads if sum(ps["count"] for ps in w["spec"]["podSets"]) == 2]
        assert len(gang) == 1 and not (gang[0].get("status") or {}).get("admission"), workloads
        waiting = cluster_wait.wait_until(  # what `kubectl describe arj` shows while the gang is queued
            lambda: operator_proc.condition(
                operator_proc.job_status(cluster, namespace, "queued"), "TrainerReady"
            ),
            lambda cond: cond.get("reason") == "SchedulingGated",
            "TrainerReady SchedulingGated",
            timeout=30,
        )
        assert GATE in waiting["message"] and waiting["message"].startswith("0/2 ready")

        cluster.kubectl("apply", "-f", "-", input=kueue.queues_yaml("team", namespace, gpus=6))
        trainers = cluster_wait.wait_until(
            lambda: live(pods(cluster, namespace, "queued", "trainer")),
            lambda ps: len(ps) == 2 and all(running(p) and not gated(p) for p in ps),
            "both trainer pods admitted and Running",
            timeout=90,
        )
        assert {p["metadata"]["uid"] for p in trainers} == waited  # the pods that waited, not new ones

        # A failed trainer pod restarts the whole gang (the operator deletes every trainer pod): Kueue lets
        # the deleted pods go and admits the new ones into the gang's workload.
        patch = {"status": {"phase": "Failed", "reason": "Error", "message": "simulated failure"}}
        name = trainers[1]["metadata"]["name"]
        cluster.kubectl(
            "patch",
            "pod",
            name,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(patch),
        )
        cluster_wait.wait_until(
            lambda: live(pods(cluster, namespace, "queued", "trainer")),
            lambda ps: (
                len(ps) == 2
                and all(running(p) for p in ps)
                and not {p["metadata"]["uid"] for p in ps} & waited
            ),
            "both trainer pods recreated and Running",
            timeout=90,
        )

        # Kueue holds a queued StatefulSet's replicas: resizing the running gang is refused, readably.
        resize = {"spec": {"trainer": {"replicas": 3}}}
        cluster.kubectl(
            "patch", "asyncrljob", "queued", "-n", namespace, "--type=merge", "-p", json.dumps(resize)
        )
        degraded = cluster_wait.wait_until(
            lambda: operator_proc.condition(
                operator_proc.job_status(cluster, namespace, "queued"), "Degraded"
            ),
            lambda cond: cond.get("reason") == "ApplyFailed",
            "Degraded ApplyFailed",
            timeout=60,
        )
        assert "StatefulSet" in degraded["message"] and "replicas" in degraded["message"], degraded
    except cluster_wait.WaitTimeout as exc:
        raise cluster_wait.WaitTimeout(f"{exc}\n{explain(cluster, namespace)}") from None
    finally:  # while Kueue runs: it removes its finalizers from the pods it manages
        cluster.kubectl("delete", "asyncrljob", "queued", "-n", namespace, "--wait=false", check=False)
        cluster_wait.wait_until(
            lambda: pods(cluster, namespace, "queued"),
            lambda left: not left,
            "the job's pods deleted",
            timeout=60,
        )
        cluster.kubectl("delete", "clusterqueue", f"{namespace}-team", "--wait=false", check=False)
