"""Elastic rollouts: spec.rollout.autoscale and the decision the operator (and the local runner) takes.

The decision is a pure function of the spec, the current replica count and a history of ``Signals`` (what
trainer rank 0 reports in status.progress.utilization), so the operator, the local runner and the unit
tests share it. Modelled on the HorizontalPodAutoscaler's algorithm and ``behavior`` fields:

- a *recommendation* per sample: up when the trainer waits for samples more than
  ``targetTrainerWaitFraction`` of its wall time (HPA's ratio: the fleet's output is taken as proportional to
  its replicas, and the trainer's busy share ``1 - wait`` as proportional to the fleet's output, so
  ``ceil(current * (1 - target) / (1 - wait))``); down by one when the trainer does not wait and the fleet is
  held back (``rolloutBlockedFraction`` above ``maxBlockedFraction``); else the current count;
- *stabilisation* as HPA's ``behavior.scale{Up,Down}.stabilizationWindowSeconds``: a scale-up takes the
  lowest recommendation of its window, a scale-down the highest, so one slow step (a weight sync, a
  checkpoint) or one quick one moves nothing;
- a *policy* as HPA's ``behavior.*.policies`` of type Pods: at most ``maxStep`` replicas per change.

Where it differs from HPA, and why: (1) a window must be *covered* by samples taken since the last change
and with every replica ready (HPA also ignores unready pods' metrics); a new rollout replica loads its
engine for minutes and joins weight sync at the next version, and until then the trainer's wait says
nothing about the new size; (2) scale-down is one replica per change whatever the surplus: an over-sized
fleet shows up as a blocked one, which does not say by how much; (3) the metric is the job's own report,
not the metrics API: no adapter is needed; (4) *a scale-up must pay*: HPA assumes a replica adds
capacity, but a rollout replica that shares what the trainer runs on (cores, a node's memory bandwidth,
the bus) can lower what the trainer consumes while its wait share still says "starved". So a scale-up is
on probation: once a scale-up window of samples with every new replica ready is covered, the trainer's
consumed samples/s over it (from the job's cumulative count, ``_rate``) is compared with the window that
decided the scale-up; below ``minScaleUpGain`` more, the scale-up is undone (reason ScaleUpUndone) and
the fleet is held below that count for ``scaleUpRetrySeconds`` (reason AtCeiling), so it does not scale
up again at once.

Only one controller may own ``spec.rollout.replicas``: with ``autoscale`` set, do not also point an HPA
or a KEDA ScaledObject at the job (docs/autoscaling.md).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic

from asyncrl_api import base

_RULES = (
    base.Rule(
        cel="self.minReplicas <= self.maxReplicas",
        message="minReplicas must not exceed maxReplicas",
        field_path=".minReplicas",
        check=lambda a: a.min_replicas <= a.max_replicas,
    ),
)


class AutoscaleSpec(base.APIModel):
    """Size the rollout fleet to keep the trainer busy without generating what the staleness bound holds
    back. The operator changes spec.rollout.replicas through the job's /scale subresource, as an HPA
    would; status.autoscale and an event per change say why. Only one controller may own the replicas:
    not together with an HPA or a KEDA ScaledObject on this job."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_RULES))

    min_replicas: int = pydantic.Field(default=1, ge=1, le=1024)
    """Fewest rollout replicas."""
    max_replicas: int = pydantic.Field(ge=1, le=1024)
    """Most rollout replicas (a count the cluster's GPUs can never hold is only a warning in status)."""
    target_trainer_wait_fraction: float = pydantic.Field(default=0.1, ge=0.0, lt=1.0)
    """Scale up while the trainer spends more than this share of its wall time waiting for samples."""
    max_blocked_fraction: float = pydantic.Field(default=0.5, gt=0.0, le=1.0)
    """Scale down (while the trainer waits no more than the target) when more than this share of the
    trainer's recent steps found their whole batch already queued: the rollouts ran ahead and the
    staleness bound or the full queue held them back."""
    scale_up_stabilization_seconds: int = pydantic.Field(default=60, ge=0, le=3600)
    """A scale-up needs this long of samples (since the last change, all replicas ready) and takes the
    lowest recommendation among them (HPA's behavior.scaleUp.stabilizationWindowSeconds)."""
    scale_down_stabilization_seconds: int = pydantic.Field(default=300, ge=0, le=3600)
    """A scale-down needs this long of samples and takes the highest recommendation among them."""
    max_step: int = pydantic.Field(default=1, ge=1, le=64)
    """At most this many replicas added per change (removals are one at a time)."""
    min_scale_up_gain: float | None = pydantic.Field(default=0.05, ge=0.0, le=10.0)
    """A scale-up is kept only if the samples the trainer consumes per second rose by at least this share
    (0.05: 5%) over a scale-up window with every new replica ready, against the window that decided it;
    otherwise it is undone. null: never undone (HPA's behaviour)."""
    scale_up_retry_seconds: int = pydantic.Field(default=1800, ge=0, le=86400)
    """After a scale-up was undone, the fleet stays below that count for this long."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> AutoscaleSpec:
        base.check_rules(self, _RULES)
        return self


@dataclasses.dataclass(frozen=True)
class Signals:
    """One report of the trainer's view of the fleet."""

    at: float
    """Wall-clock seconds (time.time()) of the report."""
    trainer_wait_fraction: float
    """Share of the trainer's recent wall time spent waiting for samples (0..1)."""
    rollout_blocked_fraction: float
    """Share of the trainer's recent steps whose whole batch was already queued (0..1)."""
    ready_replicas: int
    """Rollout replicas ready when the report was taken."""
    samples_per_second: float | None = None
    """Samples the trainer consumed per second over its recent steps (None: not reported)."""
    samples_consumed: int | None = None
    """Samples the trainer consumed since the job started (status.progress.samplesConsumed)."""


