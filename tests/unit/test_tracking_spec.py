"""spec.tracking on the operator's side (issue 34): credentials reach the trainer only as secretKeyRefs
under the tracking libraries' own env var names and are checked like every Secret; the trainer's report of
its trackers becomes the TrackingReady condition."""

from __future__ import annotations

from typing import Any

from asyncrl_api import models
from asyncrl_api import status as api_status
from asyncrl_operator import status
from asyncrl_operator.render import secrets
from asyncrl_testing import jobs

TRACKING = {
    "mlflow": {
        "trackingURI": "http://mlflow:5000", "experiment": "e",
        "usernameSecret": {"name": "mlf", "key": "user"}, "passwordSecret": {"name": "mlf", "key": "pass"},
    },
    "wandb": {"project": "p", "apiKeySecret": {"name": "wb"}},
    "tensorboard": {"logDir": "/data/tb"},
}  # fmt: skip


def _job(**patch: Any) -> models.AsyncRLJob:
    return models.AsyncRLJob.model_validate(jobs.make_job("demo", "ns", **patch))


def test_tracking_credentials_are_secret_key_refs_under_the_libraries_names_and_are_checked() -> None:
    job = _job(tracking=TRACKING)
    env = {e["name"]: e.get("valueFrom") for e in secrets.trainer_env(job)}
    assert env["MLFLOW_TRACKING_USERNAME"] == {"secretKeyRef": {"name": "mlf", "key": "user"}}
    assert env["MLFLOW_TRACKING_PASSWORD"] == {"secretKeyRef": {"name": "mlf", "key": "pass"}}
    assert env["WANDB_API_KEY"] == {"secretKeyRef": {"name": "wb", "key": "apiKey"}}
    assert "MLFLOW_TRACKING_TOKEN" not in env
    checked = [(u.usage, u.ref.name, u.ref.key, u.field) for u in secrets.refs(job)]
    assert ("tracking", "wb", "apiKey", "spec.tracking.wandb.apiKeySecret") in checked
    assert secrets.trainer_env(_job()) == secrets.nats_env(_job())  # no tracking, nothing added


def _condition(job: models.AsyncRLJob, trackers: list[dict[str, Any]] | None) -> Any:
    st = api_status.AsyncRLJobStatus.model_validate({"progress": {"tracking": trackers}} if trackers else {})
    return status.tracking_condition(job, st)


def test_tracking_ready_follows_the_trainers_report_of_each_tracker() -> None:
    job = _job(tracking=TRACKING)
    assert _condition(_job(), None) is None
    assert (_condition(job, None).status, _condition(job, None).reason) == ("False", "Starting")
    refused = [
        {"backend": "mlflow", "ready": True, "reason": "Logging", "url": "http://mlflow:5000/#/runs/1"},
        {"backend": "wandb", "ready": False, "reason": "Unauthorized", "message": "wandb: 401"},
    ]
    cond = _condition(job, refused)
    assert (cond.status, cond.reason, cond.message) == ("False", "Unauthorized", "wandb: 401")
    cond = _condition(job, [refused[0]])
    assert (cond.status, cond.reason, cond.message) == ("True", "Logging", "http://mlflow:5000/#/runs/1")


def test_a_missing_tracking_secret_is_a_degraded_problem_not_an_endpoint_one() -> None:
    from asyncrl_operator import diagnose  # noqa: PLC0415

    use = next(u for u in secrets.refs(_job(tracking=TRACKING)) if u.usage == "tracking")
    problem = diagnose.secret_problem(use, None, "ns")
    assert problem is not None and (problem.condition, problem.reason) == ("Degraded", "SecretNotFound")
