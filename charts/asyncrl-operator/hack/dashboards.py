"""Generates the chart's Grafana dashboards (dashboards/asyncrl-job.json, dashboards/asyncrl-fleet.json).

Run by hand after changing a panel: `python charts/asyncrl-operator/hack/dashboards.py`; the unit test
tests/unit/test_dashboards.py fails when the committed JSON differs from what this script writes, and
checks every query against the project's metric names (docs/metrics.md).

Conventions every query follows (the e2e test substitutes the same variables):
  $namespace / $job  the AsyncRLJob (workload series carry `namespace` and `job`; monitors set honorLabels)
  $__rate_interval   Grafana's rate window (>= 4 scrape intervals)
Only metrics the project exports are used. The "Agent loop" row of the job dashboard is empty for a job
without `spec.agent` (its rollouts create the tool-call and episode series on the first call/episode);
it comes last and each of its panels says so, so an empty panel there does not read as a broken one.
The "Agent gateway" row after it is the same for a job without `agent.loop: gateway` (its counters stay
at zero, and the per-route request series appear with a route's first request).
The "Judge and teacher endpoints" row last is the same for a job without `reward.type: judge` and
`spec.teacher` (the per-code request series appear with an endpoint's first attempt).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

OUT = pathlib.Path(__file__).resolve().parent.parent / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
JOB = 'namespace="$namespace", job="$job"'
FLEET = 'namespace=~"$namespace"'
RI = "$__rate_interval"


def target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


def panel(
    title: str,
    kind: str,
    targets: list[tuple[str, str]],
    unit: str = "short",
    description: str = "",
    **extra: Any,
) -> dict[str, Any]:
    """A panel; gridPos is filled in by `layout`."""
    body: dict[str, Any] = {
        "title": title,
        "type": kind,
        "datasource": DS,
        "description": description,
        "targets": [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(targets)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
    }
    body.update(extra)
    return body


def row(title: str) -> dict[str, Any]:
    return {"title": title, "type": "row", "collapsed": False, "panels": []}


def layout(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows span the width; panels flow two per line (stat panels four per line)."""
    x, y, line_h = 0, 0, 0
    for pid, item in enumerate(items, start=1):
        item["id"] = pid
        w, h = (24, 1) if item["type"] == "row" else (6, 4) if item["type"] == "stat" else (12, 8)
        if item["type"] == "row" or x + w > 24:
            x, y, line_h = 0, y + line_h, 0
        item["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
        x, line_h = x + w, max(line_h, h)
        if item["type"] == "row":
            x, y, line_h = 0, y + h, 0
    return items


def variable(name: str, query: str, multi: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DS,
        "refresh": 2,
        "sort": 1,
        "query": {"query": query, "refId": name},
        "definition": query,
        "multi": multi,
        "includeAll": multi,
        **({"allValue": ".*"} if multi else {}),
    }


DATASOURCE_VAR = {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"}


def dashboard(
    uid: str, title: str, variables: list[dict[str, Any]], panels: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "tags": ["asyncrl"],
        "editable": True,
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "browser",
        "graphTooltip": 1,
        "templating": {"list": [DATASOURCE_VAR, *variables]},
        "annotations": {"list": []},
        "panels": layout(panels),
    }


def quantiles(
    metric: str, sel: str, by: str = "", qs: tuple[float, ...] = (0.5, 0.9, 0.99)
) -> list[tuple[str, str]]:
    group = f"sum by ({by + ', ' if by else ''}le) (rate({metric}_bucket{{{sel}}}[{RI}]))"
    prefix = "{{" + by + "}} " if by else ""
    return [(f"histogram_quantile({q}, {group})", f"{prefix}p{int(q * 100)}") for q in qs]


AGENT_ONLY = "Empty for a job without spec.agent."


def agent_row() -> list[dict[str, Any]]:
    """The agent loop (episode/loop.py): what the tools did, how episodes ended, how long they ran."""
    calls = f"sum(rate(asyncrl_tool_calls_total{{{JOB}}}[{RI}]))"
    episodes = f"sum(rate(asyncrl_agent_episodes_total{{{JOB}}}[{RI}]))"
    turns = "asyncrl_agent_turns"
    return [
        row("Agent loop"),
        panel(
            "Tool calls / s by outcome",
            "timeseries",
            [(f"sum by (outcome) (rate(asyncrl_tool_calls_total{{{JOB}}}[{RI}]))", "{{outcome}}")],
            unit="ops",
            description="ok; error: the tool raised; timeout: over toolTimeoutSeconds; bad_arguments: "
            "arguments not JSON or not matching the tool's schema; unknown_tool: a name no configured tool "
            "has; malformed: a tool call the parser could not read. " + AGENT_ONLY,
        ),
        panel(
            "Tool calls per episode",
            "timeseries",
            [(f"{calls} / {episodes}", "calls/episode")],
            description="Tool calls (any outcome) per finished episode over the window. " + AGENT_ONLY,
        ),
        panel(
            "Episodes / s by end",
            "timeseries",
            [(f"sum by (ended) (rate(asyncrl_agent_episodes_total{{{JOB}}}[{RI}]))", "{{ended}}")],
            unit="ops",
            description="Why episodes ended: stop (an answer without a tool call), max_turns "
            "(maxAssistantTurns / maxUserTurns), length (the context or a cut turn), budget "
            "(maxEpisodeTokens), invalid_calls (maxConsecutiveInvalidCalls), empty (no token generated). "
            + AGENT_ONLY,
        ),
        panel(
            "Assistant turns per episode",
            "timeseries",
            [(f"sum(rate({turns}_sum{{{JOB}}}[{RI}])) / sum(rate({turns}_count{{{JOB}}}[{RI}]))", "mean")],
            description="Mean assistant turns (engine requests) per finished episode; a quantile would be "
            "interpolated inside the integer buckets. " + AGENT_ONLY,
        ),
        panel(
            "Tool call latency",
            "timeseries",
            quantiles("asyncrl_tool_seconds", JOB, qs=(0.5, 0.95)),
            unit="s",
            description="Seconds per call that reached its tool (outcome ok, error or timeout), as the "
            "loop waited for it. " + AGENT_ONLY,
        ),
    ]


GATEWAY_ONLY = "Zero or empty for a job without agent.loop: gateway."
ADMIT = 'route=~"groups|sessions"'
APIS = 'route=~"chat|completions|messages|count_tokens|responses"'
"""The gateway's model-call routes, one per API (the others are admin and session bookkeeping)."""


def gateway_row() -> list[dict[str, Any]]:
    """The agent gateway (gateway/): its sessions, what its HTTP routes answered, completion latency and
    tokens, and trajectories it could not publish for want of a reward."""
    requests = "asyncrl_gateway_requests_total"
    rollout = f'{JOB}, role="rollout"'
    return [
        row("Agent gateway"),
        panel(
            "Gateway sessions active",
            "timeseries",
            [(f"sum by (replica) (asyncrl_gateway_sessions_active{{{rollout}}})", "rollout {{replica}}")],
            description="Sessions open on each rollout replica (started, not yet ended, expired or aborted). "
            + GATEWAY_ONLY,
        ),
        panel(
            "Gateway sessions / s by state",
            "timeseries",
            [(f"sum by (state) (rate(asyncrl_gateway_sessions_total{{{JOB}}}[{RI}]))", "{{state}}")],
            unit="ops",
            description="started; ended (by the agent, published with its group); expired (no request for "
            "sessionTimeoutSeconds, never published); aborted (open when the replica stopped, never "
            "published). Expired close to ended: agents that never end their sessions lose their work. "
            + GATEWAY_ONLY,
        ),
        panel(
            "Gateway requests / s by code and API",
            "timeseries",
            [
                (f"sum by (code) (rate({requests}{{{JOB}}}[{RI}]))", "{{code}}"),
                (f"sum by (route) (rate({requests}{{{JOB}, {APIS}}}[{RI}]))", "{{route}}"),
            ],
            unit="ops",
            description="HTTP answers of every gateway route by status: 429 no admission (retry), 401 a "
            "wrong key, 404 an unknown session, 409 an ended one, 410 an expired one, 413 a body over "
            "maxBodyBytes; and the model calls by API: chat and completions (OpenAI), messages and "
            "count_tokens (Anthropic's Messages API, Claude Code), responses (OpenAI's Responses API). "
            + GATEWAY_ONLY,
        ),
        panel(
            "Gateway admission refused (429 share)",
            "timeseries",
            [
                (
                    f'sum(rate({requests}{{{JOB}, {ADMIT}, code="429"}}[{RI}])) / '
                    f"sum(rate({requests}{{{JOB}, {ADMIT}}}[{RI}]))",
                    "429 share",
                )
            ],
            unit="percentunit",
            description="Share of /rl/groups and /rl/sessions requests answered 429: the staleness bound "
            "(maxStaleness) or maxInflightPrompts admitted no new group. Near 1, agents wait for the "
            "trainer (see AsyncRLGatewayThrottling). " + GATEWAY_ONLY,
        ),
        panel(
            "Gateway time to first token",
            "timeseries",
            quantiles("asyncrl_gateway_ttft_seconds", JOB, qs=(0.5, 0.95)),
            unit="s",
            description="Seconds from a streamed completion request to its first token. " + GATEWAY_ONLY,
        ),
        panel(
            "Gateway request latency",
            "timeseries",
            quantiles("asyncrl_gateway_request_seconds", JOB, qs=(0.5, 0.95)),
            unit="s",
            description="Seconds from a completion request to its whole response (streamed or not). "
            + GATEWAY_ONLY,
        ),
        panel(
            "Gateway tokens / s by kind",
            "timeseries",
            [(f"sum by (kind) (rate(asyncrl_gateway_tokens_total{{{JOB}}}[{RI}]))", "{{kind}}")],
            description="prompt: tokens fed to the engine per completion (a continued call's whole "
            "context); completion: tokens generated. " + GATEWAY_ONLY,
        ),
        panel(
            "Gateway trajectories unrewarded / s",
            "timeseries",
            [(f"sum(rate(asyncrl_gateway_unrewarded_total{{{JOB}}}[{RI}]))", "unrewarded")],
            unit="ops",
            description="Trajectories not published: the agent set no reward (/rl/reward) and the "
            "session had no data record for the job's reward function to score. " + GATEWAY_ONLY,
        ),
    ]


ENDPOINT_ONLY = "Empty or zero for a job without reward.type: judge and spec.teacher."
ENDPOINT_REQUESTS = "asyncrl_endpoint_requests_total"
NOT_2XX = 'code!~"2.."'


def endpoint_row() -> list[dict[str, Any]]:
    """The OpenAI-compatible endpoints (workloads endpoints/): the judge, called by the rollouts, and the
    teacher, called by trainer rank 0 -- every attempt by answer, the share that failed, latency, time
    held by the token bucket, samples lost to a failed reward, and the distillation's KL."""
    every = f"sum by (endpoint) (rate({ENDPOINT_REQUESTS}{{{JOB}}}[{RI}]))"
    failed = f"sum by (endpoint) (rate({ENDPOINT_REQUESTS}{{{JOB}, {NOT_2XX}}}[{RI}]))"
    return [
        row("Judge and teacher endpoints"),
        panel(
            "Endpoint requests / s by code",
            "timeseries",
            [
                (
                    f"sum by (endpoint, code) (rate({ENDPOINT_REQUESTS}{{{JOB}}}[{RI}]))",
                    "{{endpoint}} {{code}}",
                )
            ],
            unit="ops",
            description="Attempts per second (each retry counts) by endpoint and answer: the HTTP status, or "
            "the error class when no usable answer came (Unreachable: refused, DNS, timeout or proxy; "
            "BadResponse: not JSON or no choices[0]). 401/403: fix the key in the Secret the "
            "endpoint's apiKeySecret names (a stray newline, a wrong key); 404: the model name, or a "
            "doubled /v1 in baseURL; 429: lower rateLimit.rps to the provider's limit; 5xx or Unreachable: "
            "the endpoint's own health. kubectl describe arj <job> shows the last failure in the "
            "EndpointsReady condition. " + ENDPOINT_ONLY,
        ),
        panel(
            "Endpoint error ratio",
            "timeseries",
            [(f"({failed} or 0 * {every}) / {every}", "{{endpoint}}")],
            unit="percentunit",
            description="Share of attempts not answered 2xx (HTTP errors and the classes above). "
            "Retries with back-off absorb a few; a sample whose judge call, or a trajectory whose teacher "
            "call, finally fails is dropped (see reward-error drops). Above 0.2 for 5 minutes "
            "(prometheusRule.thresholds.endpointErrorRatio) AsyncRLEndpointErrors fires: read "
            '"Endpoint requests / s by code" for which answer, and the EndpointsReady condition in '
            "kubectl describe arj <job> for the endpoint and the fix. " + ENDPOINT_ONLY,
        ),
        panel(
            "Endpoint latency",
            "timeseries",
            quantiles("asyncrl_endpoint_latency_seconds", JOB, by="endpoint", qs=(0.5, 0.95)),
            unit="s",
            description="Seconds per attempt, answered or not (token-bucket wait excluded). p95 near the "
            "endpoint's timeoutSeconds: the server is overloaded or maxConcurrency queues too many requests "
            "on it; give it capacity or lower maxConcurrency. A slow judge delays rewards, so rollouts hold "
            "finished samples longer. " + ENDPOINT_ONLY,
        ),
        panel(
            "Token-bucket wait (s / s)",
            "timeseries",
            [
                (
                    f"sum by (endpoint) (rate(asyncrl_endpoint_ratelimit_wait_seconds_total{{{JOB}}}[{RI}]))",
                    "{{endpoint}}",
                )
            ],
            description="Seconds requests waited on the endpoint's token bucket (rateLimit) per second, "
            "summed over concurrent requests: the mean number of requests held back by the limit. Above 0 "
            "with a low error ratio, the limit, not the endpoint, paces scoring: raise rateLimit.rps (and "
            "burst) if the provider allows it; with 429s, lower it instead. " + ENDPOINT_ONLY,
        ),
        panel(
            "Reward-error drops / s",
            "timeseries",
            [
                (
                    "sum by (role) (rate(asyncrl_trajectories_dropped_total"
                    f'{{{JOB}, reason="reward_error"}}[{RI}]))',
                    "{{role}}",
                )
            ],
            unit="ops",
            description="rollout: samples whose judge call finally failed (retries spent, or an answer the "
            "score parser could not read), dropped instead of given a made-up reward; trainer: trajectories "
            "whose teacher logprobs could not be fetched, dropped. Above 0: read the error ratio and the "
            "codes above; an unreadable score means reward.judge.template or its score range does not "
            "match what the judge model answers. " + ENDPOINT_ONLY,
        ),
        panel(
            "Teacher KL",
            "timeseries",
            [(f'asyncrl_teacher_kl{{{JOB}, role="trainer", replica="0"}}', "KL to teacher")],
            description="Mean per-token reverse KL to the teacher (log pi_theta - log pi_teacher) over the "
            "last step's generated tokens, from trainer rank 0. It should fall as the policy distils; flat "
            "or rising, raise spec.teacher.klCoef or check that the teacher serves the policy's tokenizer. "
            "Zero for a job without spec.teacher.",
        ),
    ]


AUTOSCALE_ONLY = "Empty for a job without spec.rollout.autoscale (the operator exports these)."


def autoscale_row() -> list[dict[str, Any]]:
    """spec.rollout.autoscale: replicas asked for and serving, the decision's signals, its changes."""
    return [
        row("Elastic rollouts"),
        panel(
            "Rollout replicas: desired and exporting",
            "timeseries",
            [
                (f"max(asyncrl_autoscale_desired_replicas{{{JOB}}})", "desired (autoscale)"),
                (f'count(asyncrl_param_version{{{JOB}, role="rollout"}})', "exporting metrics"),
            ],
            description="What the last autoscale decision asks for, and the rollout replicas whose "
            "metrics Prometheus scrapes (a new replica appears once its engine serves). " + AUTOSCALE_ONLY,
        ),
        panel(
            "Autoscale signals",
            "timeseries",
            [
                (f"max(asyncrl_autoscale_trainer_wait_fraction{{{JOB}}})", "trainer wait"),
                (f"max(asyncrl_autoscale_rollout_blocked_fraction{{{JOB}}})", "rollouts blocked"),
            ],
            unit="percentunit",
            description="The trainer's share of time waiting for samples (above targetTrainerWaitFraction: "
            "scale up) and the share of its steps that found their batch queued (above maxBlockedFraction: "
            "scale down). " + AUTOSCALE_ONLY,
        ),
        panel(
            "Trainer samples/s (what a scale-up must raise)",
            "timeseries",
            [(f"max(asyncrl_autoscale_samples_per_second{{{JOB}}})", "consumed samples/s")],
            description="Samples the trainer consumed per second over its recent steps. A scale-up that "
            "does not raise it by minScaleUpGain over a scale-up window is undone (ScaleUpUndone). "
            + AUTOSCALE_ONLY,
        ),
        panel(
            "Autoscale changes",
            "timeseries",
            [
                (
                    f"sum by (direction) (increase(asyncrl_autoscale_changes_total{{{JOB}}}[{RI}]))",
                    "{{direction}}",
                )
            ],
            description="Replica changes through /scale; kubectl describe arj lists each as an Event with "
            "its reason. " + AUTOSCALE_ONLY,
        ),
    ]


TRACKING_ONLY = "Empty for a job without spec.tracking."


def tracking_row() -> list[dict[str, Any]]:
    """The job's experiment-tracker runs, each a link to its page (the url label of
    asyncrl_tracking_run_info: MLflow's run page, W&B's online run), and the trackers' errors."""
    trainer = f'{JOB}, role="trainer"'
    runs = panel(
        "Tracker runs",
        "table",
        [(f"max by (backend, run_id, url) (asyncrl_tracking_run_info{{{trainer}}})", "")],
        description="The runs trainer rank 0 logs to (spec.tracking); click a url to open the run. "
        "TensorBoard and W&B offline have no page. " + TRACKING_ONLY,
        options={"showHeader": True},
        transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}}],
    )
    runs["fieldConfig"]["overrides"] = [
        {
            "matcher": {"id": "byName", "options": "url"},
            "properties": [{"id": "links", "value": [{"title": "Open the run", "url": "${__value.raw}"}]}],
        }
    ]
    for t in runs["targets"]:
        t.update(format="table", instant=True, range=False)
    return [
        row("Experiment tracking"),
        runs,
        panel(
            "Tracker errors / s by backend",
            "timeseries",
            [
                (
                    f"sum by (backend) (rate(asyncrl_tracking_errors_total{{{trainer}}}[{RI}]))",
                    "{{backend}}",
                )
            ],
            description="Failed tracker calls, retried with back-off; training goes on. The reason "
            "(Unauthorized, Unreachable, Error) is the TrackingReady condition of kubectl describe arj. "
            + TRACKING_ONLY,
        ),
    ]