@dataclasses.dataclass(frozen=True)
class Decision:
    replicas: int
    """Desired rollout replicas."""
    reason: str
    """ScaleUp, ScaleDown, ScaleUpUndone, Stable, Stabilizing, Judging, AtCeiling, WaitingForReplicas,
    BelowMin, AboveMax, NoSignals."""
    message: str
    """What was decided and from which values: for events and kubectl describe."""
    baseline: float | None = None
    """A ScaleUp's consumed samples/s over the window that decided it (its probation compares with it)."""
    judged: str | None = None
    """"kept" or "undone" when this decision judged the scale-up on probation."""


@dataclasses.dataclass(frozen=True)
class Probation:
    """A scale-up not judged yet (see the module's point 4)."""

    before: int
    after: int
    baseline: float | None
    """Consumed samples/s over the window that decided it (None: the trainer did not report it)."""


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """After an undone scale-up: at most ``replicas`` until ``until`` (time.time())."""

    replicas: int
    until: float


def recommend(spec: AutoscaleSpec, current: int, s: Signals) -> int:
    """The replica count one sample asks for, before stabilisation and limits."""
    if s.trainer_wait_fraction > spec.target_trainer_wait_fraction:
        busy = max(1.0 - s.trainer_wait_fraction, 0.05)
        return max(current + 1, math.ceil(current * (1.0 - spec.target_trainer_wait_fraction) / busy - 1e-9))
    if s.rollout_blocked_fraction > spec.max_blocked_fraction:
        return current - 1
    return current


def _values(s: Signals) -> str:
    return f"trainer wait {s.trainer_wait_fraction:.2f}, rollouts blocked {s.rollout_blocked_fraction:.2f}"


def _rate(ready: Sequence[Signals], start: float) -> float | None:
    """Consumed samples/s from ``start`` on: the job's cumulative count between the last report before
    ``start`` (or the first after it) and the latest, over their times. The trainer's own samplesPerSecond
    covers its last steps, which right after a change may be steps before it (a step can take minutes on
    a large model), so it is only the fallback (the mean of those reported from ``start`` on)."""
    counted = [s for s in ready if s.samples_consumed is not None]
    before = [s for s in counted if s.at < start]
    inside = [s for s in counted if s.at >= start]
    first = before[-1] if before else inside[0] if inside else None
    last = counted[-1] if counted else None
    if first is not None and last is not None and last.at > first.at:
        assert first.samples_consumed is not None and last.samples_consumed is not None
        return max(last.samples_consumed - first.samples_consumed, 0) / (last.at - first.at)
    rates = [s.samples_per_second for s in ready if s.at >= start and s.samples_per_second is not None]
    return sum(rates) / len(rates) if rates else None


