"""How the trainer gang reaches a gang scheduler or an admission queue (spec.scheduling).

Called by ``render.render`` (the PodGroup object) and ``render.pods`` (StatefulSet and pod labels, pod
annotations).
Three systems, each told in its own documented vocabulary:

- scheduler-plugins' coscheduling (schedulerName ``scheduler-plugins-scheduler``, the name its
  second-scheduler install uses): a ``scheduling.x-k8s.io/v1alpha1`` PodGroup with minMember = trainer
  replicas, trainer pods labelled ``scheduling.x-k8s.io/pod-group``.
- Volcano (schedulerName ``volcano``): a ``scheduling.volcano.sh/v1beta1`` PodGroup (minMember,
  minResources, priorityClassName; Volcano's ``default`` queue), trainer pods annotated
  ``scheduling.k8s.io/group-name``.
- Kueue (scheduling.queueName, any scheduler): admission by quota. The trainer StatefulSet carries
  ``kueue.x-k8s.io/queue-name``: Kueue's StatefulSet integration makes its pods one serving pod group
  (Kueue labels them itself), admitted all or none, and takes its finalizers off pods the StatefulSet
  deletes (gang restart, suspend, job deletion). Each rollout pod carries the label itself and is its
  own workload (Kueue's pod integration): rollouts scale and are replaced one by one, which a Kueue
  StatefulSet, whose replicas Kueue holds fixed, would refuse. Kueue's webhook gates the pods until
  admission. With gang off, trainer pods are queued one by one like the rollouts.

PodGroups are owned by the job (garbage-collected with it). With gang off, or another scheduler
without a queue, nothing is declared: the trainer pods still start in parallel and a failed one
restarts the whole gang (``asyncrl_operator.pod_events``).
"""

from __future__ import annotations

import decimal
from typing import Any

import kubernetes
from asyncrl_api import models

from asyncrl_operator.render import names

COSCHEDULING_SCHEDULER = "scheduler-plugins-scheduler"
VOLCANO_SCHEDULER = "volcano"
VOLCANO_QUEUE = "default"
"""Volcano's queue for the gang (the one every Volcano install has; its CRD defaults to it too)."""
COSCHEDULING_GROUP = "scheduling.x-k8s.io"
VOLCANO_GROUP = "scheduling.volcano.sh"
COSCHEDULING_API_VERSION = f"{COSCHEDULING_GROUP}/v1alpha1"
VOLCANO_API_VERSION = f"{VOLCANO_GROUP}/v1beta1"
POD_GROUP_KIND = "PodGroup"

COSCHEDULING_POD_GROUP = "scheduling.x-k8s.io/pod-group"
VOLCANO_GROUP_NAME = "scheduling.k8s.io/group-name"
KUEUE_QUEUE_NAME = "kueue.x-k8s.io/queue-name"


def pod_group_api_version(job: models.AsyncRLJob) -> str | None:
    """The PodGroup apiVersion this job's gang scheduler reads, or None when none is declared."""
    sched = job.spec.scheduling
    if not sched.gang:
        return None
    return {COSCHEDULING_SCHEDULER: COSCHEDULING_API_VERSION, VOLCANO_SCHEDULER: VOLCANO_API_VERSION}.get(
        sched.scheduler_name or ""
    )


def statefulset_labels(job: models.AsyncRLJob, role: str) -> dict[str, str]:
    """Labels on a role's StatefulSet itself: Kueue's queue on the trainer gang's."""
    sched = job.spec.scheduling
    if role == names.TRAINER and sched.queue_name and sched.gang:
        return {KUEUE_QUEUE_NAME: sched.queue_name}
    return {}


def pod_labels(job: models.AsyncRLJob, role: str) -> dict[str, str]:
    """Labels a role's pods carry for the gang scheduler and Kueue."""
    sched = job.spec.scheduling
    out: dict[str, str] = {}
    if sched.queue_name and not statefulset_labels(job, role):
        out[KUEUE_QUEUE_NAME] = sched.queue_name
    if role == names.TRAINER and pod_group_api_version(job) == COSCHEDULING_API_VERSION:
        out[COSCHEDULING_POD_GROUP] = names.trainer(job.metadata.name)
    return out


def pod_annotations(job: models.AsyncRLJob, role: str) -> dict[str, str]:
    """Annotations a role's pods carry: Volcano's group name on the trainer's."""
    if role == names.TRAINER and pod_group_api_version(job) == VOLCANO_API_VERSION:
        return {VOLCANO_GROUP_NAME: names.trainer(job.metadata.name)}
    return {}


def min_resources(job: models.AsyncRLJob) -> dict[str, str]:
    """What the whole gang requests: replicas x (requests, a limit standing in for a missing request as
    Kubernetes defaults it, plus the GPUs)."""
    spec = job.spec.trainer
    per_pod = {k: str(v) for k, v in spec.resources.limits.items()}
    per_pod.update({k: str(v) for k, v in spec.resources.requests.items()})
    if spec.gpus_per_replica > 0:
        per_pod["nvidia.com/gpu"] = str(spec.gpus_per_replica)
    out = {}
    for resource, quantity in sorted(per_pod.items()):
        total = kubernetes.utils.parse_quantity(quantity) * spec.replicas  # type: ignore[no-untyped-call]
        out[resource] = _quantity(total)
    return out


def _quantity(value: decimal.Decimal) -> str:
    """A Decimal as a Kubernetes quantity: whole numbers plain, fractions in milli-units (rounded up)."""
    if value == value.to_integral_value():
        return str(int(value))
    return f"{int((value * 1000).to_integral_value(rounding=decimal.ROUND_CEILING))}m"


def render_pod_group(job: models.AsyncRLJob) -> dict[str, Any] | None:
    """The trainer gang's PodGroup for the job's gang scheduler, or None (see the module docstring)."""
    api_version = pod_group_api_version(job)
    if api_version is None:
        return None
    sched = job.spec.scheduling
    spec: dict[str, Any] = {"minMember": job.spec.trainer.replicas}
    resources = min_resources(job)
    if resources:
        spec["minResources"] = resources
    if api_version == VOLCANO_API_VERSION:
        spec["queue"] = VOLCANO_QUEUE
        if sched.priority_class_name:
            spec["priorityClassName"] = sched.priority_class_name
    return {
        "apiVersion": api_version,
        "kind": POD_GROUP_KIND,
        "metadata": names.metadata(job, names.trainer(job.metadata.name), names.TRAINER),
        "spec": spec,
    }
