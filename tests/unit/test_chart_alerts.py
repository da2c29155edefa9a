"""The chart's PrometheusRule, checked and evaluated by the real promtool (Debian `prometheus` package).

`promtool check rules` on the groups the chart renders, then `promtool test rules`: for every alert a
faulty job (series shaped like the fault) must fire it at the expected time with the expected labels,
and a healthy job beside it must not. Only the annotations are stripped before the unit test (promtool
compares them verbatim; the check above covers their templates).
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml
from asyncrl_testing import chart

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "asyncrl-operator"


def promtool() -> str:
    found = shutil.which("promtool") or (
        "/usr/bin/promtool" if os.access("/usr/bin/promtool", os.X_OK) else None
    )
    if not found:
        pytest.fail("promtool not found: apt-get install -y prometheus (tools/setup.sh does)")
    return found


def rendered_groups(*sets: str) -> list[dict[str, Any]]:
    args = ["template", chart.RELEASE, str(chart.CHART), "--kube-version", chart.KUBE_VERSION]
    for item in ("prometheusRule.enabled=true", *sets):
        args += ["--set", item]
    done = chart.helm(*args)
    (rule,) = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "PrometheusRule"]
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def run_promtool(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_promtool_check_rules_passes_on_the_rendered_groups(tmp_path: pathlib.Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rendered_groups()}))
    done = run_promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 10 rules found" in done.stdout, done.stdout


def test_every_alert_has_a_runbook() -> None:
    for group in rendered_groups():
        for rule in group["rules"]:
            notes = rule["annotations"]
            assert notes["summary"] and notes["description"] and len(notes["runbook"]) > 80, rule["alert"]
            assert notes["runbook_url"].endswith("#" + rule["alert"].lower()), rule["alert"]
            readme = (CHART / "README.md").read_text().lower()
            assert f"### {rule['alert'].lower()}" in readme, (
                f"README has no runbook section for {rule['alert']}"
            )


def W(name: str, job: str, role: str = "trainer", **extra: str) -> str:  # noqa: N802 - a series selector
    labels = {"namespace": "ml", "job": job, "role": role, "replica": "0", **extra}
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def fires(alert: str, at: str, *jobs: str, severity: str) -> dict[str, Any]:
    """`alert` fires at `at` for exactly `jobs` (none: one alert without job labels)."""
    if not jobs:
        return {"eval_time": at, "alertname": alert, "exp_alerts": [{"exp_labels": {"severity": severity}}]}
    exp = [{"exp_labels": {"severity": severity, "namespace": "ml", "job": j}} for j in jobs]
    return {"eval_time": at, "alertname": alert, "exp_alerts": exp}


def silent(alert: str, at: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


def bucket_series(job: str, counts_per_min: dict[str, int]) -> list[dict[str, str]]:
    """A histogram whose every observation falls into the first bucket >= its value (cumulative)."""
    out, running = [], 0
    for le in ("1", "10", "60", "120", "+Inf"):
        running += counts_per_min.get(le, 0)
        out.append(
            {"series": W("asyncrl_weight_sync_seconds_bucket", job, le=le), "values": f"0+{running}x60"}
        )
    return out


def gateway_requests(job: str, route: str, code: str, per_min: float) -> dict[str, str]:
    return {
        "series": W("asyncrl_gateway_requests_total", job, role="rollout", route=route, code=code),
        "values": f"0+{per_min}x60",
    }


def gateway_sessions(job: str, state: str, per_min: float) -> dict[str, str]:
    return {
        "series": W("asyncrl_gateway_sessions_total", job, role="rollout", state=state),
        "values": f"0+{per_min}x60",
    }


def endpoint_requests(
    job: str, endpoint: str, code: str, per_min: float | str, replica: str = "0"
) -> dict[str, str]:
    """`per_min` attempts a minute answered `code`, or a promtool series notation (a str)."""
    role = "trainer" if endpoint == "teacher" else "rollout"
    return {
        "series": W(
            "asyncrl_endpoint_requests_total", job, role, endpoint=endpoint, code=code, replica=replica
        ),
        "values": per_min if isinstance(per_min, str) else f"0+{per_min}x60",
    }


def endpoint_fires(at: str, *jobs_endpoints: tuple[str, str]) -> dict[str, Any]:
    """AsyncRLEndpointErrors fires at `at` for exactly these (job, endpoint) pairs."""
    labels = [{"severity": "warning", "namespace": "ml", "job": j, "endpoint": e} for j, e in jobs_endpoints]
    return {
        "eval_time": at,
        "alertname": "AsyncRLEndpointErrors",
        "exp_alerts": [{"exp_labels": x} for x in labels],
    }


SCENARIOS: list[dict[str, Any]] = [
    {  # the trainer stops advancing at minute 10 ("stuck"), and the trainer of "gone" vanishes at minute 10
        "input_series": [
            {"series": W("asyncrl_trainer_step", "stuck"), "values": "0+1x10 10x50"},
            {"series": W("asyncrl_trainer_step", "healthy"), "values": "0+1x60"},
            {"series": W("asyncrl_trainer_step", "gone"), "values": "0+1x10 stale"},
            {"series": W("asyncrl_param_version", "gone", role="rollout"), "values": "0+1x60"},
        ],
        "alert_rule_test": [
            silent("AsyncRLTrainerStalled", "15m"),
            fires("AsyncRLTrainerStalled", "40m", "gone", "stuck", severity="critical"),
        ],
    },
    {  # half of what reaches the trainer is stale in "stale"; 1 in 60 in "healthy"
        "input_series": [
            {"series": W("asyncrl_trajectories_dropped_total", "stale", reason="stale"), "values": "0+60x60"},
            {"series": W("asyncrl_trajectories_consumed_total", "stale"), "values": "0+60x60"},
            {
                "series": W("asyncrl_trajectories_dropped_total", "healthy", reason="stale"),
                "values": "0+1x60",
            },
            {"series": W("asyncrl_trajectories_consumed_total", "healthy"), "values": "0+60x60"},
        ],
        "alert_rule_test": [
            silent("AsyncRLStaleSamplesDropped", "5m"),
            fires("AsyncRLStaleSamplesDropped", "30m", "stale", severity="warning"),
        ],
    },
    {  # the queue grows 10/min in "backlog"; holds steady in "healthy"; "old" holds a 20-minute-old sample
        "input_series": [
            {"series": W("asyncrl_queue_depth", "backlog"), "values": "0+10x60"},
            {"series": W("asyncrl_queue_depth", "healthy"), "values": "50x60"},
            {"series": W("asyncrl_queue_oldest_age_seconds", "healthy"), "values": "30x60"},
            {"series": W("asyncrl_queue_oldest_age_seconds", "old"), "values": "0+60x60"},
        ],
        "alert_rule_test": [
            silent("AsyncRLQueueBacklogGrowing", "10m"),
            fires("AsyncRLQueueBacklogGrowing", "40m", "backlog", "old", severity="warning"),
        ],
    },
    {  # "slow" transfers take 60-120 s; "fast" ones under a second
        "input_series": [*bucket_series("slow", {"120": 2}), *bucket_series("fast", {"1": 2})],
        "alert_rule_test": [
            silent("AsyncRLWeightSyncSlow", "10m"),
            fires("AsyncRLWeightSyncSlow", "40m", "slow", severity="warning"),
        ],
    },
    {  # rollouts of "lagging" stay on version 1 while its trainer keeps broadcasting
        "input_series": [
            {"series": W("asyncrl_param_version", "lagging"), "values": "0+1x60"},
            {"series": W("asyncrl_param_version", "lagging", role="rollout"), "values": "1x60"},
            {"series": W("asyncrl_param_version", "healthy"), "values": "0+1x60"},
            {"series": W("asyncrl_param_version", "healthy", role="rollout"), "values": "0+1x60"},
        ],
        "alert_rule_test": [
            silent("AsyncRLWeightSyncFailing", "5m"),
            fires("AsyncRLWeightSyncFailing", "30m", "lagging", severity="critical"),
        ],
    },
    {  # new session groups: "throttled" gets 429 for 10 of 11 (1/s, amid many 200s on chat, which do not
        # count); "busy" 429s at 1/s but only for 3 of 10; "quiet" only 429s, but 1 a minute (under the floor)
        "input_series": [
            gateway_requests("throttled", "groups", "429", 50),
            gateway_requests("throttled", "sessions", "429", 10),
            gateway_requests("throttled", "groups", "200", 6),
            gateway_requests("throttled", "chat", "200", 600),
            gateway_requests("busy", "groups", "429", 60),
            gateway_requests("busy", "groups", "200", 140),
            gateway_requests("quiet", "sessions", "429", 1),
        ],
        "alert_rule_test": [
            silent("AsyncRLGatewayThrottling", "5m"),
            fires("AsyncRLGatewayThrottling", "30m", "throttled", severity="warning"),
        ],
    },
    {  # sessions: "leaky" has 3 of 4 expire (0.1/s); "healthy" 1 in 61; "rare" only expiries, 1 in 5 minutes
        "input_series": [
            gateway_sessions("leaky", "expired", 6),
            gateway_sessions("leaky", "ended", 2),
            gateway_sessions("healthy", "expired", 1),
            gateway_sessions("healthy", "ended", 60),
            gateway_sessions("rare", "expired", 0.2),
            gateway_sessions("rare", "ended", 0),
        ],
        "alert_rule_test": [
            silent("AsyncRLGatewaySessionsExpiring", "10m"),
            fires("AsyncRLGatewaySessionsExpiring", "40m", "leaky", severity="warning"),
        ],
    },
    {  # endpoints: "keyless" gets 401 for 1 in 2 judge calls (two replicas, the failures on one) while its
        # teacher is fine; "flaky" has 1 in 10 judge calls refused (under 0.2); "down" reaches its teacher
        # never again from minute 10 (Unreachable, no HTTP answer), its judge fine
        "input_series": [
            endpoint_requests("keyless", "judge", "200", 60),
            endpoint_requests("keyless", "judge", "401", 60, replica="1"),
            endpoint_requests("keyless", "teacher", "200", 60),
            endpoint_requests("flaky", "judge", "200", 54),
            endpoint_requests("flaky", "judge", "Unreachable", 6),
            endpoint_requests("down", "judge", "200", 60),
            endpoint_requests("down", "teacher", "200", "0+30x10 300x50"),
            endpoint_requests("down", "teacher", "Unreachable", "0x10 0+10x50"),
        ],
        "alert_rule_test": [
            silent("AsyncRLEndpointErrors", "4m"),
            endpoint_fires("12m", ("keyless", "judge")),
            endpoint_fires("30m", ("down", "teacher"), ("keyless", "judge")),
        ],
    },
    {  # the operator: one job Failed from minute 5; reconcile errors at 0.1/s
        "input_series": [
            {"series": 'asyncrl_jobs{phase="Failed"}', "values": "0x5 1x30"},
            {"series": 'asyncrl_jobs{phase="Running"}', "values": "2x35"},
            {"series": "asyncrl_operator_reconcile_errors_total", "values": "0x5 0+6x30"},
        ],
        "alert_rule_test": [
            silent("AsyncRLJobFailed", "4m"),
            silent("AsyncRLOperatorReconcileErrors", "10m"),
            fires("AsyncRLJobFailed", "8m", severity="warning"),
            fires("AsyncRLOperatorReconcileErrors", "30m", severity="warning"),
        ],
    },
]


def test_each_alert_fires_on_its_fault_and_not_on_a_healthy_job(tmp_path: pathlib.Path) -> None:
    groups = rendered_groups()
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    tested = {t["alertname"] for s in SCENARIOS for t in s["alert_rule_test"] if t["exp_alerts"]}
    assert tested == {r["alert"] for g in groups for r in g["rules"]}, "every alert needs a firing scenario"
    tests = [{"interval": "1m", **scenario} for scenario in SCENARIOS]
    (tmp_path / "test.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests})
    )
    done = run_promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_thresholds_come_from_values() -> None:
    groups = rendered_groups(
        "prometheusRule.thresholds.trainerStalledFor=2m",
        "prometheusRule.thresholds.weightSyncSeconds=5",
        "prometheusRule.thresholds.gatewayThrottledRate=2",
    )
    rules = {r["alert"]: r for g in groups for r in g["rules"]}
    assert rules["AsyncRLTrainerStalled"]["for"] == "2m"
    assert 'changes(asyncrl_trainer_step{role="trainer"}[2m])' in rules["AsyncRLTrainerStalled"]["expr"]
    assert rules["AsyncRLWeightSyncSlow"]["expr"].rstrip().endswith("> 5")
    assert "[10m])) > 2\n" in rules["AsyncRLGatewayThrottling"]["expr"]


def test_endpoint_alert_reads_the_endpoint_requests_the_workloads_export() -> None:
    """AsyncRLEndpointErrors reads only asyncrl_endpoint_requests_total, per endpoint, non-2xx over all,
    and its threshold is a value."""
    from asyncrl_workloads import metrics as workload_metrics

    rules = {r["alert"]: r for g in rendered_groups() for r in g["rules"]}
    expr = rules["AsyncRLEndpointErrors"]["expr"]
    names = set(re.findall(r"\basyncrl_[a-z0-9_]+", expr))
    assert names == {workload_metrics.ENDPOINT_REQUESTS._name + "_total"}, names
    assert 'code!~"2.."' in expr and expr.count("by (namespace, job, endpoint)") == 2, expr
    assert rules["AsyncRLEndpointErrors"]["for"] == "5m"
    assert expr.rstrip().endswith("> 0.2"), expr
    changed = {
        r["alert"]: r
        for g in rendered_groups("prometheusRule.thresholds.endpointErrorRatio=1")  # --set: ints only
        for r in g["rules"]
    }
    assert changed["AsyncRLEndpointErrors"]["expr"].rstrip().endswith("> 1")


def test_gateway_alerts_name_only_gateway_metrics_the_workloads_export() -> None:
    """The gateway alerts exist and read only series of workloads/metrics.py, with its label values."""
    from asyncrl_workloads import metrics as workload_metrics

    rules = {r["alert"]: r for g in rendered_groups() for r in g["rules"]}
    exported = {
        workload_metrics.GATEWAY_REQUESTS._name + "_total",
        workload_metrics.GATEWAY_SESSIONS._name + "_total",
    }
    for alert in ("AsyncRLGatewayThrottling", "AsyncRLGatewaySessionsExpiring"):
        names = set(re.findall(r"\basyncrl_[a-z0-9_]+", rules[alert]["expr"]))
        assert names and names <= exported, (alert, names)
    states = set(re.findall(r'state=~?"([a-z|]+)"', rules["AsyncRLGatewaySessionsExpiring"]["expr"]))
    assert {s for group in states for s in group.split("|")} <= set(workload_metrics.GATEWAY_SESSION_STATES)