def _judge(
    spec: AutoscaleSpec, current: int, ready: Sequence[Signals], probation: Probation, now: float
) -> Decision | None:
    """The scale-up on probation: a Judging decision while its window is not covered, ScaleUpUndone if
    consumed samples/s did not rise by minScaleUpGain, else None (kept: the caller decides as usual)."""
    gain, window = spec.min_scale_up_gain, spec.scale_up_stabilization_seconds
    assert gain is not None
    covered = now - ready[0].at
    if covered < window:
        return Decision(
            current,
            "Judging",
            f"{_values(ready[-1])}; the scale-up to {current} is judged over {window}s with every replica "
            f"ready ({covered:.0f}s observed)",
        )
    rate = _rate(ready, now - window)
    if rate is None or probation.baseline is None or rate >= probation.baseline * (1.0 + gain):
        return None
    return Decision(
        probation.before,
        "ScaleUpUndone",
        f"consumed samples/s {rate:.1f} with {current} replicas against {probation.baseline:.1f} with "
        f"{probation.before}, not the {gain:.0%} more minScaleUpGain asks: back to {probation.before}, "
        f"and no more than that for {spec.scale_up_retry_seconds}s",
        judged="undone",
    )


def decide(
    spec: AutoscaleSpec,
    current: int,
    history: Sequence[Signals],
    last_change_at: float | None,
    now: float,
    probation: Probation | None = None,
    ceiling: Ceiling | None = None,
) -> Decision:
    """The desired rollout replicas given ``history`` (oldest first), the last change's time, the
    scale-up on probation and the ceiling an undone one left (``History`` keeps them)."""
    lo, hi = spec.min_replicas, spec.max_replicas
    if current < lo:
        return Decision(lo, "BelowMin", f"{current} replicas is below minReplicas {lo}")
    if current > hi:
        return Decision(hi, "AboveMax", f"{current} replicas is above maxReplicas {hi}")
    since = [s for s in history if last_change_at is None or s.at >= last_change_at]
    if not since:
        return Decision(current, "NoSignals", "no trainer report since the last change")
    latest = since[-1]
    if latest.ready_replicas < current:
        return Decision(
            current, "WaitingForReplicas", f"{latest.ready_replicas}/{current} rollout replicas ready"
        )
    first_ready = len(since)
    while first_ready > 0 and since[first_ready - 1].ready_replicas >= current:
        first_ready -= 1
    ready = since[first_ready:]  # the trailing run of samples with every replica ready
    if probation is None or probation.after != current or spec.min_scale_up_gain is None:
        return _decide_ready(spec, current, ready, now, ceiling)
    judged = _judge(spec, current, ready, probation, now)
    if judged is not None:
        return judged
    decision = _decide_ready(spec, current, ready, now, ceiling)
    kept = f"; the scale-up to {current} is kept"
    return dataclasses.replace(decision, message=decision.message + kept, judged="kept")


