"""The Grafana dashboards shipped in charts/asyncrl-operator/dashboards/.

They parse, match their generator (hack/dashboards.py), every panel has a query, every query is valid
PromQL (parsed by the real promtool after Grafana's variables are substituted), and every metric they
name is one the project exports: the Metrics table of docs/metrics.md, cross-checked against the two real
prometheus_client registries (workloads and operator). The e2e test
tests/e2e/test_observability.py runs the same queries against a real scrape.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "asyncrl-operator"
DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))

# The agent gateway's metrics (workloads metrics.py), all shown in the job dashboard's "Agent gateway" row.
GATEWAY_METRICS = {
    "asyncrl_gateway_sessions_active", "asyncrl_gateway_sessions_total", "asyncrl_gateway_requests_total",
    "asyncrl_gateway_ttft_seconds", "asyncrl_gateway_request_seconds", "asyncrl_gateway_tokens_total",
    "asyncrl_gateway_unrewarded_total",
}  # fmt: skip
# The judge and teacher endpoints' metrics (workloads metrics.py), shown in the "Judge and teacher
# endpoints" row with dropped{reason="reward_error"}.
ENDPOINT_METRICS = {
    "asyncrl_endpoint_requests_total", "asyncrl_endpoint_latency_seconds",
    "asyncrl_endpoint_ratelimit_wait_seconds_total", "asyncrl_teacher_kl",
}  # fmt: skip
# docs/metrics.md's table, verbatim. Histograms also export _bucket/_sum/_count; counters end in _total.
WORKLOAD_METRICS = {
    "asyncrl_trajectories_produced_total", "asyncrl_trajectories_consumed_total",
    "asyncrl_trajectories_dropped_total", "asyncrl_queue_depth", "asyncrl_queue_oldest_age_seconds",
    "asyncrl_sample_staleness", "asyncrl_param_version", "asyncrl_weight_sync_seconds",
    "asyncrl_rollout_pause_seconds", "asyncrl_trainer_step", "asyncrl_trainer_idle_ratio",
    "asyncrl_rollout_idle_ratio", "asyncrl_tokens_generated_total", "asyncrl_reward",
    "asyncrl_partial_rollouts_total", "asyncrl_tool_calls_total", "asyncrl_agent_turns",
    "asyncrl_preempted_total",
    # beyond §5: the staleness bound's hold on generation, and the engine's concurrency
    "asyncrl_rollout_admission_blocked_seconds_total", "asyncrl_rollout_inflight_group_seconds_total",
    # beyond §5: the agent loop's tool latency and why its episodes ended
    "asyncrl_tool_seconds", "asyncrl_agent_episodes_total",
    # beyond §5: the agent gateway (gateway/)
    *GATEWAY_METRICS,
    # beyond §5: the judge and teacher endpoints (endpoints/)
    *ENDPOINT_METRICS,
    # beyond §5: validation runs (data.validation, rollout/validation.py)
    "asyncrl_validation_reward", "asyncrl_validation_step", "asyncrl_validation_param_version",
    "asyncrl_validation_samples", "asyncrl_validation_seconds", "asyncrl_validation_mean_at_k",
    "asyncrl_validation_pass_at_k", "asyncrl_validation_k",
    # beyond §5: experiment tracking (spec.tracking, tracking/)
    "asyncrl_tracking_errors_total", "asyncrl_tracking_run_info",
}  # fmt: skip
OPERATOR_METRICS = {
    "asyncrl_operator_reconcile_seconds", "asyncrl_operator_reconcile_errors_total", "asyncrl_jobs",
    "asyncrl_job_restarts_total",
    # beyond §5: spec.rollout.autoscale's decision (autoscaler.py)
    "asyncrl_autoscale_desired_replicas", "asyncrl_autoscale_trainer_wait_fraction",
    "asyncrl_autoscale_rollout_blocked_fraction", "asyncrl_autoscale_changes_total",
    "asyncrl_autoscale_samples_per_second",
}  # fmt: skip
HISTOGRAMS = {"asyncrl_sample_staleness", "asyncrl_weight_sync_seconds", "asyncrl_rollout_pause_seconds",
              "asyncrl_reward", "asyncrl_agent_turns", "asyncrl_tool_seconds",
              "asyncrl_gateway_ttft_seconds", "asyncrl_gateway_request_seconds",
              "asyncrl_endpoint_latency_seconds", "asyncrl_operator_reconcile_seconds"}  # fmt: skip
# What issue 5 asks the dashboards to show, as the metric each panel family needs.
REQUIRED = {
    "asyncrl_queue_depth", "asyncrl_queue_oldest_age_seconds", "asyncrl_trajectories_produced_total",
    "asyncrl_trajectories_consumed_total", "asyncrl_trajectories_dropped_total",
    "asyncrl_sample_staleness_bucket", "asyncrl_param_version", "asyncrl_weight_sync_seconds_bucket",
    "asyncrl_rollout_pause_seconds_bucket", "asyncrl_trainer_idle_ratio", "asyncrl_rollout_idle_ratio",
    "asyncrl_tokens_generated_total", "asyncrl_reward_bucket", "asyncrl_jobs", "asyncrl_job_restarts_total",
    "asyncrl_operator_reconcile_seconds_bucket", "asyncrl_operator_reconcile_errors_total",
    # the agent loop's row
    "asyncrl_tool_calls_total", "asyncrl_agent_episodes_total", "asyncrl_agent_turns_sum",
    "asyncrl_agent_turns_count", "asyncrl_tool_seconds_bucket",
    # the agent gateway's row
    "asyncrl_gateway_sessions_active", "asyncrl_gateway_sessions_total", "asyncrl_gateway_requests_total",
    "asyncrl_gateway_ttft_seconds_bucket", "asyncrl_gateway_request_seconds_bucket",
    "asyncrl_gateway_tokens_total", "asyncrl_gateway_unrewarded_total",
    # the judge and teacher endpoints' row (issue 20)
    "asyncrl_endpoint_requests_total", "asyncrl_endpoint_latency_seconds_bucket",
    "asyncrl_endpoint_ratelimit_wait_seconds_total", "asyncrl_teacher_kl",
}  # fmt: skip

# Values the e2e test and this test give Grafana's variables.
SUBSTITUTIONS = {"$__rate_interval": "1m", "$namespace": "default", "$job": "tiny", "${datasource}": "prom"}

PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "le", "inf", "nan",
}  # fmt: skip


def known_series_names() -> set[str]:
    names = set(WORKLOAD_METRICS | OPERATOR_METRICS)
    for hist in HISTOGRAMS:
        names |= {f"{hist}_bucket", f"{hist}_sum", f"{hist}_count"}
    return names


def load(path: pathlib.Path) -> dict[str, Any]:
    board: dict[str, Any] = json.loads(path.read_text())
    return board


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for item in board["panels"]:
        if item["type"] == "row":
            out += item.get("panels", [])
        else:
            out.append(item)
    return out


def queries(board: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in panels(board) for t in p["targets"]]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["query"]["query"])
    return exprs


def substitute(expr: str) -> str:
    for var, value in SUBSTITUTIONS.items():
        expr = expr.replace(var, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """Series names in a PromQL expression (label matchers, strings, ranges and grouping removed)."""
    expr = re.sub(r"label_values\((.*),\s*\w+\)$", r"\1", expr)  # Grafana's variable query
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        follows = text[match.end() :].lstrip()[:1]
        if follows == "(" or word.lower() in PROMQL_WORDS or re.fullmatch(r"\d+[smhdwy]", word):
            continue
        names.add(word)
    return names


def test_dashboards_are_the_generator_output() -> None:
    spec = importlib.util.spec_from_file_location("chart_dashboards", CHART / "hack" / "dashboards.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    generated = module.render()
    assert sorted(generated) == [p.name for p in DASHBOARDS]
    for path in DASHBOARDS:
        assert path.read_text() == generated[path.name], f"{path.name} is stale: run hack/dashboards.py"


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_dashboard_is_well_formed(path: pathlib.Path) -> None:
    board = load(path)
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "namespace"} <= variables
    for panel in panels(board):
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert target["expr"].strip() and target["refId"]


def test_job_dashboard_selects_one_job() -> None:
    board = load(CHART / "dashboards" / "asyncrl-job.json")
    assert "job" in {v["name"] for v in board["templating"]["list"]}
    for panel in panels(board):
        for target in panel["targets"]:
            assert 'job="$job"' in target["expr"], f"{panel['title']!r} ignores the job variable"


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_queries_name_only_exported_metrics(path: pathlib.Path) -> None:
    known = known_series_names()
    for expr in queries(load(path)):
        found = metric_names(expr)
        assert found, f"no metric in {expr!r}"
        assert found <= known, f"{sorted(found - known)} in {expr!r} are not in docs/metrics.md"


def test_dashboards_cover_what_the_issue_lists() -> None:
    used = set().union(*(metric_names(e) for p in DASHBOARDS for e in queries(load(p))))
    assert used >= REQUIRED, f"no panel shows {sorted(REQUIRED - used)}"


def row_panels(board: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """The panels between row `title` and the next row (rows are not collapsed)."""
    items = board["panels"]
    start = next(i for i, item in enumerate(items) if item["type"] == "row" and item["title"] == title)
    out = []
    for item in items[start + 1 :]:
        if item["type"] == "row":
            break
        out.append(item)
    return out


def test_job_dashboard_has_an_agent_gateway_row_on_the_gateway_metrics() -> None:
    board = load(CHART / "dashboards" / "asyncrl-job.json")
    gateway = row_panels(board, "Agent gateway")
    used = set().union(*(metric_names(t["expr"]) for p in gateway for t in p["targets"]))
    histograms = {"asyncrl_gateway_ttft_seconds", "asyncrl_gateway_request_seconds"}
    assert used == (GATEWAY_METRICS - histograms) | {f"{h}_bucket" for h in histograms}
    exprs = [t["expr"] for p in gateway for t in p["targets"]]
    assert any('code="429"' in e and 'route=~"groups|sessions"' in e for e in exprs), "no 429 share"
    for h in histograms:
        quantiles = [e for e in exprs if f"{h}_bucket" in e]
        assert [e.split(",")[0] for e in quantiles] == ["histogram_quantile(0.5", "histogram_quantile(0.95"]
    for p in gateway:
        assert "agent.loop: gateway" in p["description"], p["title"]


def test_job_dashboard_has_an_endpoints_row_on_the_endpoint_metrics() -> None:
    board = load(CHART / "dashboards" / "asyncrl-job.json")
    endpoints = row_panels(board, "Judge and teacher endpoints")
    by_title = {p["title"]: [t["expr"] for t in p["targets"]] for p in endpoints}
    used = set().union(*(metric_names(e) for exprs in by_title.values() for e in exprs))
    assert used == (ENDPOINT_METRICS - {"asyncrl_endpoint_latency_seconds"}) | {
        "asyncrl_endpoint_latency_seconds_bucket",
        "asyncrl_trajectories_dropped_total",
    }
    (ratio,) = by_title["Endpoint error ratio"]
    assert 'code!~"2.."' in ratio and ratio.count("sum by (endpoint)") == 3, ratio
    (drops,) = by_title["Reward-error drops / s"]
    assert 'reason="reward_error"' in drops
    latency = by_title["Endpoint latency"]
    assert [e.split(",")[0] for e in latency] == ["histogram_quantile(0.5", "histogram_quantile(0.95"]
    assert all("by (endpoint, le)" in e for e in latency)
    for p in endpoints:
        assert "spec.teacher" in p["description"], p["title"]


def test_job_dashboard_links_each_tracker_run_from_its_url_label() -> None:
    board = load(CHART / "dashboards" / "asyncrl-job.json")
    by_title = {p["title"]: p for p in row_panels(board, "Experiment tracking")}
    runs = by_title["Tracker runs"]
    (target,) = runs["targets"]
    assert target["format"] == "table" and target["instant"] and "by (backend, run_id, url)" in target["expr"]
    (override,) = runs["fieldConfig"]["overrides"]
    assert override["matcher"]["options"] == "url"
    assert override["properties"][0]["value"][0]["url"] == "${__value.raw}"
    (errors,) = by_title["Tracker errors / s by backend"]["targets"]
    assert "asyncrl_tracking_errors_total" in errors["expr"]


def test_metric_name_parser_catches_unknown_names() -> None:
    assert metric_names('sum by (le) (rate(foo_bucket{job="$job"}[5m])) / on (job) bar') == {
        "foo_bucket",
        "bar",
    }
    assert metric_names("label_values(asyncrl_trainer_step, namespace)") == {"asyncrl_trainer_step"}


def test_section5_names_are_what_the_code_registers() -> None:
    """The hard-coded §5 list above is the set of families the two real registries expose."""
    from asyncrl_operator import metrics as operator_metrics
    from asyncrl_workloads import metrics as workload_metrics

    def families(registry: Any) -> set[str]:
        out = set()
        for family in registry.collect():
            out.add(family.name + ("_total" if family.type == "counter" else ""))
        return out

    exported = families(workload_metrics.REGISTRY) | families(operator_metrics.REGISTRY)
    assert exported >= WORKLOAD_METRICS | OPERATOR_METRICS, sorted(
        (WORKLOAD_METRICS | OPERATOR_METRICS) - exported
    )


def exposed_series_names() -> set[str]:
    """Sample names the real registries expose (prometheus_client's own text format), with every
    label child the processes create (workloads.metrics.bind, the agent loop's per tool/outcome and
    per end children, which exist once a call or an episode was counted, the gateway's per
    route/code children, which exist once a route answered, the endpoints' per endpoint/code
    children, which exist once an endpoint was called, and the validation gauges, which exist once a
    validation run ended) present."""
    import prometheus_client
    from asyncrl_api import status as api_status
    from asyncrl_operator import metrics as operator_metrics
    from asyncrl_workloads import metrics as workload_metrics

    identity = ("test-dashboards", "job", "rollout", "0")
    bound = workload_metrics.bind(workload_metrics.Identity(*identity))
    bound.tool_calls_by("lookup", "ok")
    bound.agent_episodes_by("stop")
    bound.gateway_requests_by("groups", 429)
    bound.endpoint_requests_by("judge", "200")
    bound.record_validation(
        step=10, version=10, reward_mean=0.5, samples=4, seconds=1.0, k=2, mean_at_k=0.5, pass_at_k=0.5
    )
    bound.tracking_errors_by("mlflow")
    bound.tracking_run("mlflow", "r1", "http://mlflow/#/experiments/1/runs/r1")
    operator_metrics.set_autoscale(
        identity[0], identity[1], 2, api_status.Utilization(samples_per_second=1.0)
    )
    operator_metrics.count_scale(identity[0], identity[1], "up")
    try:
        registries = (workload_metrics.REGISTRY, operator_metrics.REGISTRY)
        text = b"".join(prometheus_client.generate_latest(r) for r in registries).decode()
    finally:  # leave the process-wide registry as found: drop the children bound above
        operator_metrics.forget(identity[0], identity[1])
        for metric in vars(workload_metrics).values():
            if isinstance(metric, prometheus_client.metrics.MetricWrapperBase):
                for labels in [k for k in metric._metrics if k[: len(identity)] == identity]:
                    metric.remove(*labels)
    return {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.MULTILINE)}


def test_every_series_a_query_names_is_exposed_by_the_code() -> None:
    """E.g. a histogram whose buckets start below zero has no _sum in prometheus_client's output."""
    exposed = exposed_series_names()
    for path in DASHBOARDS:
        for expr in queries(load(path)):
            missing = metric_names(expr) - exposed
            assert not missing, (
                f"{path.name}: {sorted(missing)} are not in the registries' exposition ({expr})"
            )


def test_every_query_is_valid_promql(tmp_path: pathlib.Path) -> None:
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not os.access(promtool, os.X_OK):
        pytest.fail("promtool not found: apt-get install -y prometheus")
    rules = []
    for path in DASHBOARDS:
        for i, expr in enumerate(queries(load(path))):
            if expr.startswith("label_values("):
                continue
            rules.append({"record": f"check:{path.stem.replace('-', '_')}:{i}", "expr": substitute(expr)})
    (tmp_path / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]})
    )
    done = subprocess.run(
        [promtool, "check", "rules", "queries.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
