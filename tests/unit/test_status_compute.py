"""status.compute_status: observed StatefulSets (+ the trainer's progress) -> phase and conditions."""

from __future__ import annotations

import datetime
from typing import Any

from asyncrl_api import models
from asyncrl_operator import lifecycle, status
from asyncrl_testing import jobs

NOW = datetime.datetime(2026, 11, 29, 10, 0, 0, tzinfo=datetime.UTC)


def _job(**patch: Any) -> models.AsyncRLJob:
    body = jobs.make_job("demo", "ns", **patch)
    body["metadata"].update(uid="u", generation=3)
    return models.AsyncRLJob.model_validate(body)


def _sts(ready: int, replicas: int | None = None) -> dict[str, Any]:
    return {"status": {"replicas": ready if replicas is None else replicas, "readyReplicas": ready}}


def _conditions(st: models.AsyncRLJobStatus) -> dict[str, str]:
    return {c.type: c.status for c in st.conditions}


def _observe(
    job: models.AsyncRLJob, trainer: int, rollout: int, nats: int = 1, **kw: Any
) -> models.AsyncRLJobStatus:
    obs = status.Observed(
        now=kw.pop("now", NOW), trainer=_sts(trainer), rollout=_sts(rollout), nats=_sts(nats), **kw
    )
    return status.compute_status(job, obs)


def test_nothing_observed_is_pending() -> None:
    st = status.compute_status(_job(), status.Observed(now=NOW))
    assert st.phase == "Pending" and st.observed_generation == 3


def test_children_not_ready_is_starting() -> None:
    st = _observe(_job(), trainer=0, rollout=0)
    assert st.phase == "Starting"
    assert _conditions(st)["Ready"] == "False" and _conditions(st)["TrainerReady"] == "False"


def test_all_ready_is_running_with_true_conditions_and_printer_fields() -> None:
    st = _observe(_job(), trainer=2, rollout=2)
    assert st.phase == "Running" and st.start_time == "2026-11-29T10:00:00Z"
    cond = _conditions(st)
    assert cond["Ready"] == cond["TrainerReady"] == cond["RolloutReady"] == cond["BusReady"] == "True"
    assert cond["Progressing"] == "True" and cond["Stalled"] == "False" and cond["InvalidSpec"] == "False"
    assert st.rollout.ready == "2/2" and st.trainer.ready == "2/2"
    assert st.rollout.selector == "asyncrl.dev/job=demo,asyncrl.dev/role=rollout"


def test_a_missing_rollout_replica_degrades_but_keeps_running() -> None:
    st = _observe(_job(), trainer=2, rollout=1)
    assert st.phase == "Running"
    assert _conditions(st)["Degraded"] == "True" and _conditions(st)["Ready"] == "False"


def test_suspended_job_is_suspended_and_wants_no_replicas() -> None:
    st = _observe(_job(suspend=True), trainer=0, rollout=0)
    assert st.phase == "Suspended" and st.trainer.ready == "0/0"


def test_step_not_advancing_is_stalled() -> None:
    job = _job(progress={"stalledAfterSeconds": 60})
    job.status.start_time = "2026-11-29T09:00:00Z"
    job.status.progress = models.Progress(step=5, step_time="2026-11-29T09:59:30Z")
    assert _conditions(_observe(job, 2, 2))["Stalled"] == "False"
    job.status.progress.step_time = "2026-11-29T09:58:00Z"
    stalled = _observe(job, 2, 2)
    assert _conditions(stalled)["Stalled"] == "True" and _conditions(stalled)["Progressing"] == "False"
    assert "not advanced" in stalled.message


def test_max_steps_reached_succeeds_and_stays_succeeded() -> None:
    job = _job(maxSteps=10)
    job.status.progress = models.Progress(step=10)
    st = _observe(job, 2, 2)
    assert st.phase == "Succeeded" and st.completion_time == "2026-11-29T10:00:00Z"
    job.status = st
    job.status.progress = models.Progress(step=3)
    assert _observe(job, 0, 0).phase == "Succeeded"


def test_transition_times_only_move_when_a_condition_changes() -> None:
    job = _job()
    first = _observe(job, 2, 2)
    job.status = first
    later = _observe(job, 2, 2, now=NOW + datetime.timedelta(minutes=5))
    assert [c.last_transition_time for c in later.conditions] == [
        c.last_transition_time for c in first.conditions
    ]
    job.status = later
    degraded = _observe(job, 2, 1, now=NOW + datetime.timedelta(minutes=6))
    times = {c.type: c.last_transition_time for c in degraded.conditions}
    assert times["Degraded"] == "2026-11-29T10:06:00Z" and times["TrainerReady"] == "2026-11-29T10:00:00Z"


def test_restarting_until_the_gang_is_back() -> None:
    assert _observe(_job(), trainer=1, rollout=2, restarting=True).phase == "Restarting"
    assert _observe(_job(), trainer=2, rollout=2, restarting=True).phase == "Running"


def test_invalid_spec_is_failed_with_the_message() -> None:
    st = status.compute_invalid_status(
        models.AsyncRLJobStatus(), 2, "spec.volumes[0].mountPath: reserved", NOW
    )
    assert st.phase == "Failed" and st.message.startswith("spec.volumes[0]")
    assert _conditions(st) == {"Ready": "False", "InvalidSpec": "True"}


def test_status_patch_never_writes_progress() -> None:
    job = _job()
    job.status.progress = models.Progress(step=9)
    patch = status.status_patch(_observe(job, 2, 2))
    assert "progress" not in patch and patch["phase"] == "Running"


def test_ttl_counts_from_completion() -> None:
    job = _job(ttlSecondsAfterFinished=30)
    job.status.phase, job.status.completion_time = "Succeeded", "2026-11-29T09:59:40Z"
    assert not lifecycle.ttl_expired(job, NOW)
    assert lifecycle.ttl_expired(job, NOW + datetime.timedelta(seconds=10))
    job.status.phase = "Running"
    assert not lifecycle.ttl_expired(job, NOW + datetime.timedelta(hours=1))


def test_trainer_failure_restarts_the_gang_and_rollout_failure_is_counted() -> None:
    def pod(role: str, phase: str = "Running", restarts: int = 0) -> dict[str, Any]:
        return {
            "metadata": {"uid": "p", "labels": {"asyncrl.dev/role": role, "asyncrl.dev/job": "demo"}},
            "status": {"phase": phase, "containerStatuses": [{"restartCount": restarts}]},
        }

    assert lifecycle.trainer_gang_needs_restart(pod("trainer", "Failed"))
    assert lifecycle.trainer_gang_needs_restart(pod("trainer", restarts=1))
    assert not lifecycle.trainer_gang_needs_restart(pod("trainer"))
    assert not lifecycle.trainer_gang_needs_restart(pod("rollout", "Failed"))
    assert lifecycle.rollout_replaced(pod("rollout", "Failed")) and not lifecycle.rollout_replaced(
        pod("rollout")
    )
    assert lifecycle.failure_key(pod("trainer", restarts=1)) != lifecycle.failure_key(
        pod("trainer", restarts=2)
    )


def test_an_apply_failure_is_reported_as_degraded_without_touching_other_conditions() -> None:
    running = _observe(_job(), 2, 2)
    st = status.with_condition(running, "Degraded", True, "ApplyFailed", "applying Role x failed: 403", NOW)
    assert _conditions(st)["Degraded"] == "True" and _conditions(st)["Ready"] == "True"
    assert st.condition("Degraded") is not None and "403" in st.condition("Degraded").message  # type: ignore[union-attr]
