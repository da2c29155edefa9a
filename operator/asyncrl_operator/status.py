"""Observed children -> the job's status (phase, conditions, replicas, reason). Pure: no clock, no client.

Called by ``asyncrl_operator.reconcile`` after every apply, with the StatefulSets the apply returned,
the job's pods, the problems of the Secrets it names and the time passed in. ``progress`` is never
computed here: trainer rank 0 owns it; this module only reads it (step, stepTime) to decide Succeeded
and Stalled. What the pods report becomes EndpointsReady and Degraded (``diagnose``); ``status.reason``
and ``status.message`` name the most pressing problem and the restart budget ends a job Failed
(``failures``).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from asyncrl_api import models
from asyncrl_api import status as api_status

from asyncrl_operator import diagnose, failures
from asyncrl_operator.render import agents, names, pods

Body = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Observed:
    """What the reconciler saw. StatefulSets are full objects (with status) or None when absent."""

    now: datetime.datetime
    trainer: Body | None = None
    rollout: Body | None = None
    nats: Body | None = None
    agents: Body | None = None
    """The agent workers' Deployment (spec.agent.workers), or None."""
    invalid: str | None = None
    """Why the spec is invalid (the handler's validation message), or None."""
    restarting: bool = False
    """A trainer gang restart was started (phase Restarting); it lasts until the trainer is Ready again."""
    pods: tuple[Body, ...] = ()
    """The job's current pods (with status), as listed by label."""
    secret_problems: tuple[diagnose.Problem, ...] = ()
    """Secrets or keys the spec names that are missing (``diagnose.secret_problem``)."""


def _ready(sts: Body | None) -> int:
    return int(((sts or {}).get("status") or {}).get("readyReplicas") or 0)


def _current(sts: Body | None) -> int:
    return int(((sts or {}).get("status") or {}).get("replicas") or 0)


def role_status(job: models.AsyncRLJob, role: str, sts: Body | None, desired: int) -> api_status.RoleStatus:
    ready = _ready(sts)
    return api_status.RoleStatus(
        replicas=_current(sts),
        ready_replicas=ready,
        ready=f"{ready}/{desired}",
        selector=names.selector_string(job.metadata.name, role),
    )


def agents_status(job: models.AsyncRLJob, deployment: Body | None) -> api_status.RoleStatus | None:
    """Agent workers: ``replicas`` is the Deployment's as applied (``render.agents.desired_replicas``,
    0 until a rollout serves), ``ready`` is ready/wanted (workers.replicas, 0 once stopped)."""
    found = agents.spec(job)
    if found is None:
        return None
    wanted = 0 if pods.stopped(job) else found[1].replicas
    ready = int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)
    return api_status.RoleStatus(
        replicas=int(((deployment or {}).get("spec") or {}).get("replicas") or 0),
        ready_replicas=ready,
        ready=f"{ready}/{wanted}",
        selector=names.selector_string(job.metadata.name, names.AGENT),
    )


def agents_condition(
    job: models.AsyncRLJob, st: api_status.AsyncRLJobStatus, found: list[diagnose.Problem]
) -> api_status.Condition | None:
    """AgentsReady (only with workers): a problem of an agent pod (its reason and line), waiting for the
    gateway, not all ready, or all ready / none wanted."""
    found_spec = agents.spec(job)
    if st.agents is None or found_spec is None:
        return None
    if pods.stopped(job):
        return _cond("AgentsReady", True, "ScaledToZero", f"the job is {st.phase}: no agent runs")
    prefix = f"{names.agent(job.metadata.name)}-"
    problem = next((p for p in found if p.pod.startswith(prefix)), None)
    if problem is not None:
        return _cond("AgentsReady", False, problem.reason, problem.message)
    if st.rollout.ready_replicas < 1:
        return _cond("AgentsReady", False, "WaitingForGateway", "agents start once a rollout replica serves")
    if st.agents.ready_replicas >= found_spec[1].replicas:
        return _cond("AgentsReady", True, "AllReady", f"{st.agents.ready} ready")
    return _cond("AgentsReady", False, "NotReady", f"{st.agents.ready} ready")


def tracking_condition(
    job: models.AsyncRLJob, st: api_status.AsyncRLJobStatus
) -> api_status.Condition | None:
    """TrackingReady (only with spec.tracking), from the trainer's report of its trackers: False with the
    first failing tracker's class (Unauthorized, Unreachable, Error) while one fails. Training goes on
    either way: the trainer retries a tracker, never stops for it."""
    if job.spec.tracking is None:
        return None
    reported = st.progress.tracking if st.progress is not None else None
    if not reported:
        return _cond("TrackingReady", False, "Starting", "no tracker has reported yet")
    failing = [t for t in reported if not t.ready]
    if failing:
        t = failing[0]
        return _cond(
            "TrackingReady", False, t.reason or "Starting", t.message or f"{t.backend}: not logging yet"
        )
    urls = " ".join(t.url for t in reported if t.url)
    return _cond("TrackingReady", True, "Logging", urls)


