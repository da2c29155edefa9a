"""The operator's Prometheus metrics (the README's Metrics table) and the HTTP server that exposes them.

Called by ``asyncrl_operator.reconcile`` (timings, errors, phases, restarts) and ``main`` (server).
Labels are bounded: ``phase`` has 7 values and ``role`` 2; no per-job label (a job-level view comes
from the workloads' own metrics and the AsyncRLJob status).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import prometheus_client
from asyncrl_api import status as api_status

REGISTRY = prometheus_client.CollectorRegistry()

RECONCILE_SECONDS = prometheus_client.Histogram(
    "asyncrl_operator_reconcile_seconds",
    "Time of one full reconcile of one AsyncRLJob (render + apply + status).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
RECONCILE_ERRORS = prometheus_client.Counter(
    "asyncrl_operator_reconcile_errors_total",
    "Reconciles that raised (kopf retries them).",
    registry=REGISTRY,
)
JOBS = prometheus_client.Gauge(
    "asyncrl_jobs", "AsyncRLJobs known to this operator, by phase.", ["phase"], registry=REGISTRY
)
RESTARTS = prometheus_client.Counter(
    "asyncrl_job_restarts",
    "Restarts the operator performed or observed: trainer gang restarts, rollout pod replacements.",
    ["role"],
    registry=REGISTRY,
)

_phases: dict[tuple[str, str], str] = {}
_phases_lock = threading.Lock()

for _phase in api_status.PHASES:
    JOBS.labels(phase=_phase).set(0)
for _role in ("trainer", "rollout"):
    RESTARTS.labels(role=_role)


def _publish() -> None:
    counts: dict[str, int] = dict.fromkeys(api_status.PHASES, 0)
    for phase in _phases.values():
        counts[phase] = counts.get(phase, 0) + 1
    for phase, count in counts.items():
        JOBS.labels(phase=phase).set(count)


def set_phase(namespace: str, name: str, phase: str) -> None:
    with _phases_lock:
        _phases[(namespace, name)] = phase
        _publish()


def forget(namespace: str, name: str) -> None:
    with _phases_lock:
        _phases.pop((namespace, name), None)
        _publish()


def count_restart(role: str) -> None:
    RESTARTS.labels(role=role).inc()


@contextlib.contextmanager
def reconcile_timer() -> Iterator[None]:
    """Time a reconcile; count it as an error if it raises."""
    with RECONCILE_SECONDS.time():
        try:
            yield
        except Exception:
            RECONCILE_ERRORS.inc()
            raise


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve /metrics on a background thread."""
    prometheus_client.start_http_server(port, addr=addr, registry=REGISTRY)
