"""The AsyncRLJob status: phase, conditions, per-role replicas and restarts, training progress.

Imported by ``asyncrl_api.models``. The operator writes everything except ``progress`` (its status
module computes it from observed children); trainer rank 0 writes only ``progress`` through the
status subresource under its own field manager, with the per-job ServiceAccount.
"""

from __future__ import annotations

import typing
from typing import Literal

import pydantic

from asyncrl_api import base

Phase = Literal["Pending", "Starting", "Running", "Suspended", "Restarting", "Succeeded", "Failed"]
PHASES: tuple[Phase, ...] = (
    "Pending",
    "Starting",
    "Running",
    "Suspended",
    "Restarting",
    "Succeeded",
    "Failed",
)
FINISHED_PHASES: tuple[Phase, ...] = ("Succeeded", "Failed")

ConditionType = Literal[
    "Ready",
    "RolloutReady",
    "TrainerReady",
    "BusReady",
    "WeightSyncReady",
    "Progressing",
    "Stalled",
    "Degraded",
    "EndpointsReady",
    "AgentsReady",
    "TrackingReady",
    "InvalidSpec",
]
CONDITION_TYPES: tuple[ConditionType, ...] = typing.get_args(ConditionType)


class Condition(base.APIModel):
    """One condition, in the Kubernetes style."""

    type: ConditionType
    """What the condition is about."""
    status: Literal["True", "False", "Unknown"]
    """Whether it holds."""
    reason: str = pydantic.Field(default="", max_length=1024)
    """A CamelCase machine-readable reason."""
    message: str = pydantic.Field(default="", max_length=32768)
    """A human-readable explanation."""
    last_transition_time: str | None = None
    """RFC 3339 time the status last changed."""
    observed_generation: int | None = None
    """The spec generation the condition was computed for."""


class RoleStatus(base.APIModel):
    """Replica counts of one role."""

    replicas: int = 0
    """Desired replicas (0 while suspended)."""
    ready_replicas: int = 0
    """Pods Ready."""
    ready: str = "0/0"
    """"ready/desired", for printer columns."""
    selector: str | None = None
    """Label selector of the role's pods (for the scale subresource / HPA)."""


class Staleness(base.APIModel):
    """Staleness (policy versions behind the trainer) of consumed samples, over the recent window."""

    p50: float = 0.0
    """Median staleness."""
    max: int = 0
    """Largest staleness consumed (never above the job's maxStaleness)."""


class ValidationProgress(base.APIModel):
    """The latest validation run (spec.data.validation): rollout replica 0 generated k answers to every
    record of the set (one greedy answer unless spec.data.validationSampling says otherwise) under one
    policy version and scored them with the job's reward."""

    step: int = pydantic.Field(default=0, ge=0)
    """Trainer step the scored weights were made after (0: the initial weights)."""
    param_version: int = pydantic.Field(default=0, ge=0)
    """Policy version the set was generated with."""
    reward_mean: float | None = None
    """Mean reward over the scored samples (None when none could be scored); the same number as
    meanAtK."""
    k: int = pydantic.Field(default=1, ge=1)
    """Samples per record (spec.data.validationSampling.samplesPerPrompt)."""
    mean_at_k: float | None = None
    """mean@k: the mean reward over all k samples of all records (failed ones left out; None when none
    could be scored)."""
    pass_at_k: float | None = pydantic.Field(default=None, ge=0.0, le=1.0)
    """pass@k: the share of records with at least one sample whose reward reaches
    validationSampling.passThreshold (records with no scored sample left out; None when there is none)."""
    samples: int = pydantic.Field(default=0, ge=0)
    """Samples generated: k per record."""
    failed: int = pydantic.Field(default=0, ge=0)
    """Samples whose reward failed (left out of the means)."""
    seconds: float = pydantic.Field(default=0.0, ge=0.0)
    """How long generating and scoring the set took."""
    time: str | None = pydantic.Field(default=None, max_length=64)
    """RFC 3339 time the run finished."""


