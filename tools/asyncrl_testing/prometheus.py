"""A real Prometheus server (Debian package `prometheus`) scraping targets the caller names.

Called by the `prometheus` fixture in tests/dataplane/conftest.py (and any test that wants to check what
Prometheus sees). It never touches the package's system service or port 9090: every instance gets a free
port, its own config and a temporary TSDB directory, scrapes every second, and is stopped with its whole
process group. `query(expr)` answers instant queries through the HTTP API.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml
from asyncrl_workloads.local import process

BINARY_CANDIDATES = ("/usr/bin/prometheus", "/usr/local/bin/prometheus")
SCRAPE_INTERVAL = "1s"
READY_TIMEOUT_S = 30.0

Targets = Sequence[str] | Mapping[str, Sequence[str]]


class PrometheusError(RuntimeError):
    """Prometheus is missing, did not start, or answered a query with an error."""


def find_binary() -> pathlib.Path:
    for candidate in BINARY_CANDIDATES:
        if pathlib.Path(candidate).is_file():
            return pathlib.Path(candidate)
    found = shutil.which("prometheus")
    if found:
        return pathlib.Path(found)
    raise PrometheusError("prometheus not found: run tools/setup.sh (or apt-get install -y prometheus)")


def render_config(
    targets: Targets, honor_labels: bool = False, rule_files: Sequence[str] = ()
) -> dict[str, Any]:
    """A Prometheus config scraping `targets` ("host:port" list, or job name -> list) every second.

    `honor_labels` keeps the scraped series' own `job`/`namespace` labels (the AsyncRLJob's), as the
    chart's ServiceMonitor/PodMonitor do; `rule_files` are evaluated every second (alerting rules).
    """
    jobs = {"asyncrl": list(targets)} if not isinstance(targets, Mapping) else dict(targets)
    out: dict[str, Any] = {
        "global": {
            "scrape_interval": SCRAPE_INTERVAL,
            "scrape_timeout": SCRAPE_INTERVAL,
            "evaluation_interval": SCRAPE_INTERVAL,
        },
        "scrape_configs": [
            {
                "job_name": job,
                "static_configs": [{"targets": list(addresses)}],
                **({"honor_labels": True} if honor_labels else {}),
            }
            for job, addresses in jobs.items()
        ],
    }
    if rule_files:
        out["rule_files"] = list(rule_files)
    return out


class Prometheus:
    """A running Prometheus; `query` and `wait_for` use its HTTP API."""

    def __init__(self, child: process.Child, port: int, workdir: pathlib.Path) -> None:
        self.child = child
        self.port = port
        self.workdir = workdir

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            return json.loads(response.read())

    def ready(self) -> bool:
        with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as response:
            return bool(response.status == 200)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; returns the `data.result` vector (each item has `metric` and `value`)."""
        try:
            body = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        except urllib.error.HTTPError as exc:
            raise PrometheusError(f"query {expr!r} failed: HTTP {exc.code} {exc.read()[:300]!r}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"query {expr!r} failed: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def scalar(self, expr: str) -> float | None:
        """The value of a single-sample instant query, or None when the result is empty."""
        result = self.query(expr)
        if not result:
            return None
        if len(result) > 1:
            raise PrometheusError(f"query {expr!r} returned {len(result)} series, expected one")
        return float(result[0]["value"][1])

    def targets_health(self) -> dict[str, str]:
        """scrape URL -> health ("up", "down", "unknown") for every active target."""
        body = self._get("/api/v1/targets?state=active")
        return {t["scrapeUrl"]: t["health"] for t in body["data"]["activeTargets"]}

    def wait_for(self, expr: str, predicate: Callable[[float], bool], timeout: float = 20.0) -> float:
        """Poll `expr` until its single value satisfies `predicate`; return that value."""
        deadline = time.monotonic() + timeout
        last: float | None = None
        while time.monotonic() < deadline:
            last = self.scalar(expr)
            if last is not None and predicate(last):
                return last
            time.sleep(0.25)
        raise PrometheusError(
            f"{expr!r} did not reach the expected value within {timeout:.0f}s "
            f"(last value {last}); targets: {self.targets_health()}"
        )

    def stop(self) -> None:
        self.child.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start(
    targets: Targets,
    timeout: float = READY_TIMEOUT_S,
    attempts: int = 3,
    honor_labels: bool = False,
    rule_files: Sequence[str] = (),
) -> Prometheus:
    """Start Prometheus scraping `targets` on a free port; wait for /-/ready (see `render_config`)."""
    binary = find_binary()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="asyncrl-prometheus-"))
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump(render_config(targets, honor_labels, rule_files)))
    last_error: Exception | None = None
    for attempt in range(attempts):
        port = process.free_port()
        argv = [
            str(binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / f'tsdb-{attempt}'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            "--web.enable-lifecycle",
            "--log.level=warn",
        ]
        child = process.Child("prometheus", argv, workdir / "prometheus.log")
        server = Prometheus(child, port, workdir)
        try:
            child.wait_ready(server.ready, timeout)
            return server
        except process.NotReady as exc:
            child.stop()
            last_error = exc
            if "address already in use" not in process.log_tail(child.log_path).lower():
                break
    shutil.rmtree(workdir, ignore_errors=True)
    raise PrometheusError(str(last_error)) from last_error
