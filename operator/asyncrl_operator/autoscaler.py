"""spec.rollout.autoscale in the operator: each trainer report (status.progress.utilization) is a sample;
``asyncrl_api.autoscale.decide`` turns the samples into a replica count, which goes to the job's own /scale
subresource (never to the StatefulSet: the spec stays the one truth, and reconcile renders from it).
status.autoscale and an Event per change say why.

The samples live in this process (a bounded deque per job): an operator restart forgets them and the
next change waits one stabilisation window of new reports, the same as after a change. Called by
handlers.on_job_event for every ADDED/MODIFIED event of a job with autoscale, under the job's lock; it
decides once per new report (or at once when the replicas are outside minReplicas..maxReplicas), so its
own status patch does not decide again.
"""

from __future__ import annotations

import datetime
import logging
import time

from asyncrl_api import autoscale, models
from asyncrl_api import status as api_status

from asyncrl_operator import apply, metrics, status

log = logging.getLogger(__name__)

HISTORY = 512
"""Samples kept per job (at the default 10 s report interval, over an hour)."""
FIT_REFRESH_SECONDS = 300.0
"""How often the nodes are listed again for the GPU-fit warning (nodes come and go slowly)."""

_history: dict[tuple[str, str], autoscale.History] = {}
_fit: dict[tuple[str, str], tuple[float, tuple[object, ...], str]] = {}


def forget(namespace: str, name: str) -> None:
    _history.pop((namespace, name), None)
    _fit.pop((namespace, name), None)


def _fit_warning(client: apply.Client, key: tuple[str, str], job: models.AsyncRLJob, now: float) -> str:
    """status.autoscale.warning: maxReplicas against what the GPU nodes can ever hold, listed at most
    every FIT_REFRESH_SECONDS (or when the inputs change). Without read access to nodes (a namespaced
    install) or for a CPU rollout there is no warning."""
    rollout = job.spec.rollout
    assert rollout.autoscale is not None
    inputs = (
        rollout.autoscale.max_replicas,
        rollout.gpus_per_replica,
        tuple(sorted(rollout.node_selector.items())),
    )
    cached = _fit.get(key)
    if cached is not None and cached[1] == inputs and now - cached[0] < FIT_REFRESH_SECONDS:
        return cached[2]
    warning = ""
    if rollout.gpus_per_replica > 0:
        try:
            nodes = client.list_nodes()
        except apply.ApiError as exc:
            if exc.status not in (401, 403):
                log.warning("%s/%s: nodes not listed for the GPU-fit check: %s", key[0], key[1], exc.status)
        else:
            fit = autoscale.replicas_that_fit(nodes, rollout.gpus_per_replica, rollout.node_selector)
            warning = autoscale.fit_warning(rollout.autoscale.max_replicas, fit, rollout.gpus_per_replica)
    _fit[key] = (now, inputs, warning)
    return warning


def _observe(history: autoscale.History, job: models.AsyncRLJob) -> bool:
    """Take the job's report as a sample; False if it is not a new one."""
    progress = job.status.progress
    if progress is None or progress.utilization is None:
        return False
    when = status.parse_time(progress.last_update_time)
    if when is None:
        return False
    u = progress.utilization
    return history.add(
        autoscale.Signals(
            when.timestamp(),
            u.trainer_wait_fraction,
            u.rollout_blocked_fraction,
            job.status.rollout.ready_replicas,
            u.samples_per_second,
            progress.samples_consumed,
        )
    )


def _event(client: apply.Client, body: apply.Body, kind: str, reason: str, message: str, when: str) -> None:
    try:
        client.post_event(body, kind, reason, message, when)
    except apply.ApiError as exc:  # what it says is in status already; the event is a courtesy
        meta = body["metadata"]
        log.warning("%s/%s: event not posted: %s", meta["namespace"], meta["name"], exc.status)


def on_job(client: apply.Client, body: apply.Body, job: models.AsyncRLJob, now: float | None = None) -> None:
    """Take the job's latest report as a sample, decide, and act through /scale."""
    spec = job.spec.rollout.autoscale
    if spec is None or job.spec.suspend or job.status.phase in ("Succeeded", "Failed", "Pending"):
        return
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    now = time.time() if now is None else now
    current = job.spec.rollout.replicas
    history = _history.setdefault(key, autoscale.History(HISTORY))
    if not _observe(history, job) and spec.min_replicas <= current <= spec.max_replicas:
        return  # decide once per trainer report: this event is our own status patch or another change
    decision = history.decide(spec, current, now)
    old = job.status.autoscale or api_status.AutoscaleStatus()
    new = old.model_copy(
        update={
            "desired_replicas": decision.replicas,
            "reason": decision.reason,
            "message": decision.message,
            "warning": _fit_warning(client, key, job, now),
        }
    )
    u = job.status.progress.utilization if job.status.progress is not None else None
    if u is not None:
        new.trainer_wait_fraction = u.trainer_wait_fraction
        new.rollout_blocked_fraction = u.rollout_blocked_fraction
        new.samples_per_second = u.samples_per_second
    metrics.set_autoscale(key[0], key[1], decision.replicas, u)
    when = status.format_time(datetime.datetime.fromtimestamp(now, datetime.UTC))
    if decision.replicas != current:
        why = f"rollout replicas {current} -> {decision.replicas}: {decision.message}"
        client.scale(key[0], key[1], decision.replicas)
        new.last_scale_time, new.last_scale_reason = when, why
        metrics.count_scale(key[0], key[1], "up" if decision.replicas > current else "down")
        log.info("%s/%s: %s", key[0], key[1], why)
        _event(client, body, "Normal", decision.reason, why, when)
    history.applied(spec, current, decision, now)  # after /scale took it (a refused scale decides again)
    ceiling = history.ceiling
    if ceiling is not None and ceiling.until > now:
        new.ceiling_replicas = ceiling.replicas
        new.ceiling_until = status.format_time(datetime.datetime.fromtimestamp(ceiling.until, datetime.UTC))
    else:
        new.ceiling_replicas = new.ceiling_until = None
    if new.warning and new.warning != old.warning:
        _event(client, body, "Warning", "MaxReplicasUnschedulable", new.warning, when)
    if new != old:
        patch = new.to_api()
        if new.ceiling_replicas is None and old.ceiling_replicas is not None:  # a merge patch keeps what
            patch.update(ceilingReplicas=None, ceilingUntil=None)  # it leaves out: null removes it
        client.patch_status(key[0], key[1], {"autoscale": patch})
