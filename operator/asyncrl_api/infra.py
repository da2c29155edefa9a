"""How a job's parts are wired: the trajectory bus, the weight-sync group, staleness and queue
limits, scheduling, volumes and progress reporting.

Imported by ``asyncrl_api.models`` (the spec tree), by the operator's renderer (NATS, ports,
scheduler fields, volumes) and by the workloads (bus, weight sync, staleness filter, reporter).
"""

from __future__ import annotations

from typing import Literal

import pydantic

from asyncrl_api import base

DEFAULT_NATS_IMAGE = "nats:2.11-alpine"
METRICS_PORT = 9400
"""Every pod's /metrics port (config.DEFAULT_METRICS_PORT; a unit test keeps the two equal)."""
TRAINER_PORTS = {29500: "the trainer's torch master port", METRICS_PORT: "every pod's metrics port"}
"""Ports trainer rank 0 already listens on (29500 is config.DEFAULT_TORCH_MASTER_PORT): the weight-sync
store cannot take them."""


class QueueSpec(base.APIModel):
    """The trajectory queue between rollouts and the trainer (a JetStream work-queue stream)."""

    max_size: int = pydantic.Field(default=512, ge=1, le=10_000_000)
    """Trajectories the queue holds at most (verl max_queue_size)."""
    when_full: Literal["dropOldest", "block"] = "dropOldest"
    """dropOldest: the stream discards its oldest trajectory (counted as dropped, reason queue_full);
    block: publishers back off until the trainer consumes (counted as blocked time)."""


class AsyncSpec(base.APIModel):
    """How far generation may run ahead of training."""

    max_staleness: int | None = pydantic.Field(default=None, ge=0, le=1024)
    """Policy versions a sample may lag the trainer when consumed; older samples are dropped and
    counted (reason stale). Unset = derived from mode: async 2, one-step-off 1, sync 0."""
    sync_every_steps: int = pydantic.Field(default=1, ge=1, le=100_000)
    """Trainer steps between weight broadcasts (verl trigger_parameter_sync_step)."""
    require_batches: int = pydantic.Field(default=1, ge=1, le=1024)
    """Mini-batches gathered from the queue before an update may start (verl require_batches)."""
    queue: QueueSpec = pydantic.Field(default_factory=QueueSpec)
    """Trajectory queue limits."""


_NATS_RULES = (
    base.Rule(
        cel="self.managed != has(self.url)",
        message="set either bus.nats.managed: true or bus.nats.url, not both and not neither",
        field_path=".url",
        check=lambda n: n.managed != (n.url is not None),
    ),
    base.Rule(
        cel="has(self.storage) == has(oldSelf.storage)"
        " && (!has(self.storage) || self.storage == oldSelf.storage)",
        message="bus.nats.storage is immutable (a StatefulSet's volumeClaimTemplates cannot change)",
        field_path=".storage",
    ),
    base.Rule(
        cel="self.managed || !has(self.storage)",
        message="bus.nats.storage only applies to a managed NATS",
        field_path=".storage",
        check=lambda n: n.managed or n.storage is None,
    ),
    base.Rule(
        cel="!self.managed || !has(self.credentialsSecret)",
        message="bus.nats.credentialsSecret is for an external server (bus.nats.url); the managed NATS"
        " runs without auth inside the job's network policy: leave it unset",
        field_path=".credentialsSecret",
        check=lambda n: not n.managed or n.credentials_secret is None,
    ),
)


