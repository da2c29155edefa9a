"""Thin kopf glue: which Kubernetes events call which reconcile function. No business logic here.

Imported by ``asyncrl_operator.main`` (registering the handlers with kopf). Handlers are sync
(kopf runs them in its thread pool) because ``apply.Client`` is sync.

- AsyncRLJob create / update / resume -> ``reconcile.reconcile`` (render + server-side apply + status).
- AsyncRLJob events -> reconcile when trainer progress reached maxSteps (status changes are not
  "updates" for kopf).
- StatefulSet events (our children) -> ``reconcile.refresh_status`` (ready counts, phase).
- Pod events (our children) -> ``pod_events.handle_pod`` (trainer gang restart, rollout replacements,
  a throttled status refresh: what the pods report becomes conditions).
- A resync loop started at startup reconciles every job every ``resync_seconds`` (drift, TTL,
  Stalled). It is not a kopf timer on purpose: kopf timers add a finalizer to every job (kopf#833),
  and asyncrl needs none -- children are garbage-collected through owner references.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf
from asyncrl_api import models

from asyncrl_operator import apply, autoscaler, metrics, pod_events, reconcile
from asyncrl_operator.render import names

log = logging.getLogger(__name__)
CHILD_LABELS: dict[str, Any] = {names.JOB: kopf.PRESENT, names.MANAGED_BY: names.MANAGER}
RESOURCE = (models.GROUP, models.VERSION, models.PLURAL)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Keep kopf's own bookkeeping under asyncrl.dev, start the client and the resync loop."""
    settings.persistence.finalizer = f"{models.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=models.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=models.GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = int(memo.get("workers", 8))
    settings.watching.server_timeout = 300
    # No cluster-scoped discovery watches (CRDs, namespaces): the chart's RBAC grants nothing
    # cluster-scoped beyond our own kinds, and its Deployment restarts the operator when the CRD
    # changes, so resources found at startup (API discovery) are all the operator needs.
    settings.scanning.disabled = True
    memo.client = apply.Client.from_environment()
    memo.resync_task = asyncio.create_task(_resync_forever(memo))


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    task = memo.get("resync_task")
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _resync_forever(memo: kopf.Memo) -> None:
    interval = float(memo.get("resync_seconds", 30.0))
    namespaces: list[str | None] = list(memo.get("namespaces") or []) or [None]
    while (
        True
    ):  # tick faster than the interval so each job comes due about `interval` after its last reconcile
        await asyncio.sleep(max(1.0, interval / 4))
        for namespace in namespaces:
            try:
                jobs = await asyncio.to_thread(memo.client.list_jobs, namespace)
            except Exception:
                log.exception("resync: listing jobs failed")
                continue
            metrics.mark_listed()  # /readyz
            for body in jobs:
                meta = body["metadata"]
                if not reconcile.due_for_resync(meta["namespace"], meta["name"], interval):
                    continue
                try:
                    await asyncio.to_thread(reconcile.reconcile, memo.client, meta["namespace"], meta["name"])
                except Exception:
                    log.exception("resync of %s/%s failed", meta["namespace"], meta["name"])


@kopf.on.create(*RESOURCE, backoff=5)
@kopf.on.update(*RESOURCE, backoff=5)
@kopf.on.resume(*RESOURCE, backoff=5)
def on_job(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    reconcile.reconcile(memo.client, namespace or "", name)


@kopf.on.delete(*RESOURCE, optional=True)
def on_job_deleted(name: str, namespace: str | None, **_: Any) -> None:
    metrics.forget(namespace or "", name)
    autoscaler.forget(namespace or "", name)


@kopf.on.event(*RESOURCE)
def on_job_event(event: kopf.RawEvent, body: kopf.Body, memo: Any, **_: Any) -> None:
    if event.get("type") in ("ADDED", "MODIFIED") and reconcile.needs_reconcile(dict(body)):
        reconcile.reconcile(memo.client, body.metadata.namespace or "", body.metadata.name or "")
    if event.get("type") in ("ADDED", "MODIFIED"):
        reconcile.autoscale(memo.client, dict(body))


@kopf.on.event("apps", "v1", "statefulsets", labels=CHILD_LABELS)
def on_statefulset_event(event: kopf.RawEvent, body: kopf.Body, memo: Any, **_: Any) -> None:
    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
        reconcile.on_statefulset_event(memo.client, str(event.get("type")), dict(body))


@kopf.on.event("", "v1", "pods", labels=CHILD_LABELS)
def on_pod_event(event: kopf.RawEvent, body: kopf.Body, memo: Any, **_: Any) -> None:
    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
        pod_events.handle_pod(memo.client, dict(body))
