"""Reactions to the job's pod events: a failed trainer pod restarts the whole gang, a failed rollout pod is
counted (the StatefulSet controller replaces it alone), and every event refreshes the job's status.

Called by ``asyncrl_operator.handlers.on_pod_event`` from kopf's worker threads. Each failure is handled
once (remembered by pod uid, phase and restart count). Status refreshes are throttled per job
(``throttle``, ``POD_REFRESH_SECONDS``): a burst of events costs a bounded number of API calls, and the
refresh after the last event always runs, so what a pod reports reaches the job within seconds.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

from asyncrl_api import models

from asyncrl_operator import apply, diagnose, lifecycle, metrics, reconcile, render, status, throttle

Body = dict[str, Any]
log = logging.getLogger(__name__)

POD_REFRESH_SECONDS = 2.0
"""A job's status is refreshed at most this often on its pods' events (and always after the last)."""
_MAX_REMEMBERED = 4096
_handled_failures: collections.OrderedDict[str, None] = collections.OrderedDict()
_refresh = throttle.Throttle(POD_REFRESH_SECONDS)


def _first_time(key: str) -> bool:
    if key in _handled_failures:
        return False
    _handled_failures[key] = None
    while len(_handled_failures) > _MAX_REMEMBERED:
        _handled_failures.popitem(last=False)
    return True


def handle_pod(client: apply.Client, pod: Body) -> None:
    """A trainer pod failed -> restart the whole trainer gang; a rollout pod failed -> count it (the
    StatefulSet controller replaces it alone). Every pod event refreshes the job's status, throttled."""
    job_name = lifecycle.job_of(pod)
    namespace = pod["metadata"].get("namespace", "")
    if not job_name:
        return
    if lifecycle.trainer_gang_needs_restart(pod) and _first_time(lifecycle.failure_key(pod)):
        with reconcile.lock(namespace, job_name):
            _restart_trainer_gang(client, namespace, job_name, pod)
    elif lifecycle.rollout_replaced(pod) and _first_time(lifecycle.failure_key(pod)):
        with reconcile.lock(namespace, job_name):
            _count_restart(client, namespace, job_name, "rollout", None)
    _refresh.poke((namespace, job_name), lambda: reconcile.refresh_status(client, namespace, job_name))


def _restart_trainer_gang(client: apply.Client, namespace: str, job_name: str, failed: Body) -> None:
    selector = render.names.selector(job_name, render.names.TRAINER)
    gang = client.select("Pod", namespace, selector)
    log.warning(
        "trainer pod %s of %s/%s failed: restarting the trainer gang (%d pods)",
        failed["metadata"]["name"],
        namespace,
        job_name,
        len(gang),
    )
    for pod in gang:
        if not lifecycle.is_terminating(pod):
            client.delete("Pod", namespace, pod["metadata"]["name"], uid=pod["metadata"]["uid"])
    _count_restart(client, namespace, job_name, "trainer", "Restarting", diagnose.failure_of(failed))


def _count_restart(
    client: apply.Client,
    namespace: str,
    job_name: str,
    role: str,
    phase: str | None,
    cause: diagnose.Problem | None = None,
) -> None:
    """Count one restart; a trainer gang restart also records its cause in the job's conditions (the
    pod that held the error line is gone; status keeps it while the gang restarts)."""
    body = client.get(models.KIND, namespace, job_name)
    if body is None:
        return
    restarts = dict((body.get("status") or {}).get("restarts") or {})
    restarts[role] = int(restarts.get(role, 0)) + 1
    patch: Body = {"restarts": restarts}
    if phase:
        patch["phase"] = phase
    if cause is not None:
        holds = cause.condition == "Degraded"  # Degraded True, EndpointsReady False
        old = reconcile.old_status(body)
        new = status.with_condition(
            old, cause.condition, holds, cause.reason, cause.message, reconcile.utc_now()
        )
        patch["conditions"] = [c.to_api() for c in new.conditions]
    client.patch_status(namespace, job_name, patch)
    metrics.count_restart(role)
