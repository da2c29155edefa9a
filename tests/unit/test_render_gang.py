"""spec.scheduling rendered for gang schedulers and Kueue: which PodGroup (if any), which pod labels and
annotations, the gang's minResources, and how apply/reconcile key the two PodGroup kinds. The objects
are applied against the real CRDs in tests/cluster/test_gang.py."""

from __future__ import annotations

from typing import Any

import pytest
from asyncrl_api import models
from asyncrl_operator import apply, render
from asyncrl_operator.render import gang
from asyncrl_testing import jobs

TRAINER = {
    "replicas": 2,
    "gpusPerReplica": 4,
    "resources": {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}},
}


def _job(scheduling: dict[str, Any], trainer: dict[str, Any] | None = None) -> models.AsyncRLJob:
    trainer = trainer or TRAINER
    cpu_only: dict[str, Any] = {
        "weightSync": {"backend": "gloo"},
        "rollout": {"gpusPerReplica": 0},
    }  # nccl needs GPUs
    sync = {} if trainer["gpusPerReplica"] else cpu_only
    body = jobs.make_job("demo", "ns", scheduling=scheduling, trainer=trainer, **sync)
    body["metadata"]["uid"] = "uid-1"
    return models.AsyncRLJob.model_validate(body)


def _objects(job: models.AsyncRLJob) -> dict[tuple[str, str], dict[str, Any]]:
    return {(render.kind_key(o), o["metadata"]["name"]): o for o in render.render(job)}


def _template(objects: dict[tuple[str, str], dict[str, Any]], role: str) -> dict[str, Any]:
    template: dict[str, Any] = objects[("StatefulSet", f"demo-{role}")]["spec"]["template"]["metadata"]
    return template


def _pod_groups(objects: dict[tuple[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects.values() if o["kind"] == "PodGroup"]


def test_coscheduling_gets_its_pod_group_and_the_trainer_pods_name_it() -> None:
    objects = _objects(_job({"schedulerName": "scheduler-plugins-scheduler"}))
    group = objects[("PodGroup.scheduling.x-k8s.io", "demo-trainer")]
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["spec"] == {
        "minMember": 2,
        "minResources": {"cpu": "1", "memory": "2147483648", "nvidia.com/gpu": "8"},
    }
    assert group["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert _template(objects, "trainer")["labels"]["scheduling.x-k8s.io/pod-group"] == "demo-trainer"
    assert "scheduling.x-k8s.io/pod-group" not in _template(objects, "rollout")["labels"]
    order = list(objects)  # render order: the group before the pods that name it
    assert order.index(("PodGroup.scheduling.x-k8s.io", "demo-trainer")) < order.index(
        ("StatefulSet", "demo-trainer")
    )


def test_volcano_gets_its_pod_group_and_the_group_name_annotation() -> None:
    objects = _objects(_job({"schedulerName": "volcano", "priorityClassName": "high"}))
    group = objects[("PodGroup.scheduling.volcano.sh", "demo-trainer")]
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"]["minMember"] == 2 and group["spec"]["priorityClassName"] == "high"
    assert group["spec"]["queue"] == "default"
    trainer = _template(objects, "trainer")
    assert trainer["annotations"]["scheduling.k8s.io/group-name"] == "demo-trainer"
    assert "scheduling.x-k8s.io/pod-group" not in trainer["labels"]
    assert "scheduling.k8s.io/group-name" not in _template(objects, "rollout")["annotations"]


@pytest.mark.parametrize(
    "scheduling",
    [{}, {"schedulerName": "my-scheduler"}, {"schedulerName": "volcano", "gang": False}],
    ids=["default-scheduler", "other-scheduler", "gang-off"],
)
def test_no_pod_group_without_a_known_gang_scheduler(scheduling: dict[str, Any]) -> None:
    objects = _objects(_job(scheduling))
    assert _pod_groups(objects) == []
    trainer = _template(objects, "trainer")
    assert not [k for k in {**trainer["labels"], **trainer["annotations"]} if "group" in k]


def test_kueue_queues_the_trainer_statefulset_as_one_group_and_each_rollout_pod_alone() -> None:
    objects = _objects(_job({"queueName": "team-a"}))
    trainer = objects[("StatefulSet", "demo-trainer")]
    assert trainer["metadata"]["labels"][gang.KUEUE_QUEUE_NAME] == "team-a"  # Kueue's StatefulSet integration
    assert gang.KUEUE_QUEUE_NAME not in _template(objects, "trainer")["labels"]  # Kueue labels its pods
    assert _template(objects, "rollout")["labels"][gang.KUEUE_QUEUE_NAME] == "team-a"  # pod integration
    assert gang.KUEUE_QUEUE_NAME not in objects[("StatefulSet", "demo-rollout")]["metadata"]["labels"]
    assert _pod_groups(objects) == []


def test_kueue_without_gang_queues_each_trainer_pod_alone() -> None:
    objects = _objects(_job({"queueName": "team-a", "gang": False}))
    assert _template(objects, "trainer")["labels"][gang.KUEUE_QUEUE_NAME] == "team-a"
    assert gang.KUEUE_QUEUE_NAME not in objects[("StatefulSet", "demo-trainer")]["metadata"]["labels"]


@pytest.mark.parametrize(
    ("resources", "gpus", "expected"),
    [
        ({}, 0, {}),
        ({"requests": {"cpu": "1.5"}}, 1, {"cpu": "4500m", "nvidia.com/gpu": "3"}),
        (
            {"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi", "cpu": "2"}},
            0,
            {"memory": "3221225472", "cpu": "6"},
        ),
    ],
)
def test_min_resources_is_the_whole_gangs_requests(
    resources: dict[str, Any], gpus: int, expected: dict[str, str]
) -> None:
    job = _job({"schedulerName": "volcano"}, {"replicas": 3, "gpusPerReplica": gpus, "resources": resources})
    assert gang.min_resources(job) == expected


def test_every_optional_child_and_pod_group_has_a_rest_path() -> None:
    for kind, name in render.optional("demo"):
        assert apply.path(kind, "ns", name).endswith(f"/namespaces/ns/{apply.PLURALS[kind]}/{name}")
    assert (
        apply.path("PodGroup.scheduling.volcano.sh", "ns", "g")
        == "/apis/scheduling.volcano.sh/v1beta1/namespaces/ns/podgroups/g"
    )
    assert (
        apply.path("PodGroup.scheduling.x-k8s.io", "ns", "g")
        == "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups/g"
    )
