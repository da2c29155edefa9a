"""Every Prometheus metric of the data plane (README, Metrics), defined once for rollout and trainer.

Imported by the rollout worker, the trajectory bus, the weight sync and the trainer; each process
serves `REGISTRY` on its metrics port with `serve()`, beside the probes' /healthz and /readyz. Metrics
carry the labels namespace, job, role and replica (plus `reason` on drops): bounded cardinality - one
series per pod, never per sample or prompt. Call `bind(identity)` once per process and use the returned
`Bound` everywhere, so no caller can invent a label value.
"""

from __future__ import annotations

import dataclasses
import threading
import wsgiref.simple_server
from collections.abc import Callable, Iterable
from typing import Any

import prometheus_client
import prometheus_client.exposition

REGISTRY = prometheus_client.CollectorRegistry()
_LABELS = ("namespace", "job", "role", "replica")
DROP_REASONS = ("queue_full", "stale", "invalid", "store_lost", "reward_error", "zero_variance")
TOKEN_DROP_REASONS = ("stale", "invalid")
"""The trainer sees the tokens of what it drops; a queue_full or store_lost drop never reaches it."""

_STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_REWARD_BUCKETS = (-1.0, -0.5, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2.0)
_TURN_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32)


def _counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> prometheus_client.Counter:
    return prometheus_client.Counter(name, doc, _LABELS + extra, registry=REGISTRY)


def _gauge(name: str, doc: str) -> prometheus_client.Gauge:
    return prometheus_client.Gauge(name, doc, _LABELS, registry=REGISTRY)


def _histogram(
    name: str, doc: str, buckets: tuple[float, ...], extra: tuple[str, ...] = ()
) -> prometheus_client.Histogram:
    return prometheus_client.Histogram(name, doc, _LABELS + extra, buckets=buckets, registry=REGISTRY)


