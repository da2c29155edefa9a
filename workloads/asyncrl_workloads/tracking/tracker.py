"""Trainer rank 0's tracker: what the step log and validation runs hold, handed to each sink in order.

Built by ``trainer/main.py`` from spec.tracking (``from_spec``); ``trainer/steplog.py`` calls ``step`` with
each step log record, ``trainer/validation.py`` calls ``validation`` with each run's result and samples.

Each sink has a thread and a queue of its own, so a tracker that is slow or down never holds up a step
or another tracker. A failed call is counted (``asyncrl_tracking_errors_total{backend}``), classified
(``Unauthorized``: 401/403 or a refused key; ``Unreachable``: no answer; ``Error``: anything else),
logged once per class, shown in ``status()`` and retried with back-off (1 s doubling to 60 s) until it
succeeds: calls are never skipped or reordered, only queued (at most ``QUEUE_MAX``; beyond that the
newest are dropped and counted).

Resume: the run id and the last step and validation step each backend logged are kept in
``<checkpoint path>/tracking.json`` beside the ledger. A restarted trainer opens the same run and
skips steps up to the last logged one (it re-trains the steps after its checkpoint; they are not logged
twice), so each step is logged once and in order. The file is written after each call returns, so a
trainer killed in between would log that step again: where the backend can say what it holds
(``Sink.logged``: MLflow, TensorBoard), the resumed state takes the later of the two.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pathlib
import queue
import statistics
import threading
import time
from collections.abc import Mapping
from typing import Any

from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.tracking import sinks as sinks_mod

log = logging.getLogger(__name__)

STATE_NAME = "tracking.json"
QUEUE_MAX = 10_000
BACKOFF_MIN_S, BACKOFF_MAX_S = 1.0, 60.0
JOB_UID_ENV = "ASYNCRL_JOB_UID"
KINDS = ("Unauthorized", "Unreachable", "Error")


def classify(exc: BaseException) -> str:
    """Unauthorized, Unreachable or Error (the endpoints' classes, as far as a tracker shows them)."""
    text = f"{type(exc).__name__} {exc}".lower()
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403) or any(
        w in text for w in ("401", "403", "unauthorized", "unauthenticated", "permission_denied", "forbidden",
                            "authenticationerror", "api key")
    ):  # fmt: skip
        return "Unauthorized"
    if isinstance(exc, (ConnectionError, TimeoutError)) or any(
        w in text for w in ("connection", "timed out", "timeout", "max retries", "unreachable", "refused",
                            "name resolution")
    ):  # fmt: skip
        return "Unreachable"
    return "Error"


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """A nested mapping as dotted keys with string values (MLflow params, W&B config)."""
    out: dict[str, str] = {}
    if isinstance(value, Mapping):
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(value, list) and value and any(isinstance(v, (Mapping, list)) for v in value):
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}.{i}"))
    else:
        out[prefix] = json.dumps(value) if not isinstance(value, str) else value
    return out


