"""status: a role whose pods are held by scheduling gates (Kueue's admission) says so in its readiness
condition, rather than a bare NotReady: a queued job waits, it is not broken (issue 21, gang admission)."""

from __future__ import annotations

import datetime
from typing import Any

from asyncrl_api import models
from asyncrl_operator import status
from asyncrl_testing import jobs

NOW = datetime.datetime(2026, 12, 2, 10, 0, 0, tzinfo=datetime.UTC)
GATE = "kueue.x-k8s.io/admission"


def _pod(role: str, gates: list[str], deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": {"asyncrl.dev/role": role}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T09:59:00Z"
    return {"metadata": meta, "spec": {"schedulingGates": [{"name": g} for g in gates]}, "status": {}}


def _conditions(pods: list[dict[str, Any]], trainer_ready: int = 0) -> dict[str, models.Condition]:
    body = jobs.make_job("demo", "ns", scheduling={"queueName": "team"})
    body["metadata"].update(uid="u", generation=1)
    job = models.AsyncRLJob.model_validate(body)
    ready = {"status": {"replicas": 2, "readyReplicas": trainer_ready}}
    obs = status.Observed(now=NOW, trainer=ready, rollout=ready, nats=ready, pods=tuple(pods))
    return {c.type: c for c in status.compute_status(job, obs).conditions}


def test_gated_trainer_pods_make_trainer_ready_say_scheduling_gated() -> None:
    conds = _conditions([_pod("trainer", [GATE]), _pod("trainer", [GATE]), _pod("rollout", [])])
    trainer = conds["TrainerReady"]
    assert (trainer.status, trainer.reason) == ("False", "SchedulingGated")
    assert GATE in trainer.message and trainer.message.startswith("0/2 ready")
    assert conds["RolloutReady"].reason == "NotReady"  # its pods are not gated


def test_no_gates_or_only_deleted_gated_pods_is_plain_not_ready() -> None:
    assert _conditions([_pod("trainer", [])])["TrainerReady"].reason == "NotReady"
    assert _conditions([_pod("trainer", [GATE], deleting=True)])["TrainerReady"].reason == "NotReady"


def test_ready_role_is_all_ready_whatever_its_pods_say() -> None:
    assert _conditions([_pod("trainer", [GATE])], trainer_ready=2)["TrainerReady"].reason == "AllReady"