# prometheus_client appends _total to counters itself.
PRODUCED = _counter(
    "asyncrl_trajectories_produced", "Trajectories published to the bus (server-acked, not duplicates)."
)
CONSUMED = _counter("asyncrl_trajectories_consumed", "Trajectories used in an optimizer step and acked.")
DROPPED = _counter("asyncrl_trajectories_dropped", "Trajectories never trained on, by reason.", ("reason",))
TOKENS_DROPPED = _counter(
    "asyncrl_tokens_dropped", "Response tokens of trajectories never trained on, by reason.", ("reason",)
)
QUEUE_DEPTH = _gauge("asyncrl_queue_depth", "Trajectories in the bus stream (including delivered, unacked).")
QUEUE_OLDEST_AGE = _gauge("asyncrl_queue_oldest_age_seconds", "Age of the oldest trajectory in the stream.")
STALENESS = _histogram(
    "asyncrl_sample_staleness", "Policy versions a consumed sample lags the trainer.", _STALENESS_BUCKETS
)
PARAM_VERSION = _gauge(
    "asyncrl_param_version", "Policy version: broadcast by the trainer / loaded by a rollout."
)
WEIGHT_SYNC_SECONDS = _histogram(
    "asyncrl_weight_sync_seconds", "Weight transfer time per sync.", _SECONDS_BUCKETS
)
ROLLOUT_PAUSE_SECONDS = _histogram(
    "asyncrl_rollout_pause_seconds", "Per sync, time the engine took no generation step.", _SECONDS_BUCKETS
)
TRAINER_STEP = _gauge("asyncrl_trainer_step", "Trainer optimizer steps completed.")
TRAINER_LAST_STEP_TS = _gauge(
    "asyncrl_trainer_last_step_timestamp_seconds", "Unix time of the last trainer step."
)
TRAINER_IDLE = _gauge(
    "asyncrl_trainer_idle_ratio", "Fraction of the last step's wall time spent waiting for data."
)
ROLLOUT_IDLE = _gauge(
    "asyncrl_rollout_idle_ratio", "Fraction of recent wall time the engine had nothing to generate."
)
ADMISSION_BLOCKED_SECONDS = _counter(
    "asyncrl_rollout_admission_blocked_seconds",
    "Time the rollout had a free generation slot but the staleness bound (maxStaleness) kept it closed.",
)
INFLIGHT_GROUP_SECONDS = _counter(
    "asyncrl_rollout_inflight_group_seconds",
    "Prompt groups in flight integrated over time; its rate is the mean number of groups generating.",
)
TOKENS_GENERATED = _counter("asyncrl_tokens_generated", "Response tokens generated.")
REWARD = _histogram("asyncrl_reward", "Reward per trajectory.", _REWARD_BUCKETS)
REWARD_EXTRA = prometheus_client.Summary(
    "asyncrl_reward_extra",
    "The numeric extras of a reward function's dict result (verl's reward_extra_info), by key: "
    "rate(_sum) / rate(_count) is their mean. At most 32 keys per process.",
    (*_LABELS, "key"),
    registry=REGISTRY,
)
_MAX_REWARD_EXTRA_KEYS = 32
PARTIAL_ROLLOUTS = _counter(
    "asyncrl_partial_rollouts", "Samples whose tokens span more than one policy version."
)
TOOL_CALLS = _counter(
    "asyncrl_tool_calls",
    "Agent-loop tool calls, by tool and outcome (see episode/tools.py).",
    ("tool", "outcome"),
)
TOOL_SECONDS = _histogram("asyncrl_tool_seconds", "Agent-loop tool call latency.", _SECONDS_BUCKETS)
AGENT_TURNS = _histogram("asyncrl_agent_turns", "Assistant turns per agent trajectory.", _TURN_BUCKETS)
AGENT_EPISODES = _counter("asyncrl_agent_episodes", "Agent-loop episodes, by why they ended.", ("ended",))
GATEWAY_SESSIONS_ACTIVE = _gauge(
    "asyncrl_gateway_sessions_active", "Gateway sessions open (not ended or expired)."
)
GATEWAY_SESSIONS = _counter(
    "asyncrl_gateway_sessions",
    "Gateway sessions by state: started, ended (by the agent), expired (no request for "
    "sessionTimeoutSeconds, never published), aborted (open when the replica stopped, never published).",
    ("state",),
)
GATEWAY_SESSION_STATES = ("started", "ended", "expired", "aborted")
GATEWAY_REQUESTS = _counter(
    "asyncrl_gateway_requests", "Gateway HTTP requests by route and status code.", ("route", "code")
)
GATEWAY_TTFT_SECONDS = _histogram(
    "asyncrl_gateway_ttft_seconds", "Gateway completions: time to the first streamed token.", _SECONDS_BUCKETS
)
GATEWAY_REQUEST_SECONDS = _histogram(
    "asyncrl_gateway_request_seconds", "Gateway completions: time to the whole response.", _SECONDS_BUCKETS
)
GATEWAY_TOKENS = _counter(
    "asyncrl_gateway_tokens",
    "Gateway completion tokens by kind (prompt: fed to the engine, completion: generated).",
    ("kind",),
)
GATEWAY_UNREWARDED = _counter(
    "asyncrl_gateway_unrewarded",
    "Gateway trajectories not published: no reward was set and the session had no record to score.",
)
GATEWAY_GROUPS_FORWARDED = _counter(
    "asyncrl_gateway_groups_forwarded",
    "Gateway group requests this replica could not admit, forwarded to a peer replica: one per peer tried, "
    "by the peer's answer (admitted: 200, returned to the agent; refused: 429; error: anything else, a "
    "timeout or no connection).",
    ("outcome",),
)
GATEWAY_FORWARD_OUTCOMES = ("admitted", "refused", "error")
GATEWAY_HOSTED_TOOLS_DROPPED = _counter(
    "asyncrl_gateway_hosted_tools_dropped",
    "Gateway Responses API: hosted tools (web_search, mcp, ...) the gateway cannot run, left out of what "
    "the model sees (spec.agent.gateway.hostedTools: drop), by tool type.",
    ("type",),
)
ENDPOINT_NAMES = ("judge", "teacher")
TRACKING_ERRORS = _counter(
    "asyncrl_tracking_errors",
    "Failed calls to an experiment tracker (spec.tracking), by backend (mlflow, wandb, tensorboard); each is"
    " retried with back-off, training goes on.",
    ("backend",),
)
TRACKING_RUN = prometheus_client.Gauge(
    "asyncrl_tracking_run_info",
    "1 for each experiment-tracker run the trainer logs to (spec.tracking): its backend, run id and, where "
    "the tracker has a page, url (the job dashboard links to it).",
    (*_LABELS, "backend", "run_id", "url"),
    registry=REGISTRY,
)
ENDPOINT_REQUESTS = _counter(
    "asyncrl_endpoint_requests",
    "Requests to an OpenAI-compatible endpoint (judge, teacher), one per attempt, by HTTP status code or,"
    " when no answer came, the error class (Unreachable).",
    ("endpoint", "code"),
)
ENDPOINT_LATENCY_SECONDS = _histogram(
    "asyncrl_endpoint_latency_seconds",
    "Endpoint request latency per attempt (answered or not).",
    _SECONDS_BUCKETS,
    ("endpoint",),
)
ENDPOINT_RATELIMIT_WAIT_SECONDS = _counter(
    "asyncrl_endpoint_ratelimit_wait_seconds",
    "Time requests waited on the endpoint's token bucket.",
    ("endpoint",),
)
TEACHER_KL = _gauge(
    "asyncrl_teacher_kl",
    "Mean per-token reverse KL to the teacher (log pi_theta - log pi_teacher) of the last step's tokens.",
)
VALIDATION_REWARD = _gauge(
    "asyncrl_validation_reward",
    "Mean reward of the last validation run (spec.data.validation; rollout replica 0); the same as mean@k.",
)
VALIDATION_MEAN_AT_K = _gauge(
    "asyncrl_validation_mean_at_k",
    "mean@k of the last validation run: the mean reward over its k samples per record.",
)
VALIDATION_PASS_AT_K = _gauge(
    "asyncrl_validation_pass_at_k",
    "pass@k of the last validation run: the share of records with a sample whose reward reaches"
    " passThreshold.",
)
VALIDATION_K = _gauge(
    "asyncrl_validation_k",
    "Samples per record (k) of the last validation run (validationSampling.samplesPerPrompt).",
)
VALIDATION_STEP = _gauge("asyncrl_validation_step", "Trainer step of the weights the last validation scored.")
VALIDATION_VERSION = _gauge(
    "asyncrl_validation_param_version", "Policy version the last validation run generated with."
)
VALIDATION_SAMPLES = _gauge(
    "asyncrl_validation_samples", "Samples (k per record) of the last validation run."
)
VALIDATION_SECONDS = _gauge(
    "asyncrl_validation_seconds", "Time the last validation run took to generate and score its set."
)
PREEMPTED = _counter("asyncrl_preempted", "In-flight requests interrupted by a weight update.")
PUBLISH_BLOCKED_SECONDS = _counter(
    "asyncrl_bus_publish_blocked_seconds", "Time publishers backed off on a full queue (whenFull: block)."
)
PUBLISH_BACKOFFS = _counter("asyncrl_bus_publish_backoffs", "Publishes refused by a full queue and retried.")
PUBLISH_RETRIES = _counter(
    "asyncrl_bus_publish_retries",
    "Publishes sent again because the bus did not answer (NATS restarting or unreachable); stored once.",
)


