"""One reconcile of one job, and the status refreshes its children's events ask for: the operator's
business logic.

Called by ``asyncrl_operator.handlers`` (kopf glue) from worker threads, and by ``pod_events``.
Everything here is level-triggered and idempotent: it reads the job, renders every child, server-side
applies them (no-ops when nothing changed), deletes the optional children its spec no longer renders,
and writes the operator-owned status once at the end. Decisions come from the pure modules (``render``,
``status``, ``lifecycle``, ``diagnose``); I/O goes through ``apply.Client``. A per-job lock serialises
the handlers, the child-event reactions and the resync loop for one job.

Status is computed from the StatefulSets, the job's pods (listed by label: what the kubelet and the
scheduler report, ``diagnose``) and a ``get`` of each Secret key the spec names, so a missing one is a
condition before any pod waits on it, and clears at the next reconcile or resync once fixed (the
operator may not watch Secrets: its RBAC has only ``get``).
"""

from __future__ import annotations

import collections
import datetime
import logging
import threading
import time
from typing import Any

import pydantic
from asyncrl_api import models
from asyncrl_api import status as api_status

from asyncrl_operator import (
    admission,
    apply,
    autoscaler,
    diagnose,
    failures,
    lifecycle,
    metrics,
    render,
    status,
)

Body = dict[str, Any]
log = logging.getLogger(__name__)

_locks: collections.defaultdict[tuple[str, str], threading.Lock] = collections.defaultdict(threading.Lock)
_locks_guard = threading.Lock()
_sts_cache: dict[tuple[str, str], Body | None] = {}
"""Replica counts of our StatefulSets as last seen in watch events, so most events cost no API call."""
_sts_guard = threading.Lock()
_last_reconciled: dict[tuple[str, str], float] = {}
_pruned: dict[tuple[str, str], tuple[str, int]] = {}
"""(uid, generation) of each job whose stale optional children were last looked for: once per spec."""


def lock(namespace: str, name: str) -> threading.Lock:
    with _locks_guard:
        return _locks[(namespace, name)]


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def old_status(body: Body) -> api_status.AsyncRLJobStatus:
    try:
        return api_status.AsyncRLJobStatus.model_validate(body.get("status") or {})
    except pydantic.ValidationError:
        return api_status.AsyncRLJobStatus()


def _write_status(client: apply.Client, body: Body, new: api_status.AsyncRLJobStatus) -> bool:
    """Patch the status if the operator-owned part changed (and record the phase metric)."""
    meta = body["metadata"]
    metrics.set_phase(meta["namespace"], meta["name"], new.phase)
    patch = status.status_patch(new)
    if patch == status.status_patch(old_status(body)):
        return False
    client.patch_status(meta["namespace"], meta["name"], patch)
    return True


def _write_invalid(client: apply.Client, body: Body, why: str) -> None:
    meta = body["metadata"]
    new = status.compute_invalid_status(old_status(body), int(meta.get("generation") or 0), why, utc_now())
    if _write_status(client, body, new):
        log.warning("job %s/%s has an invalid spec: %s", meta["namespace"], meta["name"], why)


def due_for_resync(namespace: str, name: str, interval: float) -> bool:
    """Not reconciled for ``interval`` seconds (the resync loop skips the others, so re-applying
    hundreds of jobs spreads out over time instead of starving new jobs in one burst)."""
    last = _last_reconciled.get((namespace, name))
    return last is None or time.monotonic() - last >= interval