def parse_time(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def format_time(when: datetime.datetime) -> str:
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cond(
    type_: api_status.ConditionType, ok: bool | None, reason: str, message: str = ""
) -> api_status.Condition:
    value = "Unknown" if ok is None else ("True" if ok else "False")
    return api_status.Condition(type=type_, status=value, reason=reason, message=message)


def gates(obs: Observed, role: str) -> list[str]:
    """The scheduling gates holding a role's live pods (Kueue's ``kueue.x-k8s.io/admission`` while its
    queue has not admitted them), sorted, each once."""
    found = set()
    for pod in obs.pods:
        meta = pod.get("metadata") or {}
        if (meta.get("labels") or {}).get(names.ROLE) == role and not meta.get("deletionTimestamp"):
            found |= {str(g.get("name")) for g in (pod.get("spec") or {}).get("schedulingGates") or []}
    return sorted(found)


def _role_cond(
    type_: api_status.ConditionType, ok: bool, ready: str, held: list[str]
) -> api_status.Condition:
    """A role's readiness; pods held by scheduling gates say so (a queued job waits, it is not broken)."""
    if ok:
        return _cond(type_, True, "AllReady", f"{ready} ready")
    if held:
        why = f"{ready} ready; pods wait for scheduling gates {', '.join(held)} (a queue's admission)"
        return _cond(type_, False, "SchedulingGated", why)
    return _cond(type_, False, "NotReady", f"{ready} ready")


def is_stalled(job: models.AsyncRLJob, now: datetime.datetime) -> bool:
    """Running, and the step has not advanced for spec.progress.stalledAfterSeconds (counted from the
    last step time, or from the start when no step was reported yet)."""
    progress = job.status.progress
    since = parse_time(progress.step_time if progress else None) or parse_time(job.status.start_time)
    if since is None:
        return False
    return (now - since).total_seconds() > job.spec.progress.stalled_after_seconds


def reached_max_steps(job: models.AsyncRLJob) -> bool:
    progress = job.status.progress
    return job.spec.max_steps is not None and progress is not None and progress.step >= job.spec.max_steps


def compute_phase(
    job: models.AsyncRLJob, obs: Observed, trainer_ok: bool, rollout_some: bool, bus_ok: bool
) -> api_status.Phase:
    """Succeeded is sticky; Failed means an invalid spec or the restart budget spent (sticky too);
    otherwise derived from what is running."""
    if job.status.phase == "Succeeded" or reached_max_steps(job):
        return "Succeeded"
    if obs.invalid or failures.failed_on_budget(job) or failures.budget_exhausted(job, list(obs.pods)):
        return "Failed"
    if job.spec.suspend:
        return "Suspended"
    if obs.restarting and not trainer_ok:
        return "Restarting"
    if trainer_ok and rollout_some and bus_ok:
        return "Running"
    if obs.trainer is not None or obs.rollout is not None:
        return "Starting"
    return "Pending"


def compute_conditions(
    job: models.AsyncRLJob,
    obs: Observed,
    phase: api_status.Phase,
    st: api_status.AsyncRLJobStatus,
    found: list[diagnose.Problem],
) -> list[api_status.Condition]:
    trainer_ok = st.trainer.ready_replicas >= job.spec.trainer.replicas
    rollout_ok = st.rollout.ready_replicas >= job.spec.rollout.replicas
    external = not job.spec.bus.nats.managed
    bus_ok = external or _ready(obs.nats) >= 1
    running = phase == "Running"
    stalled = running and is_stalled(job, obs.now)
    synced = job.status.progress is not None and job.status.progress.last_sync_time is not None
    return [
        _cond("Ready", running and trainer_ok and rollout_ok and bus_ok, phase, f"job is {phase}"),
        _role_cond("TrainerReady", trainer_ok, st.trainer.ready, gates(obs, names.TRAINER)),
        _role_cond("RolloutReady", rollout_ok, st.rollout.ready, gates(obs, names.ROLLOUT)),
        _cond(
            "BusReady", bus_ok, "External" if external else ("ServerReady" if bus_ok else "ServerNotReady")
        ),
        _cond("WeightSyncReady", True if synced else None, "Synced" if synced else "NotReported"),
        _cond("Progressing", running and not stalled, "Training" if running else phase),
        _cond(
            "Stalled",
            stalled,
            "StepNotAdvancing" if stalled else "StepAdvancing",
            f"step has not advanced for {job.spec.progress.stalled_after_seconds}s" if stalled else "",
        ),
        failures.degraded_condition(job, found, phase, rollout_ok, st.rollout.ready),
        failures.endpoints_condition(job, found, phase),
        _cond(
            "InvalidSpec",
            obs.invalid is not None,
            "SpecRejected" if obs.invalid else "Valid",
            obs.invalid or "",
        ),
    ]


def _keep_transition_times(
    new: list[api_status.Condition], old: list[api_status.Condition], now: str, generation: int
) -> list[api_status.Condition]:
    previous = {c.type: c for c in old}
    out = []
    for cond in new:
        before = previous.get(cond.type)
        changed = before is None or before.status != cond.status
        when = now if changed or before is None else before.last_transition_time
        out.append(cond.model_copy(update={"last_transition_time": when, "observed_generation": generation}))
    return out


def compute_status(job: models.AsyncRLJob, obs: Observed) -> api_status.AsyncRLJobStatus:
    """The operator-owned part of the status (``progress`` is carried over untouched)."""
    now = format_time(obs.now)
    stopped = pods.stopped(job) or obs.invalid is not None
    trainer_desired = 0 if stopped else job.spec.trainer.replicas
    rollout_desired = 0 if stopped else job.spec.rollout.replicas
    st = job.status.model_copy(deep=True)
    st.trainer = role_status(job, names.TRAINER, obs.trainer, trainer_desired)
    st.rollout = role_status(job, names.ROLLOUT, obs.rollout, rollout_desired)
    st.agents = agents_status(job, obs.agents)
    bus_ok = (not job.spec.bus.nats.managed) or _ready(obs.nats) >= 1
    trainer_ok = trainer_desired > 0 and st.trainer.ready_replicas >= trainer_desired
    rollout_some = rollout_desired == 0 or st.rollout.ready_replicas >= 1
    phase = compute_phase(job, obs, trainer_ok, rollout_some, bus_ok)
    found = list(obs.secret_problems) + diagnose.problems(list(obs.pods))  # a missing Secret first: the cause
    conditions = compute_conditions(job, obs, phase, st, found)
    st.phase = phase
    agents_ready = agents_condition(job, st, found)
    if agents_ready is not None:
        conditions.insert(-1, agents_ready)  # before InvalidSpec, as CONDITION_TYPES orders them
    tracking_ready = tracking_condition(job, st)
    if tracking_ready is not None:
        conditions.insert(-1, tracking_ready)
    st.conditions = _keep_transition_times(conditions, job.status.conditions, now, job.metadata.generation)
    st.phase = phase
    st.reason, st.message = failures.pressing(job, obs.invalid, phase, conditions, found, list(obs.pods))
    st.observed_generation = job.metadata.generation
    if phase == "Running" and st.start_time is None:
        st.start_time = now
    if phase in api_status.FINISHED_PHASES and st.completion_time is None:
        st.completion_time = now
    if phase not in api_status.FINISHED_PHASES:
        st.completion_time = None
    return st


def compute_invalid_status(
    old: api_status.AsyncRLJobStatus, generation: int, why: str, now: datetime.datetime
) -> api_status.AsyncRLJobStatus:
    """Phase Failed with InvalidSpec True and the field-level message; nothing else is touched."""
    st = old.model_copy(deep=True)
    st.phase = "Failed"
    st.reason = "InvalidSpec"
    st.message = why
    st.observed_generation = generation
    invalid = _cond("InvalidSpec", True, "SpecRejected", why)
    others = [c for c in old.conditions if c.type not in ("InvalidSpec", "Ready")]
    ready = _cond("Ready", False, "InvalidSpec", "the spec is invalid; nothing was created or changed")
    st.conditions = _keep_transition_times(
        [ready, *others, invalid], old.conditions, format_time(now), generation
    )
    if st.completion_time is None:
        st.completion_time = format_time(now)
    return st


def with_condition(
    old: api_status.AsyncRLJobStatus,
    type_: api_status.ConditionType,
    ok: bool,
    reason: str,
    message: str,
    now: datetime.datetime,
) -> api_status.AsyncRLJobStatus:
    """The status with one condition set (others untouched), e.g. Degraded/ApplyFailed after an API error."""
    st = old.model_copy(deep=True)
    cond = _cond(type_, ok, reason, message)
    rest = [c for c in old.conditions if c.type != type_]
    generation = old.observed_generation
    st.conditions = _keep_transition_times([*rest, cond], old.conditions, format_time(now), generation)
    return st


def status_patch(new: api_status.AsyncRLJobStatus) -> Body:
    """The merge patch for the status subresource: every operator-owned field, never ``progress``."""
    body = new.to_api()
    body.pop("progress", None)
    for key in ("startTime", "completionTime", "configHash"):
        body.setdefault(key, None)
    return body