@dataclasses.dataclass(frozen=True)
class Identity:
    namespace: str
    job: str
    role: str
    replica: str = "0"


class Bound:
    """The metrics above with this process's identity labels filled in."""

    def __init__(self, identity: Identity) -> None:
        values = dataclasses.astuple(identity)
        self.identity = identity
        self.produced = PRODUCED.labels(*values)
        self.consumed = CONSUMED.labels(*values)
        self.dropped = {reason: DROPPED.labels(*values, reason) for reason in DROP_REASONS}
        self.tokens_dropped = {r: TOKENS_DROPPED.labels(*values, r) for r in TOKEN_DROP_REASONS}
        self.queue_depth = QUEUE_DEPTH.labels(*values)
        self.queue_oldest_age = QUEUE_OLDEST_AGE.labels(*values)
        self.staleness = STALENESS.labels(*values)
        self.param_version = PARAM_VERSION.labels(*values)
        self.weight_sync_seconds = WEIGHT_SYNC_SECONDS.labels(*values)
        self.rollout_pause_seconds = ROLLOUT_PAUSE_SECONDS.labels(*values)
        self.trainer_step = TRAINER_STEP.labels(*values)
        self.trainer_last_step_ts = TRAINER_LAST_STEP_TS.labels(*values)
        self.trainer_idle = TRAINER_IDLE.labels(*values)
        self.rollout_idle = ROLLOUT_IDLE.labels(*values)
        self.admission_blocked_seconds = ADMISSION_BLOCKED_SECONDS.labels(*values)
        self.inflight_group_seconds = INFLIGHT_GROUP_SECONDS.labels(*values)
        self.tokens_generated = TOKENS_GENERATED.labels(*values)
        self.reward = REWARD.labels(*values)
        self.partial_rollouts = PARTIAL_ROLLOUTS.labels(*values)
        self._values = values
        self._extra_keys: set[str] = set()
        self.tool_seconds = TOOL_SECONDS.labels(*values)
        self.agent_turns = AGENT_TURNS.labels(*values)
        self.preempted = PREEMPTED.labels(*values)
        self.publish_blocked_seconds = PUBLISH_BLOCKED_SECONDS.labels(*values)
        self.publish_backoffs = PUBLISH_BACKOFFS.labels(*values)
        self.publish_retries = PUBLISH_RETRIES.labels(*values)
        self.gateway_sessions_active = GATEWAY_SESSIONS_ACTIVE.labels(*values)
        self.gateway_sessions = {st: GATEWAY_SESSIONS.labels(*values, st) for st in GATEWAY_SESSION_STATES}
        self.gateway_ttft = GATEWAY_TTFT_SECONDS.labels(*values)
        self.gateway_request_seconds = GATEWAY_REQUEST_SECONDS.labels(*values)
        self.gateway_tokens = {k: GATEWAY_TOKENS.labels(*values, k) for k in ("prompt", "completion")}
        self.gateway_unrewarded = GATEWAY_UNREWARDED.labels(*values)
        self.gateway_groups_forwarded = {
            o: GATEWAY_GROUPS_FORWARDED.labels(*values, o) for o in GATEWAY_FORWARD_OUTCOMES
        }

        self.teacher_kl = TEACHER_KL.labels(*values)
        self.endpoint_latency = {e: ENDPOINT_LATENCY_SECONDS.labels(*values, e) for e in ENDPOINT_NAMES}
        self.endpoint_ratelimit_wait = {
            e: ENDPOINT_RATELIMIT_WAIT_SECONDS.labels(*values, e) for e in ENDPOINT_NAMES
        }

    def record_validation(
        self,
        step: int,
        version: int,
        reward_mean: float | None,
        samples: int,
        seconds: float,
        *,
        k: int,
        mean_at_k: float | None,
        pass_at_k: float | None,
    ) -> None:
        """The ``asyncrl_validation_*`` gauges, created by the first run: a process that runs no
        validation exports none of them. A run with no scored sample sets the rewards to NaN."""
        v = self._values
        nan = float("nan")
        VALIDATION_REWARD.labels(*v).set(nan if reward_mean is None else reward_mean)
        VALIDATION_MEAN_AT_K.labels(*v).set(nan if mean_at_k is None else mean_at_k)
        VALIDATION_PASS_AT_K.labels(*v).set(nan if pass_at_k is None else pass_at_k)
        VALIDATION_K.labels(*v).set(k)
        VALIDATION_STEP.labels(*v).set(step)
        VALIDATION_VERSION.labels(*v).set(version)
        VALIDATION_SAMPLES.labels(*v).set(samples)
        VALIDATION_SECONDS.labels(*v).set(seconds)

    def tracking_errors_by(self, backend: str) -> prometheus_client.Counter:
        """Bounded: ``backend`` is mlflow, wandb or tensorboard."""
        return TRACKING_ERRORS.labels(*self._values, backend)

    def tracking_run(self, backend: str, run_id: str, url: str | None) -> None:
        """Bounded: one run per backend (a resumed run keeps its id, so its series)."""
        TRACKING_RUN.labels(*self._values, backend, run_id, url or "").set(1)

    def endpoint_requests_by(self, endpoint: str, code: str) -> prometheus_client.Counter:
        """Bounded: ``endpoint`` is judge or teacher; ``code`` an HTTP status or an error class name."""
        return ENDPOINT_REQUESTS.labels(*self._values, endpoint, code)

    def reward_extra_by(self, key: str) -> prometheus_client.Summary:
        """``asyncrl_reward_extra{key}``. Bounded: the first 32 keys get a series, later ones share
        ``key="_other"`` (a dict result's keys are a function's fixed names, not per-sample values)."""
        if key not in self._extra_keys:
            if len(self._extra_keys) >= _MAX_REWARD_EXTRA_KEYS:
                key = "_other"
            self._extra_keys.add(key)
        return REWARD_EXTRA.labels(*self._values, key)

    def tool_calls_by(self, tool: str, outcome: str) -> prometheus_client.Counter:
        """``asyncrl_tool_calls_total`` for one tool and outcome. Bounded: callers pass a configured
        tool's name or a fixed marker, never a name the model made up."""
        return TOOL_CALLS.labels(*self._values, tool, outcome)

    def agent_episodes_by(self, ended: str) -> prometheus_client.Counter:
        return AGENT_EPISODES.labels(*self._values, ended)

    def gateway_hosted_tools_dropped_by(self, kind: str) -> prometheus_client.Counter:
        """Bounded: ``kind`` is one of gateway/responses_api.py's HOSTED_TOOLS or "other"."""
        return GATEWAY_HOSTED_TOOLS_DROPPED.labels(*self._values, kind)

    def gateway_requests_by(self, route: str, code: int) -> prometheus_client.Counter:
        """Bounded: ``route`` is one of the gateway's fixed route names, never a path."""
        return GATEWAY_REQUESTS.labels(*self._values, route, str(code))


