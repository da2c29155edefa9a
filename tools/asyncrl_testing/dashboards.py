"""The chart's Grafana dashboards as the e2e tests ask a real Prometheus: every panel's PromQL with
Grafana's variables filled in, polled until it shows data.

Called by tests/e2e/test_observability.py (every row but the agent gateway's and the endpoints', against an
agent-loop run), tests/e2e/test_gateway_learning.py (the agent gateway's row, against a gateway run) and
tests/e2e/test_judge_learning.py (the endpoints' row, against a judge-rewarded run) and
tests/e2e/test_tracking.py (the experiment-tracking row, against a tracked run): a job has one agent loop
and its own reward, so no single run fills every row.
"""

from __future__ import annotations

import json
import math
import pathlib
import time
from collections.abc import Callable, Iterable
from typing import Any

from asyncrl_testing import prometheus as prometheus_server

REPO = pathlib.Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "charts" / "asyncrl-operator" / "dashboards").glob("*.json"))
JOB_BOARD = REPO / "charts" / "asyncrl-operator" / "dashboards" / "asyncrl-job.json"
GATEWAY_ROW = "Agent gateway"
"""The job dashboard's row that only an `agent.loop: gateway` job fills."""
ENDPOINT_ROW = "Judge and teacher endpoints"
"""The job dashboard's row that only a job with `reward.type: judge` or `spec.teacher` fills."""
TRACKING_ROW = "Experiment tracking"
"""The job dashboard's row that only a job with `spec.tracking` fills."""
AUTOSCALE_ROW = "Elastic rollouts"
"""The job dashboard's row that only a job with `spec.rollout.autoscale` fills (the operator's metrics)."""
RATE_WINDOW = "30s"
"""What `$__rate_interval` becomes: 30 scrapes at the tests' 1 s interval."""

Query = tuple[str, str]
"""(what it is, e.g. the panel's title; PromQL)."""


def load(path: pathlib.Path) -> dict[str, Any]:
    board: dict[str, Any] = json.loads(path.read_text())
    return board


def row_titles(board: dict[str, Any]) -> list[str]:
    return [item["title"] for item in board["panels"] if item["type"] == "row"]


def panel_queries(
    board: dict[str, Any], skip_rows: tuple[str, ...] = (), only_rows: tuple[str, ...] | None = None
) -> list[Query]:
    """(panel title, expr) for every target of every panel of the rows ``only_rows`` (default: every
    row) but ``skip_rows``; panels above the first row are in the row ""."""
    out = []
    row = ""
    for item in board["panels"]:
        if item["type"] == "row":
            row = item["title"]
        if row in skip_rows or (only_rows is not None and row not in only_rows):
            continue
        for panel in item.get("panels", []) if item["type"] == "row" else [item]:
            out += [(panel["title"], t["expr"]) for t in panel["targets"]]
    return out


def substitute(expr: str, namespace: str, job: str, rate_window: str = RATE_WINDOW) -> str:
    """``expr`` with Grafana's variables filled as the dashboards' selectors would fill them."""
    for var, value in {"$__rate_interval": rate_window, "$namespace": namespace, "$job": job}.items():
        expr = expr.replace(var, value)
    return expr


Result = list[dict[str, Any]]


def non_empty(result: Result) -> bool:
    return bool(result)


def has_number(result: Result) -> bool:
    """At least one sample is a number. `histogram_quantile` over a window without observations, or a
    ratio of two zero rates, answers NaN: a non-empty result that draws nothing on the panel."""
    return any(not math.isnan(float(sample["value"][1])) for sample in result)


def without_data(
    prom: prometheus_server.Prometheus,
    queries: Iterable[Query],
    timeout: float = 60.0,
    shows: Callable[[Result], bool] = non_empty,
) -> list[str]:
    """The queries (as "name: expr") whose answer never ``shows`` data; each is retried every second until
    one deadline, ``timeout`` seconds from now, shared by all (a series may appear a scrape late)."""
    failed = []
    deadline = time.monotonic() + timeout
    for name, expr in queries:
        while not shows(prom.query(expr)) and time.monotonic() < deadline:
            time.sleep(1)
        if not shows(prom.query(expr)):
            failed.append(f"{name}: {expr}")
    return failed
