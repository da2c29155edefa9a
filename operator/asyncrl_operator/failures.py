"""A job's problems as status: the EndpointsReady and Degraded conditions, the restart budget, and the
one reason shown in ``kubectl get arj``. Pure: no client, no clock.

Called by ``asyncrl_operator.status.compute_status`` with the problems ``diagnose`` found in the pods and
the Secret checks. Each condition's reason is its most pressing problem's and its message lists the
first few (each naming its pod or Secret). ``status.reason`` / ``status.message`` are the first that
applies of: InvalidSpec > RestartBudgetExhausted > an endpoint error (EndpointsReady False) > a pod
problem (Degraded True) > Stalled.

The restart budget (spec.failurePolicy.maxRestarts): container restarts of the job's pods plus the
trainer gang restarts and replaced rollout pods the operator recorded in status.restarts. Above it the
job ends Failed with the count and the last error line, and stays Failed (like Succeeded, and like a
Kubernetes Job past its backoffLimit): its pods are scaled to zero (``render.pods.stopped``); delete
and re-apply it to try again.
"""

from __future__ import annotations

from asyncrl_api import models
from asyncrl_api import status as api_status

from asyncrl_operator import diagnose

BUDGET_EXHAUSTED = "RestartBudgetExhausted"
SHOWN = 3
"""Problems listed in a condition's message (the rest are counted)."""


def _cond(type_: api_status.ConditionType, ok: bool, reason: str, message: str = "") -> api_status.Condition:
    return api_status.Condition(type=type_, status="True" if ok else "False", reason=reason, message=message)


def restart_count(job: models.AsyncRLJob, pods: list[diagnose.Body]) -> int:
    """Restarts counted against spec.failurePolicy.maxRestarts."""
    return diagnose.restarts(pods) + job.status.restarts.trainer + job.status.restarts.rollout


def budget_exhausted(job: models.AsyncRLJob, pods: list[diagnose.Body]) -> bool:
    limit = job.spec.failure_policy.max_restarts
    return limit is not None and restart_count(job, pods) > limit


def failed_on_budget(job: models.AsyncRLJob) -> bool:
    """The job already ended on its restart budget (it stays Failed)."""
    return job.status.phase == "Failed" and job.status.reason == BUDGET_EXHAUSTED


def calls_endpoints(job: models.AsyncRLJob) -> bool:
    """A judge reward or a teacher."""
    reward = job.spec.reward
    return job.spec.teacher is not None or (reward.type == "judge" and reward.endpoint is not None)


def summary(found: list[diagnose.Problem]) -> str:
    """The first few problems' messages."""
    shown = [p.message for p in found[:SHOWN]]
    more = len(found) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more else "")


def endpoints_condition(
    job: models.AsyncRLJob, found: list[diagnose.Problem], phase: api_status.Phase
) -> api_status.Condition:
    """False with the endpoint error's Kind (or SecretNotFound / SecretKeyMissing) while one is reported;
    while the trainer gang restarts, the error that started it (a teacher's) is kept."""
    bad = [p for p in found if p.condition == "EndpointsReady"]
    if bad:
        return _cond("EndpointsReady", False, bad[0].reason, summary(bad))
    old = job.status.condition("EndpointsReady")
    if phase == "Restarting" and old is not None and old.status == "False":
        return _cond("EndpointsReady", False, old.reason, old.message)
    if not calls_endpoints(job):
        return _cond("EndpointsReady", True, "NotConfigured", "the job calls no judge or teacher endpoint")
    return _cond("EndpointsReady", True, "Reachable", "no pod reports an endpoint error")


def degraded_condition(
    job: models.AsyncRLJob,
    found: list[diagnose.Problem],
    phase: api_status.Phase,
    rollout_ok: bool,
    rollout_ready: str,
) -> api_status.Condition:
    """True with the most pressing pod problem (or the gateway's missing admin key); while the trainer
    gang restarts, the failure that started it (written by the restart) is kept; else True for a running
    job missing rollout replicas."""
    bad = [p for p in found if p.condition == "Degraded"]
    if bad:
        return _cond("Degraded", True, bad[0].reason, summary(bad))
    old = job.status.condition("Degraded")
    if phase == "Restarting" and old is not None and old.status == "True":
        return _cond("Degraded", True, old.reason, old.message)
    if phase == "Running" and not rollout_ok:
        return _cond("Degraded", True, "RolloutReplicasNotReady", f"{rollout_ready} rollout replicas ready")
    return _cond("Degraded", False, "AsExpected")


def last_error(job: models.AsyncRLJob, found: list[diagnose.Problem]) -> str:
    """The newest error: a pod's now, else what the previous status showed (a trainer gang restart
    replaces the pod that held it)."""
    if found:
        return found[0].message
    endpoints, degraded = job.status.condition("EndpointsReady"), job.status.condition("Degraded")
    if endpoints is not None and endpoints.status == "False":
        return endpoints.message
    if degraded is not None and degraded.status == "True" and degraded.message:
        return degraded.message
    return "none reported"


def pressing(
    job: models.AsyncRLJob,
    invalid: str | None,
    phase: api_status.Phase,
    conditions: list[api_status.Condition],
    found: list[diagnose.Problem],
    pods: list[diagnose.Body],
) -> tuple[str, str]:
    """(status.reason, status.message): the most pressing problem, or ("", "") when there is none."""
    if invalid:
        return "InvalidSpec", invalid
    if phase == "Failed" and failed_on_budget(job):
        return job.status.reason, job.status.message
    if phase == "Failed":
        limit = job.spec.failure_policy.max_restarts
        count = restart_count(job, pods)
        return BUDGET_EXHAUSTED, (
            f"{count} restarts, more than spec.failurePolicy.maxRestarts ({limit}); "
            f"last error: {last_error(job, found)}"
        )
    by_type = {c.type: c for c in conditions}
    endpoints, degraded, stalled = (by_type.get(t) for t in ("EndpointsReady", "Degraded", "Stalled"))
    if endpoints is not None and endpoints.status == "False":
        return endpoints.reason, endpoints.message
    if degraded is not None and degraded.status == "True":
        return degraded.reason, degraded.message
    if stalled is not None and stalled.status == "True":
        return "Stalled", stalled.message
    return "", ""