def step_metrics(record: dict[str, Any], samples_per_s: float | None = None) -> dict[str, float]:
    """The numbers of one step log record (trainer/steplog.py) under tracker names."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in ("step", "time") or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[f"train/{key}"] = float(value)
    staleness = record.get("staleness") or []
    if staleness:
        out["train/staleness_mean"] = float(statistics.fmean(staleness))
        out["train/staleness_max"] = float(max(staleness))
    rewards = [r for r in record.get("rewards") or [] if isinstance(r, (int, float))]
    if rewards:
        out.setdefault("train/reward_mean", float(statistics.fmean(rewards)))
        out.setdefault("train/reward_std", float(statistics.pstdev(rewards)))
    for key, value in (record.get("counters") or {}).items():
        out[f"counters/{key}"] = float(value)
    sync = record.get("sync") or {}
    for key in ("transfer_seconds", "total_seconds", "nbytes"):
        if isinstance(sync.get(key), (int, float)):
            out[f"sync/{key}"] = float(sync[key])
    if samples_per_s is not None:
        out["train/samples_per_second"] = samples_per_s
    return out


class _Channel:
    """One sink: its queue, thread, resume state and status."""

    def __init__(self, tracker: Tracker, sink: sinks_mod.Sink) -> None:
        self.tracker, self.sink = tracker, sink
        self.queue: queue.Queue[tuple[str, Any] | None] = queue.Queue(QUEUE_MAX)
        self.state: dict[str, Any] = dict(tracker.saved.get(sink.backend, {}))
        self.status: dict[str, Any] = {"ready": False, "reason": "Starting", "message": ""}
        self.logged_kinds: set[str] = set()
        self.errors = (
            tracker.metrics.tracking_errors_by(sink.backend) if tracker.metrics is not None else None
        )
        self.thread = threading.Thread(target=self._run, name=f"tracking-{sink.backend}", daemon=True)

    def put(self, item: tuple[str, Any] | None) -> None:
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            self._failed(RuntimeError(f"{QUEUE_MAX} calls queued, dropping the newest"), "Error")

    def _failed(self, exc: BaseException, kind: str | None = None) -> None:
        kind = kind or classify(exc)
        if self.errors is not None:
            self.errors.inc()
        message = f"{self.sink.backend}: {type(exc).__name__}: {str(exc)[:300]}"
        self.status = {**self.status, "ready": False, "reason": kind, "message": message}
        if kind not in self.logged_kinds:  # once per kind: a tracker down for hours is one line
            self.logged_kinds.add(kind)
            log.warning(
                "tracking %s (%s, retried with back-off; training goes on): %s",
                self.sink.backend,
                kind,
                message,
            )

    def _retry(self, call: Any) -> bool:
        """Call until it succeeds (True) or the tracker is closing and gave up waiting (False)."""
        delay = BACKOFF_MIN_S
        while True:
            try:
                call()
            except Exception as exc:  # noqa: BLE001 - any library error: counted, classified, retried
                self._failed(exc)
                if self.tracker.closing.wait(delay):
                    return False
                delay = min(BACKOFF_MAX_S, delay * 2)
                continue
            url = self.sink.url()
            self.status = {"ready": True, "reason": "Logging", "message": "", **({"url": url} if url else {})}
            return True

    def _start(self) -> None:
        t = self.tracker
        run_id, new = self.sink.start(self.state.get("run_id"), t.run_name, t.tags)
        self.state["run_id"] = run_id
        if not new:  # what reached the backend after the state was last written (a SIGKILL between)
            for field, step in self.sink.logged().items():
                self.state[field] = max(step, int(self.state.get(field, -1)))
        t.save(self.sink.backend, self.state)
        if t.metrics is not None:
            t.metrics.tracking_run(self.sink.backend, run_id, self.sink.url())
        if new or not self.state.get("params"):
            self.sink.log_params(t.params)
            self.state["params"] = True
            t.save(self.sink.backend, self.state)

    def _apply(self, item: tuple[str, Any]) -> None:
        kind, body = item
        if kind == "step":
            step, metrics = body
            if step <= int(self.state.get("last_step", 0)):
                return  # logged before a restart
            self.sink.log_step(step, metrics)
            self.state["last_step"] = step
        else:
            step, metrics, rows = body
            if step <= int(self.state.get("last_validation", -1)):
                return
            self.sink.log_validation(step, metrics, rows)
            self.state["last_validation"] = step
        self.tracker.save(self.sink.backend, self.state)

    def _run(self) -> None:
        if not self._retry(self._start):
            return
        while True:
            item = self.queue.get()
            if item is None or not self._retry(lambda item=item: self._apply(item)):
                break
        try:
            self.sink.close()
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)


class Tracker:
    def __init__(
        self,
        sinks: list[sinks_mod.Sink],
        state_path: pathlib.Path,
        run_name: str,
        tags: dict[str, str],
        params: dict[str, str],
        metrics: metrics_mod.Bound | None,
    ) -> None:
        self.state_path, self.run_name, self.tags, self.params = state_path, run_name, tags, params
        self.metrics = metrics
        self.saved: dict[str, Any] = {}
        if state_path.is_file():
            try:
                self.saved = json.loads(state_path.read_text())
            except (OSError, ValueError) as exc:
                log.warning("tracking state %s not read (new runs are opened): %s", state_path, exc)
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.started = time.monotonic()
        self.channels = [_Channel(self, s) for s in sinks]
        for c in self.channels:
            c.thread.start()

    def save(self, backend: str, state: dict[str, Any]) -> None:
        with self.lock:
            self.saved[backend] = dict(state)
            tmp = self.state_path.with_suffix(".tmp")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.saved, sort_keys=True))
            os.replace(tmp, self.state_path)

    def step(self, record: dict[str, Any], samples_per_s: float | None = None) -> None:
        """One step log record (trainer/steplog.py ``StepLog.write``)."""
        body = (int(record["step"]), step_metrics(record, samples_per_s))
        for c in self.channels:
            c.put(("step", body))

    def validation(self, result: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        """A validation run's result (status.progress.validation's fields) and its samples."""
        names = ("rewardMean", "k", "meanAtK", "passAtK", "samples", "failed", "seconds")
        metrics = {
            f"validation/{k}": float(result[k]) for k in names if isinstance(result.get(k), (int, float))
        }
        table = [{k: r.get(k) for k in ("prompt", "response", "reward")} for r in rows]
        for c in self.channels:
            c.put(("validation", (int(result.get("step") or 0), metrics, table)))

    def status(self) -> dict[str, dict[str, Any]]:
        """Each backend's state: ready, reason (Logging, Starting, Unauthorized, Unreachable, Error),
        message and, when known, the run's url."""
        return {c.sink.backend: dict(c.status) for c in self.channels}

    def close(self, timeout: float = 30.0) -> None:
        """Log what is queued (waiting at most ``timeout``), then close the runs."""
        deadline = time.monotonic() + timeout
        for c in self.channels:
            c.put(None)
        for c in self.channels:
            c.thread.join(max(0.0, deadline - time.monotonic()))
        self.closing.set()
        for c in self.channels:
            c.thread.join(1.0)