def job_dashboard() -> dict[str, Any]:
    panels = [
        row("Progress"),
        panel("Trainer step", "stat", [(f'max(asyncrl_trainer_step{{{JOB}, role="trainer"}})', "step")]),
        panel(
            "Policy version (trainer)",
            "stat",
            [(f'max(asyncrl_param_version{{{JOB}, role="trainer"}})', "v")],
        ),
        panel(
            "Tokens generated / s",
            "stat",
            [(f"sum(rate(asyncrl_tokens_generated_total{{{JOB}}}[{RI}]))", "tok/s")],
        ),
        panel("Queue depth", "stat", [(f"max(asyncrl_queue_depth{{{JOB}}})", "queued")]),
        panel(
            "Trainer steps / min",
            "timeseries",
            [(f'60 * max(deriv(asyncrl_trainer_step{{{JOB}, role="trainer"}}[{RI}]))', "steps/min")],
        ),
        panel(
            "Reward",
            "timeseries",
            [*quantiles("asyncrl_reward", JOB)],
            description="Reward of the trajectories the rollouts produced (asyncrl_reward histogram). "
            "Quantiles, not a mean: its buckets start below 0, and prometheus_client then exports no _sum.",
        ),
        panel(
            "Validation reward",
            "timeseries",
            [(f"max(asyncrl_validation_reward{{{JOB}}})", "validation")],
            description="Mean reward of the last validation run (data.validation: every record once at "
            "temperature 0, by rollout replica 0, every data.validateEverySteps trainer steps); the step "
            "it ran after is asyncrl_validation_step. Empty for a job without a validation set.",
        ),
        row("Trajectory queue"),
        panel(
            "Queue depth",
            "timeseries",
            [(f"max(asyncrl_queue_depth{{{JOB}}})", "depth")],
            description="Trajectories waiting in the NATS JetStream work queue.",
        ),
        panel(
            "Oldest queued trajectory age",
            "timeseries",
            [(f"max(asyncrl_queue_oldest_age_seconds{{{JOB}}})", "oldest")],
            unit="s",
        ),
        panel(
            "Produced / consumed",
            "timeseries",
            [
                (f"sum(rate(asyncrl_trajectories_produced_total{{{JOB}}}[{RI}]))", "produced"),
                (f"sum(rate(asyncrl_trajectories_consumed_total{{{JOB}}}[{RI}]))", "consumed"),
            ],
            unit="ops",
        ),
        panel(
            "Dropped by reason",
            "timeseries",
            [(f"sum by (reason) (rate(asyncrl_trajectories_dropped_total{{{JOB}}}[{RI}]))", "{{reason}}")],
            unit="ops",
            description="queue_full: the queue dropped its oldest; stale: older than maxStaleness; "
            "invalid: failed validation; store_lost: queued when NATS came back without its store.",
        ),
        row("Staleness and policy versions"),
        panel(
            "Sample staleness (versions)",
            "heatmap",
            [(f"sum by (le) (increase(asyncrl_sample_staleness_bucket{{{JOB}}}[{RI}]))", "{{le}}")],
            description="Trainer version at consumption minus the oldest policy version of the sample.",
            options={"calculate": False, "yAxis": {"unit": "short"}, "cellGap": 1},
            **{"targets_format": "heatmap"},
        ),
        panel("Sample staleness quantiles", "timeseries", quantiles("asyncrl_sample_staleness", JOB)),
        panel(
            "Policy version per role",
            "timeseries",
            [
                (f"max by (role) (asyncrl_param_version{{{JOB}}})", "{{role}} max"),
                (f"min by (role) (asyncrl_param_version{{{JOB}}})", "{{role}} min"),
            ],
        ),
        panel(
            "Partial rollouts / s",
            "timeseries",
            [(f"sum(rate(asyncrl_partial_rollouts_total{{{JOB}}}[{RI}]))", "partial")],
            unit="ops",
            description="Requests interrupted by a weight update and continued with the new policy.",
        ),
        row("Weight sync"),
        panel(
            "Weight sync transfer seconds",
            "timeseries",
            quantiles("asyncrl_weight_sync_seconds", JOB),
            unit="s",
        ),
        panel(
            "Rollout pause seconds",
            "timeseries",
            quantiles("asyncrl_rollout_pause_seconds", JOB),
            unit="s",
            description="Generation paused around a weight update (pause -> transfer -> resume).",
        ),
        row("Utilisation"),
        panel(
            "Trainer idle ratio",
            "timeseries",
            [
                (
                    f'max by (replica) (asyncrl_trainer_idle_ratio{{{JOB}, role="trainer"}})',
                    "trainer {{replica}}",
                )
            ],
            unit="percentunit",
            description="Fraction of time the trainer waits for samples.",
        ),
        panel(
            "Rollout idle ratio",
            "timeseries",
            [
                (
                    f'max by (replica) (asyncrl_rollout_idle_ratio{{{JOB}, role="rollout"}})',
                    "rollout {{replica}}",
                )
            ],
            unit="percentunit",
            description="Fraction of time a rollout replica waits (paused or back-pressured).",
        ),
        panel(
            "Tokens generated / s by replica",
            "timeseries",
            [
                (
                    f'sum by (replica) (rate(asyncrl_tokens_generated_total{{{JOB}, role="rollout"}}[{RI}]))',
                    "{{replica}}",
                )
            ],
        ),
        panel(
            "Rollout held back by the staleness bound",
            "timeseries",
            [
                (
                    "sum by (replica) (rate(asyncrl_rollout_admission_blocked_seconds_total"
                    f'{{{JOB}, role="rollout"}}[{RI}]))',
                    "rollout {{replica}}",
                )
            ],
            unit="percentunit",
            description="Fraction of time a rollout had a free generation slot but maxStaleness kept it from "
            "starting a group: near 1, generation waits for the trainer.",
        ),
        panel(
            "Prompt groups in flight",
            "timeseries",
            [
                (
                    "sum by (replica) (rate(asyncrl_rollout_inflight_group_seconds_total"
                    f'{{{JOB}, role="rollout"}}[{RI}]))',
                    "rollout {{replica}}",
                )
            ],
            description="Mean prompt groups generating per rollout (at most rollout.maxInflightPrompts).",
        ),
        *agent_row(),
        *gateway_row(),
        *endpoint_row(),
        *tracking_row(),
        *autoscale_row(),
    ]
    for p in panels:
        if p.pop("targets_format", None):
            for t in p["targets"]:
                t["format"] = "heatmap"
    variables = [
        variable("namespace", 'label_values(asyncrl_trainer_step{role="trainer"}, namespace)'),
        variable("job", 'label_values(asyncrl_trainer_step{namespace="$namespace", role="trainer"}, job)'),
    ]
    return dashboard("asyncrl-job", "asyncrl / job", variables, panels)