class NatsSpec(base.APIModel):
    """NATS JetStream, managed by the operator (one small server per job) or external."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_NATS_RULES))

    managed: bool = True
    """True: the operator runs a NATS server for this job (JetStream on, file storage)."""
    url: str | None = pydantic.Field(default=None, pattern=r"^(nats|tls)://", max_length=2048)
    """External server URL, e.g. nats://nats.infra.svc:4222 (with managed: false)."""
    credentials_secret: str | None = pydantic.Field(default=None, min_length=1, max_length=253)
    """Secret with key `creds` (a NATS .creds file) for an external server."""
    image: str = pydantic.Field(
        default=DEFAULT_NATS_IMAGE, min_length=1, max_length=1024, pattern=r"^[^\s]+$"
    )
    """Image of the managed NATS server."""
    storage: str | None = pydantic.Field(default=None, max_length=32, pattern=r"^[0-9]+(Ki|Mi|Gi|Ti)$")
    """Size of a PersistentVolumeClaim for the managed server's JetStream store; unset = emptyDir
    (trajectories in the queue survive NATS restarts only with a claim)."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> NatsSpec:
        base.check_rules(self, _NATS_RULES)
        return self


class BusSpec(base.APIModel):
    """The trajectory bus."""

    nats: NatsSpec = pydantic.Field(default_factory=NatsSpec)
    """NATS JetStream settings."""


_WEIGHT_SYNC_RULES = (
    base.Rule(
        cel=f"!(self.port in {sorted(TRAINER_PORTS)}) && !((self.port + 1) in {sorted(TRAINER_PORTS)})",
        message="weightSync.port and the port above it (NCCL's own group) may not be "
        + " or ".join(f"{port} ({what})" for port, what in sorted(TRAINER_PORTS.items())),
        field_path=".port",
        check=lambda w: not {w.port, w.port + 1} & set(TRAINER_PORTS),
    ),
)


class WeightSyncSpec(base.APIModel):
    """The weight-broadcast group (trainer rank 0 + every rollout engine worker); how weights travel and
    reach the engine: docs/weight-sync.md."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_WEIGHT_SYNC_RULES))

    backend: Literal["nccl", "gloo"] = "nccl"
    """Collective backend: nccl when both roles have GPUs, gloo when neither has (a job with GPUs on one
    role only cannot sync weights and is refused)."""
    port: int = pydantic.Field(default=29600, ge=1024, le=65534)
    """TCPStore rendezvous port on trainer rank 0 (nccl also uses the port above it)."""
    timeout_seconds: int = pydantic.Field(default=120, ge=1, le=3600)
    """Deadline for every collective: a broadcast never waits longer; late members are dropped."""
    bucket_mb: int = pydantic.Field(default=512, alias="bucketMB", ge=1, le=65536)
    """Size of the flattened buckets weights are broadcast in."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> WeightSyncSpec:
        base.check_rules(self, _WEIGHT_SYNC_RULES)
        return self


class SchedulingSpec(base.APIModel):
    """How pods are placed."""

    gang: bool = True
    """Schedule the trainer all-or-nothing. Always: its pods are created in parallel and a failed one
    restarts the whole gang. With schedulerName scheduler-plugins-scheduler (coscheduling) or volcano, a
    PodGroup <job>-trainer (minMember = trainer.replicas, minResources = the gang's requests) is declared
    and the trainer pods name it; with queueName, Kueue admits the trainer pods as one pod group, all or
    none. false: no PodGroup, and the trainer pods are separate Kueue workloads."""
    scheduler_name: str | None = pydantic.Field(default=None, min_length=1, max_length=253)
    """Scheduler for both roles; unset = the default scheduler. scheduler-plugins-scheduler and volcano
    get a PodGroup for the trainer gang (their CRDs must be installed); any other name is passed on."""
    queue_name: str | None = pydantic.Field(default=None, min_length=1, max_length=63)
    """Kueue LocalQueue of the job (label kueue.x-k8s.io/queue-name; Kueue's pod and statefulset
    integrations must be enabled): the trainer gang is one workload, admitted whole, each rollout pod
    its own; pods wait, gated, until the queue admits them."""
    priority_class_name: str | None = pydantic.Field(default=None, min_length=1, max_length=253)
    """PriorityClass of every pod."""


class VolumeSpec(base.APIModel):
    """An existing PersistentVolumeClaim mounted into every pod of both roles (models, data, checkpoints)."""

    name: str = pydantic.Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Volume name inside the pod."""
    claim_name: str = pydantic.Field(min_length=1, max_length=253)
    """PersistentVolumeClaim name in the job's namespace (ReadWriteMany for multi-node checkpoints)."""
    mount_path: str = pydantic.Field(min_length=2, max_length=4096, pattern=r"^/")
    """Where it is mounted."""
    read_only: bool = False
    """Mount read-only."""


CODE_MOUNT_PATH = "/opt/asyncrl-code"
"""Where spec.code.configMap's files are mounted in rollout and trainer pods (first on PYTHONPATH)."""

_CODE_RULES = (
    base.Rule(
        cel="has(self.configMap) != has(self.path)",
        message="code needs exactly one of configMap (its Python files) and path (a directory in the pod)",
        field_path=".configMap",
        check=lambda c: (c.config_map is None) != (c.path is None),
    ),
)


class CodeSpec(base.APIModel):
    """Your own Python code without building an image: reward functions, tools, tool parsers. Its directory
    is first on PYTHONPATH of every rollout and trainer process, so `reward.function: my_reward:compute_score`
    and `agent.tools` import from it (the start-up import checks name the field when a module is missing)."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_CODE_RULES))

    config_map: str | None = pydantic.Field(
        default=None, min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
    )
    """A ConfigMap in the job's namespace whose keys are Python files (`kubectl create configmap
    my-code --from-file=my_reward.py`), mounted read-only at /opt/asyncrl-code. Python reads a module
    once: after changing the ConfigMap, restart the pods (`kubectl rollout restart statefulset
    <job>-rollout <job>-trainer`). A cluster object: `asyncrl run` takes path."""
    path: str | None = pydantic.Field(default=None, min_length=2, max_length=4096, pattern=r"^/")
    """A directory already in the pods (on one of spec.volumes, or in the image) holding modules or
    packages; with `asyncrl run`, a directory on this machine."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> CodeSpec:
        base.check_rules(self, _CODE_RULES)
        return self

    def directory(self) -> str:
        """The directory put on PYTHONPATH."""
        return self.path or CODE_MOUNT_PATH


class ProgressSpec(base.APIModel):
    """How the trainer reports progress into status.progress, and when a job counts as stalled."""

    report_interval_seconds: int = pydantic.Field(default=5, ge=1, le=3600)
    """Trainer rank 0 patches status.progress at most this often."""
    stalled_after_seconds: int = pydantic.Field(default=900, ge=10, le=604_800)
    """Condition Stalled becomes True when the step has not advanced for this long while Running."""


class FailurePolicySpec(base.APIModel):
    """When a job that keeps failing stops trying."""

    max_restarts: int | None = pydantic.Field(default=10, ge=0, le=1_000_000)
    """Restarts the job may take in all (container restarts of its pods, trainer gang restarts and
    replaced rollout pods) before it ends Failed with the last error line of the failing container;
    unset (null) = restart forever."""
