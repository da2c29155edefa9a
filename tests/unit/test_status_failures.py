"""compute_status with what the pods and the Secret checks report: EndpointsReady, Degraded, status.reason
and message, the restart budget (Failed, sticky, pods scaled to zero)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from asyncrl_api import models
from asyncrl_operator import diagnose, render, status
from asyncrl_operator.diagnose import Problem
from asyncrl_testing import jobs

NOW = datetime.datetime(2026, 11, 29, 10, 0, 0, tzinfo=datetime.UTC)
JUDGE = {"baseURL": "http://judge:8000/v1", "model": "judge", "apiKeySecret": {"name": "judge-key"}}
LINE_401 = (
    "Unauthorized: judge endpoint http://judge:8000/v1: 401 Unauthorized; check Secret judge-key key apiKey"
)
PVC = '0/2 nodes are available: persistentvolumeclaim "rl-storage" not found.'
SECRET_MISSING = Problem("EndpointsReady", "SecretNotFound", 'Secret "judge-key" in namespace ns not found')


def _job(**patch: Any) -> models.AsyncRLJob:
    body = jobs.make_job("demo", "ns", **patch)
    body["metadata"].update(uid="u", generation=3)
    return models.AsyncRLJob.model_validate(body)


def _judge_job(**patch: Any) -> models.AsyncRLJob:
    return _job(reward={"type": "judge", "endpoint": JUDGE}, **patch)


def _sts(ready: int) -> dict[str, Any]:
    return {"status": {"replicas": 2, "readyReplicas": ready}}


def _crashing(name: str, line: str, restarts: int = 1, role: str = "rollout") -> dict[str, Any]:
    cs = {
        "name": role,
        "ready": False,
        "restartCount": restarts,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "message": f"{line}\n"}},
    }
    labels = {"asyncrl.dev/role": role}
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"phase": "Running", "containerStatuses": [cs]},
    }


def _unschedulable(name: str) -> dict[str, Any]:
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": PVC}
    return {"metadata": {"name": name, "labels": {}}, "status": {"phase": "Pending", "conditions": [cond]}}


def _observe(
    job: models.AsyncRLJob, ready: int = 2, rollout: int | None = None, **kw: Any
) -> models.AsyncRLJobStatus:
    rollout_sts = _sts(ready if rollout is None else rollout)
    obs = status.Observed(now=NOW, trainer=_sts(ready), rollout=rollout_sts, nats=_sts(1), **kw)
    return status.compute_status(job, obs)


def _cond(st: models.AsyncRLJobStatus, type_: Any) -> tuple[str, str, str]:
    c = st.condition(type_)
    assert c is not None
    return c.status, c.reason, c.message


def test_a_job_without_endpoints_has_no_problem_and_no_reason() -> None:
    st = _observe(_job())
    assert _cond(st, "EndpointsReady")[:2] == ("True", "NotConfigured")
    assert _cond(st, "Degraded")[:2] == ("False", "AsExpected")
    assert (st.phase, st.reason, st.message) == ("Running", "", "")


def test_an_endpoint_error_from_a_crash_looping_pod_is_the_jobs_reason() -> None:
    st = _observe(_judge_job(), rollout=1, pods=(_crashing("demo-rollout-1", LINE_401),))
    message = f"{LINE_401} (pod demo-rollout-1)"
    assert _cond(st, "EndpointsReady") == ("False", "Unauthorized", message)
    assert (st.reason, st.message) == ("Unauthorized", message)
    assert _cond(st, "Degraded")[1] == "RolloutReplicasNotReady"  # the crash is told once, as the endpoint


def test_a_fixed_endpoint_clears_the_condition() -> None:
    failing = _judge_job()
    failing.status = _observe(failing, rollout=1, pods=(_crashing("demo-rollout-1", LINE_401),))
    st = _observe(failing)
    assert _cond(st, "EndpointsReady")[:2] == ("True", "Reachable") and st.reason == ""


def test_a_missing_secret_shows_before_any_pod() -> None:
    st = status.compute_status(_judge_job(), status.Observed(now=NOW, secret_problems=(SECRET_MISSING,)))
    assert st.phase == "Pending"
    assert _cond(st, "EndpointsReady") == ("False", "SecretNotFound", SECRET_MISSING.message)
    assert (st.reason, st.message) == ("SecretNotFound", SECRET_MISSING.message)


def test_pods_that_cannot_start_degrade_the_job_with_the_schedulers_message() -> None:
    pods = tuple(_unschedulable(f"demo-trainer-{i}") for i in range(4))
    st = _observe(_job(), ready=0, pods=pods)
    expected = "; ".join(f"pod demo-trainer-{i}: {PVC}" for i in range(3)) + "; and 1 more"
    assert st.phase == "Starting"
    assert _cond(st, "Degraded") == ("True", "Unschedulable", expected)
    assert (st.reason, st.message) == ("Unschedulable", expected)


@pytest.mark.parametrize(
    ("invalid", "secret", "pods", "stalled", "reason"),
    [
        ("spec.x: bad", True, True, True, "InvalidSpec"),
        (None, True, True, True, "SecretNotFound"),
        (None, False, True, True, "Unschedulable"),
        (None, False, False, True, "Stalled"),
        (None, False, False, False, ""),
    ],
)
def test_the_reason_is_the_most_pressing_problem(
    invalid: str | None, secret: bool, pods: bool, stalled: bool, reason: str
) -> None:
    job = _judge_job(progress={"stalledAfterSeconds": 10})
    job.status.start_time = "2026-11-29T09:00:00Z" if stalled else "2026-11-29T10:00:00Z"
    st = _observe(
        job,
        invalid=invalid,
        secret_problems=(SECRET_MISSING,) if secret else (),
        pods=(_unschedulable("demo-rollout-2"),) if pods else (),
    )
    assert st.reason == reason


def test_the_restart_budget_ends_the_job_failed_with_the_last_error_line() -> None:
    job = _job(failurePolicy={"maxRestarts": 2})
    assert (
        _observe(job, pods=(_crashing("demo-rollout-0", "ValueError: bad", restarts=2),)).phase == "Running"
    )
    job.status.restarts.rollout = 1  # 2 container restarts + 1 replaced pod
    st = _observe(job, pods=(_crashing("demo-rollout-0", "ValueError: bad", restarts=2),))
    assert (st.phase, st.reason) == ("Failed", "RestartBudgetExhausted")
    assert st.message == (
        "3 restarts, more than spec.failurePolicy.maxRestarts (2);"
        " last error: pod demo-rollout-0: ValueError: bad"
    )
    assert st.completion_time == "2026-11-29T10:00:00Z"


def test_a_job_failed_on_its_budget_stays_failed_and_runs_no_pods() -> None:
    job = _job(failurePolicy={"maxRestarts": 2})
    job.status = _observe(job, pods=(_crashing("demo-rollout-0", "ValueError: bad", restarts=3),))
    later = _observe(job, ready=0)  # pods gone: their restart counts with them
    assert (later.phase, later.reason, later.message) == ("Failed", job.status.reason, job.status.message)
    objects = {(o["kind"], o["metadata"]["name"]): o for o in render.render(job)}
    assert objects[("StatefulSet", "demo-rollout")]["spec"]["replicas"] == 0
    assert objects[("StatefulSet", "demo-trainer")]["spec"]["replicas"] == 0


def test_no_budget_restarts_forever_and_trainer_pods_count_through_gang_restarts() -> None:
    forever = _job(failurePolicy={"maxRestarts": None})
    assert _observe(forever, pods=(_crashing("demo-rollout-0", "x", restarts=500),)).phase == "Running"
    job = _job(failurePolicy={"maxRestarts": 2})
    job.status.restarts.trainer = 2
    trainer = _crashing("demo-trainer-0", "x", restarts=1, role="trainer")
    assert _observe(job, pods=(trainer,)).phase == "Running"  # its restart is the gang restart counted


def test_a_trainer_gang_restart_keeps_its_cause_until_the_gang_is_back() -> None:
    job = _job()
    cause = diagnose.Problem("Degraded", "CrashLoopBackOff", "pod demo-trainer-1: ValueError: bad")
    job.status = status.with_condition(job.status, "Degraded", True, cause.reason, cause.message, NOW)
    job.status.phase = "Restarting"
    assert _cond(_observe(job, ready=0, restarting=True), "Degraded") == ("True", cause.reason, cause.message)
    assert _cond(_observe(job, ready=2, restarting=True), "Degraded")[0] == "False"


def test_status_patch_writes_the_reason_and_clears_it() -> None:
    assert status.status_patch(_observe(_job(), pods=(_unschedulable("p"),)))["reason"] == "Unschedulable"
    assert status.status_patch(_observe(_job()))["reason"] == ""