class TrackerProgress(base.APIModel):
    """One experiment tracker of spec.tracking, as trainer rank 0 last saw it."""

    backend: Literal["mlflow", "wandb", "tensorboard"]
    """Which tracker."""
    ready: bool = False
    """Its last call succeeded."""
    reason: str = pydantic.Field(default="", max_length=64)
    """Logging, Starting, or why its last call failed: Unauthorized, Unreachable, Error."""
    message: str = pydantic.Field(default="", max_length=1024)
    """The last failure (never a key)."""
    url: str | None = pydantic.Field(default=None, max_length=2048)
    """The run's page, when the tracker has one."""


class Utilization(base.APIModel):
    """The trainer's view of the rollout fleet over its recent steps: the signals of
    spec.rollout.autoscale (asyncrl_api/autoscale.py)."""

    trainer_wait_fraction: float = pydantic.Field(default=0.0, ge=0.0, le=1.0)
    """Share of the trainer's wall time spent waiting for samples."""
    rollout_blocked_fraction: float = pydantic.Field(default=0.0, ge=0.0, le=1.0)
    """Share of the steps whose whole batch was already queued when the step asked for it: the
    rollouts ran ahead, so the staleness bound or the full queue held them back."""
    steps: int = pydantic.Field(default=0, ge=0)
    """Steps these shares cover."""
    samples_per_second: float | None = pydantic.Field(default=None, ge=0.0)
    """Samples trained per second over those steps (wall time): a scale-up must raise it."""


class AutoscaleStatus(base.APIModel):
    """What spec.rollout.autoscale decided last."""

    desired_replicas: int = pydantic.Field(default=0, ge=0)
    """The rollout replicas it asks for."""
    reason: str = pydantic.Field(default="", max_length=64)
    """ScaleUp, ScaleDown, ScaleUpUndone, Stable, Stabilizing, Judging, AtCeiling, WaitingForReplicas,
    BelowMin, AboveMax, NoSignals."""
    message: str = pydantic.Field(default="", max_length=1024)
    """The decision with the signal values it came from."""
    trainer_wait_fraction: float | None = None
    """The signal last seen (status.progress.utilization)."""
    rollout_blocked_fraction: float | None = None
    """The signal last seen (status.progress.utilization)."""
    samples_per_second: float | None = None
    """The signal last seen (status.progress.utilization): what a scale-up must raise."""
    ceiling_replicas: int | None = None
    """After an undone scale-up: the most replicas until ceilingUntil."""
    ceiling_until: str | None = None
    """RFC 3339 time the ceiling ends."""
    last_scale_time: str | None = None
    """RFC 3339 time of the last change."""
    last_scale_reason: str = pydantic.Field(default="", max_length=1024)
    """Why the last change was made (from, to, the signals)."""
    warning: str = pydantic.Field(default="", max_length=1024)
    """Set when maxReplicas is more than the cluster's GPU nodes can ever hold (only a warning: nodes may
    be added). Needs the operator's read access to nodes (the chart's cluster-wide install grants it)."""


class Dropped(base.APIModel):
    """Samples never trained on since the job started, by reason: trainer rank 0's counts (kept in its
    ledger across restarts) of asyncrl_trajectories_dropped_total's reasons."""

    stale: int = pydantic.Field(default=0, ge=0)
    """Older than async.maxStaleness when a step would have taken them."""
    invalid: int = pydantic.Field(default=0, ge=0)
    """Undecodable or malformed, or from a policy version the trainer has not reached."""
    queue_full: int = pydantic.Field(default=0, ge=0)
    """Discarded by the full queue (async.queue.whenFull dropOldest) before the trainer pulled them."""
    store_lost: int = pydantic.Field(default=0, ge=0)
    """Lost with the bus's store (NATS came back without it); a lower bound."""
    reward_error: int = pydantic.Field(default=0, ge=0)
    """Given no teacher logprobs (spec.teacher); a judge's failures are counted by the rollouts' metric."""
    zero_variance: int = pydantic.Field(default=0, ge=0)
    """In a prompt group whose rewards were all equal (trainer.algorithm.dynamicSampling)."""


