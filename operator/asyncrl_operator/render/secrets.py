"""The Secrets a job names: which key goes to which container as which env var or file, and the list the
operator checks before any pod waits on one.

Called by ``render.rollout`` (the judge's API key; the gateway's admin key comes from ``render.gateway``),
``render.trainer`` (the teacher's API key), ``render.pods`` (the NATS ``.creds`` file of
bus.nats.credentialsSecret, a read-only volume on both roles) and ``asyncrl_operator.reconcile``
(``refs``: each Secret and key is looked up with a ``get`` so a missing one is a condition on the job, not
a pod stuck in CreateContainerConfigError or ContainerCreating). A key reaches a container only as a
``secretKeyRef`` env var or a Secret volume: its value is in no rendered object.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from asyncrl_api import config, models, task, tracking

Usage = Literal["judge", "teacher", "gateway", "nats", "tracking"]
NATS_CREDS_VOLUME = "nats-creds"


@dataclasses.dataclass(frozen=True)
class SecretUse:
    """One Secret key the spec names, and what it is for."""

    usage: Usage
    """judge (reward.endpoint), teacher (teacher.endpoint), gateway (agent.gateway's admin key) or nats
    (bus.nats.credentialsSecret)."""
    ref: task.SecretKeyRef
    """The Secret and key, in the job's namespace."""
    field: str
    """The spec field naming it, for messages."""


def secret_env(name: str, ref: task.SecretKeyRef) -> dict[str, Any]:
    """An env var from a key of a Secret."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def judge_ref(job: models.AsyncRLJob) -> task.SecretKeyRef | None:
    """reward.endpoint.apiKeySecret of a judge-rewarded job."""
    reward = job.spec.reward
    if reward.type != "judge" or reward.endpoint is None:
        return None
    return reward.endpoint.api_key_secret


def teacher_ref(job: models.AsyncRLJob) -> task.SecretKeyRef | None:
    """teacher.endpoint.apiKeySecret."""
    teacher = job.spec.teacher
    return None if teacher is None else teacher.endpoint.api_key_secret


def nats_ref(job: models.AsyncRLJob) -> task.SecretKeyRef | None:
    """bus.nats.credentialsSecret (key ``creds``) of a job on an external NATS server."""
    bus = job.spec.bus.nats
    if bus.managed or bus.credentials_secret is None:
        return None
    return task.SecretKeyRef(name=bus.credentials_secret, key=config.NATS_CREDS_KEY)


def nats_volumes(job: models.AsyncRLJob) -> list[dict[str, Any]]:
    """The ``.creds`` file's Secret volume (only its ``creds`` key), when the job has one. Mode 0444: the
    kubelet writes it owned by root and the images run as uid 1000, which must read it."""
    ref = nats_ref(job)
    if ref is None:
        return []
    items = [{"key": ref.key, "path": config.NATS_CREDS_KEY}]
    secret = {"secretName": ref.name, "items": items, "defaultMode": 0o444}
    return [{"name": NATS_CREDS_VOLUME, "secret": secret}]


def nats_volume_mounts(job: models.AsyncRLJob) -> list[dict[str, Any]]:
    """The ``.creds`` file at ``config.NATS_CREDS_PATH``, read-only."""
    if nats_ref(job) is None:
        return []
    return [{"name": NATS_CREDS_VOLUME, "mountPath": config.NATS_CREDS_DIR, "readOnly": True}]


def nats_env(job: models.AsyncRLJob) -> list[dict[str, Any]]:
    """The ``.creds`` file's path (not its content) for every NATS connection of the pod."""
    return [] if nats_ref(job) is None else [{"name": config.NATS_CREDS_ENV, "value": config.NATS_CREDS_PATH}]


def rollout_env(job: models.AsyncRLJob) -> list[dict[str, Any]]:
    """The judge's API key on the rollout pods (they score samples), when it has one; the NATS creds path."""
    ref = judge_ref(job)
    return ([] if ref is None else [secret_env(config.JUDGE_API_KEY_ENV, ref)]) + nats_env(job)


def tracking_refs(job: models.AsyncRLJob) -> list[tuple[str, task.SecretKeyRef, str]]:
    """spec.tracking's credentials: (the tracking library's own env var, the Secret key, the spec field)."""
    spec = job.spec.tracking
    out: list[tuple[str, task.SecretKeyRef, str]] = []
    if spec is None:
        return out
    if spec.mlflow is not None:
        for env, ref, name in (
            (tracking.MLFLOW_TOKEN_ENV, spec.mlflow.token_secret, "tokenSecret"),
            (tracking.MLFLOW_USERNAME_ENV, spec.mlflow.username_secret, "usernameSecret"),
            (tracking.MLFLOW_PASSWORD_ENV, spec.mlflow.password_secret, "passwordSecret"),
        ):
            if ref is not None:
                out.append((env, ref, f"spec.tracking.mlflow.{name}"))
    if spec.wandb is not None and spec.wandb.api_key_secret is not None:
        out.append(
            (tracking.WANDB_API_KEY_ENV, spec.wandb.api_key_secret, "spec.tracking.wandb.apiKeySecret")
        )
    return out


def trainer_env(job: models.AsyncRLJob) -> list[dict[str, Any]]:
    """The teacher's API key on the trainer pods (rank 0 asks the teacher), when it has one; the trackers'
    credentials; the NATS creds path."""
    ref = teacher_ref(job)
    out = [] if ref is None else [secret_env(config.TEACHER_API_KEY_ENV, ref)]
    out += [secret_env(env, key) for env, key, _ in tracking_refs(job)]
    return out + nats_env(job)


def refs(job: models.AsyncRLJob) -> list[SecretUse]:
    """Every Secret key the job's pods read, in spec order."""
    out: list[SecretUse] = []
    judge = judge_ref(job)
    if judge is not None:
        out.append(SecretUse("judge", judge, "spec.reward.endpoint.apiKeySecret"))
    teacher = teacher_ref(job)
    if teacher is not None:
        out.append(SecretUse("teacher", teacher, "spec.teacher.endpoint.apiKeySecret"))
    agent = job.spec.agent
    if agent is not None and agent.loop == "gateway" and agent.gateway is not None:
        out.append(SecretUse("gateway", agent.gateway.admin_key_secret, "spec.agent.gateway.adminKeySecret"))
    nats = nats_ref(job)
    if nats is not None:
        out.append(SecretUse("nats", nats, "spec.bus.nats.credentialsSecret"))
    out += [SecretUse("tracking", ref, field) for _, ref, field in tracking_refs(job)]
    return out