def fleet_dashboard() -> dict[str, Any]:
    by = "namespace, job"
    panels = [
        row("Jobs"),
        panel("Jobs by phase", "timeseries", [("sum by (phase) (asyncrl_jobs)", "{{phase}}")]),
        panel(
            "Restarts by role",
            "timeseries",
            [("sum by (role) (asyncrl_job_restarts_total)", "{{role}}")],
            description="Trainer gang restarts and rollout pod replacements the operator performed "
            "(operator metrics carry no per-job label; per job see status.restarts).",
        ),
        row("Operator"),
        panel(
            "Reconcile latency",
            "timeseries",
            [
                (
                    f"histogram_quantile({q}, "
                    f"sum by (le) (rate(asyncrl_operator_reconcile_seconds_bucket[{RI}])))",
                    f"p{int(q * 100)}",
                )
                for q in (0.5, 0.99)
            ],
            unit="s",
        ),
        panel(
            "Reconcile errors / s",
            "timeseries",
            [(f"sum(rate(asyncrl_operator_reconcile_errors_total[{RI}]))", "errors")],
            unit="ops",
        ),
        row("Training across jobs"),
        panel(
            "Trainer step by job",
            "timeseries",
            [(f'max by ({by}) (asyncrl_trainer_step{{{FLEET}, role="trainer"}})', "{{namespace}}/{{job}}")],
        ),
        panel(
            "Tokens generated / s by job",
            "timeseries",
            [
                (
                    f"sum by ({by}) (rate(asyncrl_tokens_generated_total{{{FLEET}}}[{RI}]))",
                    "{{namespace}}/{{job}}",
                )
            ],
        ),
        panel(
            "Queue depth by job",
            "timeseries",
            [(f"max by ({by}) (asyncrl_queue_depth{{{FLEET}}})", "{{namespace}}/{{job}}")],
        ),
        panel(
            "Policy version lag by job",
            "timeseries",
            [
                (
                    f'max by ({by}) (asyncrl_param_version{{{FLEET}, role="trainer"}}) - on ({by}) '
                    f'min by ({by}) (asyncrl_param_version{{{FLEET}, role="rollout"}})',
                    "{{namespace}}/{{job}}",
                )
            ],
            description="Versions the slowest rollout replica is behind the trainer.",
        ),
        panel(
            "Stale drops / s by job",
            "timeseries",
            [
                (
                    f"sum by ({by}) "
                    f'(rate(asyncrl_trajectories_dropped_total{{{FLEET}, reason="stale"}}[{RI}]))',
                    "{{namespace}}/{{job}}",
                )
            ],
            unit="ops",
        ),
        panel(
            "Sample staleness p90 by job",
            "timeseries",
            [
                (
                    f"histogram_quantile(0.9, "
                    f"sum by ({by}, le) (rate(asyncrl_sample_staleness_bucket{{{FLEET}}}[{RI}])))",
                    "{{namespace}}/{{job}}",
                )
            ],
        ),
        panel(
            "Weight sync p90 by job",
            "timeseries",
            [
                (
                    f"histogram_quantile(0.9, "
                    f"sum by ({by}, le) (rate(asyncrl_weight_sync_seconds_bucket{{{FLEET}}}[{RI}])))",
                    "{{namespace}}/{{job}}",
                )
            ],
            unit="s",
        ),
        panel(
            "Trainer idle ratio by job",
            "timeseries",
            [
                (
                    f'max by ({by}) (asyncrl_trainer_idle_ratio{{{FLEET}, role="trainer"}})',
                    "{{namespace}}/{{job}}",
                )
            ],
            unit="percentunit",
        ),
        panel(
            "Median reward by job",
            "timeseries",
            [
                (
                    f"histogram_quantile(0.5, "
                    f"sum by ({by}, le) (rate(asyncrl_reward_bucket{{{FLEET}}}[{RI}])))",
                    "{{namespace}}/{{job}}",
                )
            ],
        ),
    ]
    variables = [
        variable("namespace", 'label_values(asyncrl_trainer_step{role="trainer"}, namespace)', multi=True)
    ]
    return dashboard("asyncrl-fleet", "asyncrl / fleet", variables, panels)


def render() -> dict[str, str]:
    """File name -> JSON text, exactly as committed."""
    return {
        name: json.dumps(board, indent=2, sort_keys=False) + "\n"
        for name, board in (("asyncrl-job.json", job_dashboard()), ("asyncrl-fleet.json", fleet_dashboard()))
    }


if __name__ == "__main__":
    for name, text in render().items():
        (OUT / name).write_text(text)
        print(f"wrote {OUT / name}")