def _decide_ready(
    spec: AutoscaleSpec, current: int, ready: Sequence[Signals], now: float, ceiling: Ceiling | None
) -> Decision:
    """``decide`` once every replica is ready and no scale-up waits to be judged."""
    lo, hi, latest = spec.min_replicas, spec.max_replicas, ready[-1]
    asked = recommend(spec, current, latest)
    wanted = min(max(asked, lo), hi)
    if ceiling is not None and now < ceiling.until and wanted > max(ceiling.replicas, current):
        hi = wanted = max(ceiling.replicas, current)  # never below current: a count set by hand stays
        if wanted == current:
            return Decision(
                current,
                "AtCeiling",
                f"{_values(latest)}; held at {current}: a scale-up above it did not pay "
                f"({ceiling.until - now:.0f}s left)",
            )
    if wanted == current:
        bound = f" (at {'max' if asked > hi else 'min'}Replicas {current})" if asked != current else ""
        return Decision(current, "Stable", _values(latest) + bound)
    window = (
        spec.scale_up_stabilization_seconds if wanted > current else spec.scale_down_stabilization_seconds
    )
    covered = now - ready[0].at
    if covered < window:
        return Decision(
            current, "Stabilizing", f"{_values(latest)}; {covered:.0f}s of the {window}s window observed"
        )
    recs = [recommend(spec, current, s) for s in ready if s.at >= now - window]
    if wanted > current:
        target = min(min(recs), current + spec.max_step, hi)
        if target <= current:
            return Decision(current, "Stabilizing", f"{_values(latest)}; not starved for the whole window")
        baseline = _rate(ready, now - window)
        return Decision(
            target, "ScaleUp", f"trainer starved ({_values(latest)} over {window}s)", baseline=baseline
        )
    target = max(max(recs), current - 1, lo)
    if target >= current:
        return Decision(current, "Stable" if current == lo else "Stabilizing", _values(latest))
    return Decision(target, "ScaleDown", f"rollouts held back ({_values(latest)} over {window}s)")


class History:
    """One job's samples, last change, scale-up on probation and ceiling: what the operator keeps per job
    and the local runner per run. ``add`` takes a report once (a report seen again is not a new sample);
    ``decide`` is ``decide`` on them; ``applied`` records a decision that was acted on."""

    def __init__(self, maxlen: int = 512) -> None:
        self.samples: collections.deque[Signals] = collections.deque(maxlen=maxlen)
        self.last_change: float | None = None
        self.probation: Probation | None = None
        self.ceiling: Ceiling | None = None

    def add(self, sample: Signals) -> bool:
        """Append ``sample``; False (nothing appended) if it is not newer than the last one."""
        if self.samples and self.samples[-1].at >= sample.at:
            return False
        self.samples.append(sample)
        return True

    def decide(self, spec: AutoscaleSpec, current: int, now: float) -> Decision:
        return decide(spec, current, list(self.samples), self.last_change, now, self.probation, self.ceiling)

    def applied(self, spec: AutoscaleSpec, current: int, decision: Decision, now: float) -> None:
        """``decision`` (taken at ``current`` replicas) was acted on: a change moves the window's start,
        a scale-up goes on probation, an undone one leaves a ceiling."""
        if decision.judged is not None or (self.probation is not None and self.probation.after != current):
            self.probation = None  # judged, or the count was changed by hand meanwhile
        if decision.judged == "undone":
            self.ceiling = Ceiling(decision.replicas, now + spec.scale_up_retry_seconds)
        if decision.replicas == current:
            return
        self.last_change = now
        self.probation = (
            Probation(current, decision.replicas, decision.baseline) if decision.replicas > current else None
        )


def replicas_that_fit(
    nodes: Sequence[Mapping[str, Any]], gpus_per_replica: int, selector: Mapping[str, str]
) -> int:
    """How many rollout replicas of ``gpus_per_replica`` GPUs the cluster's nodes can ever hold: per node
    that is schedulable and carries every ``selector`` label, its allocatable ``nvidia.com/gpu`` divided by
    ``gpus_per_replica``. An upper bound (taints, other pods and the trainer's own GPUs are not
    subtracted), so a ``maxReplicas`` above it can never be scheduled; a count at or below it may still
    wait for room."""
    total = 0
    for node in nodes:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if (node.get("spec") or {}).get("unschedulable") or any(
            labels.get(k) != v for k, v in selector.items()
        ):
            continue
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        try:
            gpus = int(str(allocatable.get("nvidia.com/gpu", "0")))
        except ValueError:  # a quantity GPUs never take ("1k", "500m"): not a GPU node for us
            continue
        total += gpus // gpus_per_replica
    return total


def fit_warning(max_replicas: int, fit: int, gpus_per_replica: int) -> str:
    """status.autoscale.warning for a maxReplicas the nodes can never hold ("" when they can)."""
    if max_replicas <= fit:
        return ""
    return (
        f"maxReplicas {max_replicas} can never be scheduled: the nodes matching the rollout's nodeSelector "
        f"hold at most {fit} replicas of {gpus_per_replica} nvidia.com/gpu"
    )
