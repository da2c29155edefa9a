"""Names and labels of every object a job owns: one place, so render, status and handlers agree.

Imported by every builder in ``asyncrl_operator.render``, by ``asyncrl_operator.status`` (selectors)
and by the handlers (which pods belong to which role). Pure functions of the job's name.
"""

from __future__ import annotations

import hashlib

from asyncrl_api import models

MAX_CHILD_NAME = 52
"""StatefulSet names stay <= 52 so pod names and the controller-revision-hash label (<sts>-<10 chars>)
stay <= 63; every other child uses the same bound for simplicity."""

# Label keys (documented constants, as JobSet does).
JOB = "asyncrl.dev/job"
ROLE = "asyncrl.dev/role"
NAME = "app.kubernetes.io/name"
INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
MANAGED_BY = "app.kubernetes.io/managed-by"
PART_OF = "app.kubernetes.io/part-of"
POD_INDEX = "apps.kubernetes.io/pod-index"

# Annotation keys.
CONFIG_HASH = "asyncrl.dev/config-hash"

MANAGER = "asyncrl-operator"
ROLLOUT = "rollout"
TRAINER = "trainer"
NATS = "nats"
GATEWAY = "gateway"
AGENT = "agent"


def child(job_name: str, suffix: str) -> str:
    """``<job>-<suffix>``, truncated with a stable hash when it would exceed ``MAX_CHILD_NAME``."""
    name = f"{job_name}-{suffix}"
    if len(name) <= MAX_CHILD_NAME:
        return name
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:8]
    keep = MAX_CHILD_NAME - len(suffix) - len(digest) - 2
    return f"{job_name[:keep].rstrip('-.')}-{digest}-{suffix}"


def label_value(value: str) -> str:
    """A label value (<= 63 characters; longer values are truncated with a hash)."""
    if len(value) <= 63:
        return value
    return f"{value[:54].rstrip('-._')}-{hashlib.sha256(value.encode()).hexdigest()[:8]}"


def config_map(job_name: str) -> str:
    return child(job_name, "config")


def rollout(job_name: str) -> str:
    """The rollout StatefulSet and its headless Service."""
    return child(job_name, ROLLOUT)


def trainer(job_name: str) -> str:
    """The trainer StatefulSet, its headless Service and its ServiceAccount/Role/RoleBinding."""
    return child(job_name, TRAINER)


def nats(job_name: str) -> str:
    """The managed NATS StatefulSet and Service."""
    return child(job_name, NATS)


def network_policy(job_name: str) -> str:
    return child(job_name, "net")


def trainer_egress_policy(job_name: str) -> str:
    """The trainer pods' own egress NetworkPolicy (the API server, ``render.network``)."""
    return child(job_name, "trainer-egress")


def gateway(job_name: str) -> str:
    """The agent gateway's ClusterIP Service and its NetworkPolicy (spec.agent.loop gateway)."""
    return child(job_name, GATEWAY)


def agent(job_name: str) -> str:
    """The agent workers' Deployment and PodDisruptionBudget (spec.agent.workers)."""
    return child(job_name, AGENT)


def gateway_service_url(job_name: str, namespace: str, port: int) -> str:
    """The gateway's ClusterIP Service URL: where agents open sessions (any ready rollout replica)."""
    return f"http://{gateway(job_name)}.{namespace}.svc:{port}"


def labels(job_name: str, component: str) -> dict[str, str]:
    """Labels on every child and pod: app.kubernetes.io/* plus asyncrl.dev/job and asyncrl.dev/role."""
    return {
        NAME: "asyncrl",
        INSTANCE: label_value(job_name),
        COMPONENT: component,
        PART_OF: "asyncrl",
        MANAGED_BY: MANAGER,
        JOB: label_value(job_name),
        ROLE: component,
    }


def selector(job_name: str, role: str) -> dict[str, str]:
    """The pod selector of one role (immutable in StatefulSets: never add keys here)."""
    return {JOB: label_value(job_name), ROLE: role}


def selector_string(job_name: str, role: str) -> str:
    """The selector as a string, for the scale subresource's labelSelectorPath."""
    return ",".join(f"{k}={v}" for k, v in selector(job_name, role).items())


def trainer_host(job_name: str, namespace: str) -> str:
    """DNS name of trainer rank 0: torch master and weight-sync rendezvous."""
    return f"{trainer(job_name)}-0.{trainer(job_name)}.{namespace}.svc"


def gateway_pod_url(job_name: str, port: int) -> str:
    """A rollout pod's own gateway URL, through the rollout's headless Service (StatefulSet per-pod DNS).
    The kubelet expands $(POD_NAME) and $(POD_NAMESPACE) from the identity env defined before it."""
    return f"http://$(POD_NAME).{rollout(job_name)}.$(POD_NAMESPACE).svc:{port}"


def gateway_peer_url(job_name: str, port: int) -> str:
    """Every rollout pod's gateway URL as a template: ``{replica}`` is the pod's ordinal (the StatefulSet's
    pod ``<rollout>-<ordinal>``), so a replica reaches its peers at any replica count."""
    return f"http://{rollout(job_name)}-{{replica}}.{rollout(job_name)}.$(POD_NAMESPACE).svc:{port}"


def nats_url(job_name: str, namespace: str, port: int) -> str:
    """URL of the managed NATS server."""
    return f"nats://{nats(job_name)}.{namespace}.svc:{port}"


def owner_reference(job: models.AsyncRLJob) -> dict[str, object]:
    """The controller owner reference every child carries (garbage collection on delete)."""
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "name": job.metadata.name,
        "uid": job.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(job: models.AsyncRLJob, name: str, component: str) -> dict[str, object]:
    """Standard metadata of a child object."""
    return {
        "name": name,
        "namespace": job.metadata.namespace,
        "labels": labels(job.metadata.name, component),
        "ownerReferences": [owner_reference(job)],
    }
