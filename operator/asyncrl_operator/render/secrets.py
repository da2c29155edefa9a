"""The Secrets a job names: which key goes to which container as which env var, and the list the operator
checks before any pod waits on one.

Called by ``render.rollout`` (the judge's API key; the gateway's admin key comes from ``render.gateway``),
``render.trainer`` (the teacher's API key) and ``asyncrl_operator.reconcile`` (``refs``: each Secret and
key is looked up with a ``get`` so a missing one is a condition on the job, not a pod stuck in
CreateContainerConfigError). A key reaches a container only as a ``secretKeyRef`` env var: its value is
in no rendered object.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from asyncrl_api import config, models, task

Usage = Literal["judge", "teacher", "gateway"]


@dataclasses.dataclass(frozen=True)
class SecretUse:
    """One Secret key the spec names, and what it is for."""

    usage: Usage
    """judge (reward.endpoint), teacher (teacher.endpoint) or gateway (agent.gateway's admin key)."""
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


def rollout_env(job: models.AsyncRLJob) -> list[dict[str, Any]]:
    """The judge's API key on the rollout pods (they score samples), when it has one."""
    ref = judge_ref(job)
    return [] if ref is None else [secret_env(config.JUDGE_API_KEY_ENV, ref)]


def trainer_env(job: models.AsyncRLJob) -> list[dict[str, Any]]:
    """The teacher's API key on the trainer pods (rank 0 asks the teacher), when it has one."""
    ref = teacher_ref(job)
    return [] if ref is None else [secret_env(config.TEACHER_API_KEY_ENV, ref)]


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
    return out
