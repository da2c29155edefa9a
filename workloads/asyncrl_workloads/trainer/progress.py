"""Trainer rank 0's progress report: status.progress of the AsyncRLJob, or a JSON file locally.

Called by trainer/loop.py after every step (`Reporter.report` throttles to one write per
spec.progress.reportIntervalSeconds unless forced). Two sinks:

- `ApiServerSink` (in a pod): server-side apply of `status.progress` on the job's status subresource
  under the field manager `asyncrl-trainer`, authenticated with the pod's ServiceAccount token (the
  per-job ServiceAccount whose Role names only this job). Only `progress` is sent, so the operator's
  fields (phase, conditions, replicas) are never touched.
- `FileSink` (local runner): the same object plus local extras written atomically to the file named
  by ASYNCRL_PROGRESS_FILE.

A failed report is logged and training goes on: progress is advisory, the trainer never stops for it.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, Protocol

from asyncrl_workloads.trainer import checkpoint

log = logging.getLogger(__name__)

SA_DIR = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
FIELD_MANAGER = "asyncrl-trainer"
PROGRESS_FILE_ENV = "ASYNCRL_PROGRESS_FILE"


class Sink(Protocol):
    def write(self, progress: dict[str, Any], extras: dict[str, Any]) -> None: ...


class FileSink:
    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def write(self, progress: dict[str, Any], extras: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.write_atomic(self.path, json.dumps({"progress": progress, **extras}, sort_keys=True))


class ApiServerSink:
    def __init__(self, namespace: str, job: str, host: str, port: str, sa_dir: pathlib.Path = SA_DIR) -> None:
        self.url = (
            f"https://{host}:{port}/apis/asyncrl.dev/v1alpha1/namespaces/{namespace}/asyncrljobs/{job}/status"
            f"?fieldManager={FIELD_MANAGER}&force=true"
        )
        self.namespace, self.job = namespace, job
        self.sa_dir = sa_dir
        self.context = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))

    def write(self, progress: dict[str, Any], extras: dict[str, Any]) -> None:
        del extras
        body = {
            "apiVersion": "asyncrl.dev/v1alpha1",
            "kind": "AsyncRLJob",
            "metadata": {"name": self.job, "namespace": self.namespace},
            "status": {"progress": progress},
        }
        token = (self.sa_dir / "token").read_text().strip()  # re-read: projected tokens rotate
        request = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode(),
            method="PATCH",
            headers={"Content-Type": "application/apply-patch+yaml", "Authorization": f"Bearer {token}"},
        )
        with urllib.request.urlopen(request, timeout=5, context=self.context) as response:
            response.read()


def sink_from_env(namespace: str, job: str) -> Sink | None:
    """The file sink when ASYNCRL_PROGRESS_FILE is set, the apiserver in a pod, else nothing."""
    if os.environ.get(PROGRESS_FILE_ENV):
        return FileSink(pathlib.Path(os.environ[PROGRESS_FILE_ENV]))
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    if host and (SA_DIR / "token").exists():
        return ApiServerSink(namespace, job, host, os.environ.get("KUBERNETES_SERVICE_PORT", "443"))
    return None


def rfc3339(unix: float, millis: bool = False) -> str:
    """RFC 3339 in UTC, whole seconds, or with milliseconds (``millis``: the report time
    spec.rollout.autoscale divides consumed samples by, over windows of a few seconds locally)."""
    if not millis:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix)) + f".{int(unix % 1 * 1000):03d}Z"


class Reporter:
    def __init__(
        self, sink: Sink | None, interval_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.sink = sink
        self.interval_s = interval_s
        self._clock = clock
        self._last = float("-inf")
        self.failures = 0

    def report(self, progress: dict[str, Any], extras: dict[str, Any], force: bool = False) -> bool:
        """Write if the interval has passed (or `force`); True if a write was attempted and succeeded."""
        if self.sink is None or (not force and self._clock() - self._last < self.interval_s):
            return False
        self._last = self._clock()
        try:
            self.sink.write(progress, extras)
            return True
        except (OSError, urllib.error.URLError, ssl.SSLError) as exc:
            self.failures += 1
            if self.failures in (1, 10) or self.failures % 100 == 0:
                log.warning("progress report failed (%d so far): %s", self.failures, exc)
            return False