class Progress(base.APIModel):
    """Training progress, reported by trainer rank 0 (throttled, see spec.progress)."""

    step: int = pydantic.Field(default=0, ge=0)
    """Trainer steps completed."""
    step_time: str | None = None
    """RFC 3339 time the trainer reached `step` (drives the Stalled condition)."""
    param_version: int = pydantic.Field(default=0, ge=0)
    """Policy version last broadcast to rollouts."""
    last_sync_time: str | None = None
    """RFC 3339 time of the last weight broadcast."""
    samples_consumed: int = pydantic.Field(default=0, ge=0)
    """Trajectories trained on."""
    staleness: Staleness = pydantic.Field(default_factory=Staleness)
    """Staleness of recently consumed samples."""
    queue_depth: int = pydantic.Field(default=0, ge=0)
    """Trajectories waiting in the bus."""
    dropped: Dropped | None = None
    """Samples never trained on since the job started, by reason."""
    zero_variance_kept: int | None = pydantic.Field(default=None, ge=0)
    """trainer.algorithm.dynamicSampling: samples of equal-reward groups trained anyway because their
    step had already dropped maxDropsPerStep groups (absent without dynamicSampling)."""
    reward_mean: float | None = None
    """Mean reward of the last step's samples."""
    last_update_time: str | None = None
    """RFC 3339 time of this report."""
    validation: ValidationProgress | None = None
    """The latest validation run (highest step), when spec.data.validation is set."""
    tracking: list[TrackerProgress] | None = pydantic.Field(default=None, max_length=3)
    """The experiment trackers (spec.tracking): drives the TrackingReady condition."""
    utilization: Utilization | None = None
    """The trainer's wait and the fleet's backlog over recent steps (spec.rollout.autoscale's signals)."""


class Restarts(base.APIModel):
    """Restarts the operator performed, per role."""

    trainer: int = 0
    """Trainer gang restarts (every trainer pod recreated)."""
    rollout: int = 0
    """Rollout pods replaced after a failure."""


class AsyncRLJobStatus(base.APIModel):
    """What the job is doing."""

    phase: Phase = "Pending"
    """Pending, Starting, Running, Suspended, Restarting, Succeeded or Failed."""
    message: str = ""
    """Why the job is in this phase."""
    reason: str = pydantic.Field(default="", max_length=128)
    """Short CamelCase reason of the job's most pressing problem (e.g. Unauthorized, Unschedulable,
    CrashLoopBackOff, RestartBudgetExhausted), empty when there is none; a printer column."""
    conditions: list[Condition] = pydantic.Field(default_factory=list)
    """Ready, RolloutReady, TrainerReady, BusReady, WeightSyncReady, Progressing, Stalled, Degraded,
    EndpointsReady, InvalidSpec; AgentsReady with spec.agent.workers."""
    observed_generation: int = 0
    """The spec generation the operator last reconciled."""
    rollout: RoleStatus = pydantic.Field(default_factory=RoleStatus)
    """Rollout replicas."""
    trainer: RoleStatus = pydantic.Field(default_factory=RoleStatus)
    """Trainer replicas."""
    agents: RoleStatus | None = None
    """Agent worker pods (spec.agent.workers), absent without workers."""
    restarts: Restarts = pydantic.Field(default_factory=Restarts)
    """Restarts per role."""
    progress: Progress | None = None
    """Training progress (written by trainer rank 0)."""
    autoscale: AutoscaleStatus | None = None
    """spec.rollout.autoscale's last decision (absent without it)."""
    config_hash: str | None = None
    """Hash of the rendered job config the pods run with."""
    start_time: str | None = None
    """RFC 3339 time the job first became Running."""
    completion_time: str | None = None
    """RFC 3339 time the job reached Succeeded or Failed (ttlSecondsAfterFinished counts from here)."""

    def condition(self, type_: ConditionType) -> Condition | None:
        """The condition of that type, if present."""
        return next((c for c in self.conditions if c.type == type_), None)
