"""The operator's Prometheus metrics (docs/metrics.md) and the HTTP server that exposes them,
with the readiness probe's /readyz.

Called by ``asyncrl_operator.reconcile`` (timings, errors, phases, restarts), ``handlers`` (each
successful resync listing, which /readyz reads) and ``main`` (server). Liveness is kopf's own /healthz
on its health port: it answers from the event loop that runs the watches, so a wedged loop fails it.
Labels are bounded: ``phase`` has 7 values and ``role`` 2; no per-job label (a job-level view comes
from the workloads' own metrics and the AsyncRLJob status).
"""

from __future__ import annotations

import contextlib
import threading
import time
import wsgiref.simple_server
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import prometheus_client
import prometheus_client.exposition
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

_JOB = ["namespace", "job"]
AUTOSCALE_DESIRED = prometheus_client.Gauge(
    "asyncrl_autoscale_desired_replicas",
    "spec.rollout.autoscale: the rollout replicas the last decision asks for.",
    _JOB,
    registry=REGISTRY,
)
AUTOSCALE_WAIT = prometheus_client.Gauge(
    "asyncrl_autoscale_trainer_wait_fraction",
    "spec.rollout.autoscale's signal: the trainer's share of recent wall time waiting for samples.",
    _JOB,
    registry=REGISTRY,
)
AUTOSCALE_BLOCKED = prometheus_client.Gauge(
    "asyncrl_autoscale_rollout_blocked_fraction",
    "spec.rollout.autoscale's signal: share of recent trainer steps whose whole batch was already queued.",
    _JOB,
    registry=REGISTRY,
)
AUTOSCALE_RATE = prometheus_client.Gauge(
    "asyncrl_autoscale_samples_per_second",
    "spec.rollout.autoscale's signal: samples the trainer consumed per second over its recent steps.",
    _JOB,
    registry=REGISTRY,
)
AUTOSCALE_CHANGES = prometheus_client.Counter(
    "asyncrl_autoscale_changes",
    "spec.rollout.autoscale: replica changes made through /scale, by direction (up, down).",
    [*_JOB, "direction"],
    registry=REGISTRY,
)
_AUTOSCALE = (AUTOSCALE_DESIRED, AUTOSCALE_WAIT, AUTOSCALE_BLOCKED, AUTOSCALE_RATE)

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
    for gauge in _AUTOSCALE:
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)
    for direction in ("up", "down"):
        with contextlib.suppress(KeyError):
            AUTOSCALE_CHANGES.remove(namespace, name, direction)


def set_autoscale(namespace: str, name: str, desired: int, signals: api_status.Utilization | None) -> None:
    AUTOSCALE_DESIRED.labels(namespace, name).set(desired)
    if signals is not None:
        AUTOSCALE_WAIT.labels(namespace, name).set(signals.trainer_wait_fraction)
        AUTOSCALE_BLOCKED.labels(namespace, name).set(signals.rollout_blocked_fraction)
        if signals.samples_per_second is not None:
            AUTOSCALE_RATE.labels(namespace, name).set(signals.samples_per_second)


def count_scale(namespace: str, name: str, direction: str) -> None:
    AUTOSCALE_CHANGES.labels(namespace, name, direction).inc()


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


_listed_at: float | None = None


def mark_listed() -> None:
    """The resync loop listed the watched jobs: the API server answers and the RBAC lets it read."""
    global _listed_at
    _listed_at = time.monotonic()


def ready(window: float) -> bool:
    """Ready: a resync listing succeeded within the last ``window`` seconds."""
    return _listed_at is not None and time.monotonic() - _listed_at <= window


def probes_app(metrics: Callable[..., Iterable[bytes]], window: float) -> Callable[..., Iterable[bytes]]:
    """/readyz (200 when ``ready(window)``, else 503); everything else prometheus-client's app."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/readyz":
            return metrics(environ, start_response)
        if ready(window):
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ready\n"]
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return [f"not ready: no successful listing of jobs in the last {window:.0f}s\n".encode()]

    return app


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """No access log for probes and scrapes."""


def serve(port: int, ready_window: float, addr: str = "0.0.0.0") -> None:
    """Serve /metrics and /readyz on a background thread (prometheus-client's threading WSGI server)."""
    app = probes_app(prometheus_client.make_wsgi_app(REGISTRY), ready_window)
    server = wsgiref.simple_server.make_server(
        addr, port, app, prometheus_client.exposition.ThreadingWSGIServer, handler_class=_QuietHandler
    )
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