def from_spec(
    spec: Any, namespace: str, job: str, state_dir: pathlib.Path, metrics: metrics_mod.Bound | None
) -> Tracker | None:
    """The tracker of spec.tracking (``asyncrl_api.tracking.TrackingSpec``), or None without one. ``spec``
    is the whole AsyncRLJobSpec: it is logged as the run's parameters."""
    tracking = spec.tracking
    if tracking is None:
        return None
    import importlib.metadata  # noqa: PLC0415

    out: list[sinks_mod.Sink] = []
    if tracking.mlflow is not None:
        # the client's own retries would hold a call for minutes; the channel retries instead
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        out.append(sinks_mod.MlflowSink(tracking.mlflow.tracking_uri, tracking.mlflow.experiment))
    if tracking.wandb is not None:
        w = tracking.wandb
        out.append(sinks_mod.WandbSink(w.project, w.entity, w.mode, w.base_url, state_dir / "wandb"))
    if tracking.tensorboard is not None:
        out.append(sinks_mod.TensorBoardSink(pathlib.Path(tracking.tensorboard.log_dir) / job))
    try:
        version = importlib.metadata.version("asyncrl")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    params = flatten(spec.model_dump(mode="json", by_alias=True))
    params["asyncrl.version"] = version
    tags = {
        "asyncrl.namespace": namespace,
        "asyncrl.job": job,
        "asyncrl.uid": os.environ.get(JOB_UID_ENV, ""),
    }
    name = (tracking.mlflow.run_name if tracking.mlflow is not None else None) or job
    return Tracker(out, state_dir / STATE_NAME, name, tags, params, metrics)