def reconcile(client: apply.Client, namespace: str, name: str) -> None:
    """Validate, apply every child, update status. Deletes the job when its TTL ran out."""
    _last_reconciled[(namespace, name)] = time.monotonic()
    with lock(namespace, name), metrics.reconcile_timer():
        body = client.get(models.KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return
        job, why = admission.parse(body)
        if job is None:
            _write_invalid(client, body, why or "invalid spec")
            return
        now = utc_now()
        if lifecycle.ttl_expired(job, now):
            log.info("deleting %s/%s: finished more than ttlSecondsAfterFinished ago", namespace, name)
            client.delete(models.KIND, namespace, name)
            metrics.forget(namespace, name)
            _last_reconciled.pop((namespace, name), None)
            _pruned.pop((namespace, name), None)
            return
        applied: dict[tuple[str, str], Body] = {}
        for obj in render.render(job):
            key = (render.kind_key(obj), obj["metadata"]["name"])
            try:
                applied[key] = client.apply(obj)
            except apply.ApiError as exc:
                why = f"applying {key[0]} {key[1]} failed: {exc.status} {exc.reason}"
                why += apply.error_message(exc)
                if exc.status == 404 and "." in key[0]:  # a PodGroup whose CRD is not installed
                    why += f" (is the {key[0]} CRD installed? spec.scheduling.schedulerName asks for it)"
                log.error("%s/%s: %s", namespace, name, why)
                degraded = status.with_condition(job.status, "Degraded", True, "ApplyFailed", why, now)
                _write_status(client, body, degraded)
                raise
        _prune(client, job, set(applied))
        _write_status(client, body, _compute(client, job, applied, now))


def _prune(client: apply.Client, job: models.AsyncRLJob, rendered: set[tuple[str, str]]) -> None:
    """Delete the optional children (``render.optional``) this spec does not render, e.g. the gateway's
    Service and NetworkPolicy after agent.loop changed from gateway; only objects this job owns. Looked
    for once per generation (and once after an operator restart), not on every resync."""
    meta = job.metadata
    key, seen = (meta.namespace, meta.name), (meta.uid, meta.generation)
    if _pruned.get(key) == seen:
        return
    for kind, child in render.optional(meta.name):
        if (kind, child) in rendered:
            continue
        found = client.get(kind, meta.namespace, child)
        owners = (found or {}).get("metadata", {}).get("ownerReferences") or []
        if found is not None and any(o.get("uid") == meta.uid for o in owners):
            log.info("%s/%s: deleting %s %s (no longer in the spec)", meta.namespace, meta.name, kind, child)
            client.delete(kind, meta.namespace, child, uid=found["metadata"]["uid"])
    _pruned[key] = seen


def _job_pods(client: apply.Client, job: models.AsyncRLJob) -> list[Body]:
    names = render.names
    selector = {names.JOB: names.label_value(job.metadata.name), names.MANAGED_BY: names.MANAGER}
    return client.select("Pod", job.metadata.namespace, selector)


def _secret_problems(client: apply.Client, job: models.AsyncRLJob) -> list[diagnose.Problem]:
    """A ``get`` of each Secret the spec names; only whether the key is there and non-empty is kept (the
    body goes out of scope here, values are never logged)."""
    found = []
    namespace = job.metadata.namespace
    for use in render.secrets.refs(job):
        try:
            problem = diagnose.secret_problem(use, client.get("Secret", namespace, use.ref.name), namespace)
        except apply.ApiError as exc:  # e.g. an older chart's RBAC without secrets: get
            log.warning(
                "%s/%s: cannot check Secret %s: %s", namespace, job.metadata.name, use.ref.name, exc.status
            )
            continue
        if problem is not None:
            found.append(problem)
    return found


def _compute(
    client: apply.Client, job: models.AsyncRLJob, objects: dict[tuple[str, str], Body], now: datetime.datetime
) -> Any:
    name = job.metadata.name
    obs = status.Observed(
        now=now,
        trainer=objects.get(("StatefulSet", render.names.trainer(name))),
        rollout=objects.get(("StatefulSet", render.names.rollout(name))),
        nats=objects.get(("StatefulSet", render.names.nats(name))),
        agents=objects.get(("Deployment", render.names.agent(name))),
        restarting=job.status.phase == "Restarting",
        pods=tuple(_job_pods(client, job)),
        secret_problems=tuple(_secret_problems(client, job)),
    )
    new = status.compute_status(job, obs)
    new.config_hash = render.configmap.config_hash(render.configmap.job_config(job))
    return new


def _replica_snapshot(sts: Body) -> Body:
    """The part of a StatefulSet that status.py reads."""
    st = sts.get("status") or {}
    return {"status": {"replicas": st.get("replicas") or 0, "readyReplicas": st.get("readyReplicas") or 0}}


def on_statefulset_event(client: apply.Client, event_type: str, sts: Body) -> None:
    """Refresh the owner's status when a child StatefulSet's replica counts changed (most events do not
    change them: the cache of what was last seen filters those out without an API call)."""
    meta = sts["metadata"]
    job = (meta.get("labels") or {}).get(render.names.JOB)
    if not job:
        return
    key = (meta.get("namespace", ""), meta["name"])
    snapshot = None if event_type == "DELETED" else _replica_snapshot(sts)
    with _sts_guard:
        if key in _sts_cache and _sts_cache[key] == snapshot:
            return
        _sts_cache[key] = snapshot
        if snapshot is None:
            del _sts_cache[key]
    refresh_status(client, key[0], job)


def _cached_statefulset(client: apply.Client, namespace: str, name: str) -> Body | None:
    with _sts_guard:
        if (namespace, name) in _sts_cache:
            return _sts_cache[(namespace, name)]
    found = client.get("StatefulSet", namespace, name)
    return None if found is None else _replica_snapshot(found)


def refresh_status(client: apply.Client, namespace: str, name: str) -> None:
    """Recompute status from the children's last seen replica counts without applying."""
    with lock(namespace, name):
        body = client.get(models.KIND, namespace, name)
        if body is None:
            return
        job, why = admission.parse(body)
        if job is None:
            return
        names = render.names
        objects = {
            ("StatefulSet", sts): _cached_statefulset(client, namespace, sts)
            for sts in (names.trainer(name), names.rollout(name), names.nats(name))
        }
        if render.agents.spec(job) is not None:  # not cached: agent jobs are few, a GET is cheap
            agent = names.agent(name)
            objects[("Deployment", agent)] = client.get("Deployment", namespace, agent)
        found = {key: obj for key, obj in objects.items() if obj is not None}
        _write_status(client, body, _compute(client, job, found, utc_now()))


def autoscale(client: apply.Client, body: Body) -> None:
    """spec.rollout.autoscale: the job's latest report as a sample; a change goes through /scale (whose
    spec update then reconciles as any spec change)."""
    job, _ = admission.parse(body)
    if job is None or job.spec.rollout.autoscale is None:
        return
    meta = body["metadata"]
    with lock(meta["namespace"], meta["name"]):
        autoscaler.on_job(client, body, job)


def needs_reconcile(body: Body) -> bool:
    """A status change the spec-driven handlers do not see: maxSteps reached while not yet Succeeded, the
    restart budget spent while pods still run (the reconcile scales them to zero), or agent workers
    whose wanted replicas changed with the status (the first ready rollout starts them)."""
    job, _ = admission.parse(body)
    if job is None:
        return False
    if job.status.phase != "Succeeded" and status.reached_max_steps(job):
        return True
    found = render.agents.spec(job)
    if found is not None:
        applied = job.status.agents.replicas if job.status.agents is not None else 0
        if render.agents.desired_replicas(job, found[1]) != applied:
            return True
    running = job.status.trainer.replicas + job.status.rollout.replicas > 0
    return failures.failed_on_budget(job) and running