def bind(identity: Identity) -> Bound:
    return Bound(identity)


READY = threading.Event()
"""Set by the rollout once its engine is loaded and its generation loop runs (``rollout.main``), cleared
when the loop ends: what /readyz answers, so a rollout pod is Ready only when it can generate."""


def probes_app(metrics: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """A WSGI app: /healthz (liveness: 200 while the process answers HTTP), /readyz (readiness: 200
    once ``READY`` is set, else 503), everything else prometheus-client's own app (/metrics)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        if path == "/readyz":
            if READY.is_set():
                start_response("200 OK", [("Content-Type", "text/plain")])
                return [b"ready\n"]
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"not ready: the engine is loading or the generation loop is not running\n"]
        return metrics(environ, start_response)

    return app


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """No access log: probes and scrapes every few seconds would drown the process's own lines."""


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve REGISTRY at http://addr:port/metrics and the probes (``probes_app``) from a daemon thread
    (0 = don't serve). prometheus-client's threading WSGI server, as its ``start_http_server`` runs it."""
    if not port:
        return
    app = probes_app(prometheus_client.make_wsgi_app(REGISTRY))
    server = wsgiref.simple_server.make_server(
        addr, port, app, prometheus_client.exposition.ThreadingWSGIServer, handler_class=_QuietHandler
    )
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
