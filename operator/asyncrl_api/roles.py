"""The two roles of an AsyncRLJob: rollout (vLLM generation) and trainer (policy updates).

Imported by ``asyncrl_api.models`` (the spec tree), by the operator's renderer (replicas, GPUs,
images, scheduling knobs) and by the workloads (engine, sampling, algorithm, optimizer, batch).
"""

from __future__ import annotations

import functools
import re
from typing import Annotated, Any, Literal

import pydantic

from asyncrl_api import algorithm as algorithm_mod
from asyncrl_api import autoscale as autoscale_mod
from asyncrl_api import base
from asyncrl_api import lora as lora_mod

QUANTITY = r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]+))?$"
"""A non-negative Kubernetes resource quantity ("4", "0.5", "500m", "16Gi", "1e3")."""

Quantity = (
    Annotated[int, pydantic.Field(ge=0, le=2**53)]
    | Annotated[str, pydantic.Field(max_length=64, pattern=QUANTITY)]
)
"""A Kubernetes resource quantity (4, "4", "16Gi"); int-or-string in the CRD, the bounds of both
branches on the one node (each applies to its own type)."""

LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
"""A Kubernetes label or resource key: an optional DNS-subdomain prefix and a name."""
LabelKey = Annotated[str, pydantic.Field(min_length=1, max_length=317, pattern=LABEL_KEY)]
LabelValue = Annotated[
    str, pydantic.Field(max_length=63, pattern=r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
]

IMAGE = r"^[^\s]+$"
"""A container image reference: no whitespace (the registry checks the rest when the image is pulled)."""
MAX_IMAGE_LENGTH = 1024

GPU_RESOURCE = "nvidia.com/gpu"

DEFAULT_ROLLOUT_IMAGE = "ghcr.io/asyncrl/rollout:0.1.0"
DEFAULT_TRAINER_IMAGE = "ghcr.io/asyncrl/trainer:0.1.0"


_TOLERATION_RULES = (
    # The pod validation's own rules: a StatefulSet with such a toleration never gets a pod.
    base.Rule(
        cel="self.operator == 'Exists' || has(self.key)",
        message="a toleration without key must have operator Exists (it then tolerates every taint)",
        field_path=".key",
        check=lambda t: t.operator == "Exists" or t.key is not None,
    ),
    base.Rule(
        cel="self.operator != 'Exists' || !has(self.value) || self.value == ''",
        message="a toleration with operator Exists matches any value: leave value unset",
        field_path=".value",
        check=lambda t: t.operator != "Exists" or not t.value,
    ),
    base.Rule(
        cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
        message="tolerationSeconds only applies with effect NoExecute",
        field_path=".tolerationSeconds",
        check=lambda t: t.toleration_seconds is None or t.effect == "NoExecute",
    ),
)


def _no_gpus_rule(field: str) -> dict[str, Any]:
    """CEL for a map of resources: GPUs come from gpusPerReplica (pydantic: ``Resources._no_gpus``)."""
    return base.cel_extra(
        base.Rule(
            cel=f"!('{GPU_RESOURCE}' in self)",
            message=f"{GPU_RESOURCE} comes from the role's gpusPerReplica, not from resources.{field}",
        ),
    )


class Toleration(base.APIModel):
    """A pod toleration (same fields as Kubernetes' core/v1 Toleration)."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_TOLERATION_RULES))

    key: LabelKey | None = None
    """Taint key the toleration applies to; empty with operator Exists matches every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Exists matches any value; Equal requires ``value`` to match."""
    value: LabelValue | None = None
    """Taint value to match when operator is Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches all effects."""
    toleration_seconds: int | None = pydantic.Field(default=None, ge=0, le=2**31 - 1)
    """For NoExecute: how long the pod stays bound after the taint appears; unset = forever."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> Toleration:
        base.check_rules(self, _TOLERATION_RULES)
        return self


class Resources(base.APIModel):
    """Extra container resources on top of the GPUs the role asks for (cpu, memory, ...)."""

    requests: dict[LabelKey, Quantity] = pydantic.Field(
        default_factory=dict, max_length=32, json_schema_extra=_no_gpus_rule("requests")
    )
    """Resource requests, e.g. {cpu: 8, memory: 64Gi}. GPUs come from gpusPerReplica, not from here."""
    limits: dict[LabelKey, Quantity] = pydantic.Field(
        default_factory=dict, max_length=32, json_schema_extra=_no_gpus_rule("limits")
    )
    """Resource limits, e.g. {memory: 64Gi}."""

    @pydantic.field_validator("requests", "limits")
    @classmethod
    def _no_gpus(cls, value: dict[str, Quantity]) -> dict[str, Quantity]:
        if GPU_RESOURCE in value:
            raise ValueError(f"{GPU_RESOURCE} comes from the role's gpusPerReplica, not from resources")
        return value


RESERVED_ENGINE_ARGS: dict[str, str] = {
    "model": "model.path",
    "dtype": "model.dtype",
    "max_model_len": "rollout.engine.maxModelLen",
    "enforce_eager": "rollout.engine.enforceEager",
    "gpu_memory_utilization": "rollout.engine.gpuMemoryUtilization",
    "tensor_parallel_size": "rollout.gpusPerReplica",
    "seed": "asyncrl's per-replica seeds",
    "logprobs_mode": "asyncrl's behaviour logprobs",
    "worker_extension_cls": "asyncrl's weight sync",
    "weight_transfer_config": "weightSync.backend",
}
"""Engine arguments the rollout sets itself (rollout/engine.py), and the spec field each comes from: vLLM's
AsyncEngineArgs would get them twice and the rollout would crash at start."""

ENGINE_ARG_VALUE_LENGTH = 4096

ENGINE_ARG_NAME = r"^[a-z_][a-z0-9_]{0,63}$"

_RESERVED_ENGINE_ARGS_MESSAGE = "rollout.engine.args may not set what asyncrl sets itself: " + ", ".join(
    f"{name} (from {source})" for name, source in RESERVED_ENGINE_ARGS.items()
)
_ENGINE_ARGS_SCHEMA: dict[str, Any] = {
    # The apiserver gives CEL no type for a map of untyped values (any rule naming `args` fails to
    # compile), so the CRD refuses the reserved names with a structural `not` (its message is generic;
    # the operator's handler and the local runner give _RESERVED_ENGINE_ARGS_MESSAGE) and bounds the
    # values: maxLength bounds a string, maxProperties/maxItems 0 refuse an object or a list (JSON Schema
    # applies each to its own type only).
    "not": {"anyOf": [{"required": [name]} for name in sorted(RESERVED_ENGINE_ARGS)]},
    "additionalProperties": {
        "x-kubernetes-preserve-unknown-fields": True,
        "maxLength": ENGINE_ARG_VALUE_LENGTH,
        "maxProperties": 0,
        "maxItems": 0,
    },
}

EngineArgValue = Annotated[str, pydantic.Field(max_length=ENGINE_ARG_VALUE_LENGTH)] | int | float | bool


class EngineSpec(base.APIModel):
    """The inference engine each rollout replica runs."""

    name: Literal["vllm"] = "vllm"
    """Engine implementation. Only vLLM today (pinned minor version; how weights reach it:
    docs/weight-sync.md)."""
    max_model_len: int = pydantic.Field(default=8192, ge=16, le=1_048_576)
    """Context length (prompt + response tokens) the engine reserves KV cache for."""
    gpu_memory_utilization: float = pydantic.Field(default=0.85, gt=0.0, le=1.0)
    """Fraction of each GPU's memory vLLM may use for weights + KV cache."""
    enforce_eager: bool = False
    """Disable CUDA graphs (slower, but starts faster and uses less memory). Always on for CPU engines."""
    args: dict[str, EngineArgValue] = pydantic.Field(
        default_factory=dict, max_length=64, json_schema_extra=_ENGINE_ARGS_SCHEMA
    )
    """Extra vLLM engine arguments by their Python name (e.g. {max_num_seqs: 256}): numbers, booleans
    or strings, passed through to vLLM's AsyncEngineArgs (an unknown name fails the rollout at start).
    Refused because asyncrl sets them itself: model (model.path), dtype (model.dtype), max_model_len,
    enforce_eager, gpu_memory_utilization (rollout.engine), tensor_parallel_size
    (rollout.gpusPerReplica), weight_transfer_config (weightSync), seed, logprobs_mode,
    worker_extension_cls."""

    @pydantic.field_validator("args")
    @classmethod
    def _check_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        if set(args) & set(RESERVED_ENGINE_ARGS):
            raise ValueError(_RESERVED_ENGINE_ARGS_MESSAGE)
        for name in args:
            if not re.match(ENGINE_ARG_NAME, name):
                raise ValueError(f"rollout.engine.args: {name!r} is not a vLLM engine argument name")
        return args


class SamplingSpec(base.APIModel):
    """How rollouts sample responses."""

    temperature: float = pydantic.Field(default=1.0, ge=0.0, le=10.0)
    """Sampling temperature. RL needs exploration: keep it near 1.0."""
    top_p: float = pydantic.Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass. 1.0 keeps behaviour logprobs exact for off-policy correction."""
    max_tokens: int = pydantic.Field(default=2048, ge=1, le=1_048_576)
    """Maximum response tokens per sample."""
    n: int = pydantic.Field(default=8, ge=1, le=1024, alias="samplesPerPrompt")
    """Samples per prompt (vLLM's `n`): the group size GRPO normalises advantages over. Named
    samplesPerPrompt in YAML because kubectl's YAML reader turns an unquoted key `n` into `false`."""


_ROLLOUT_RULES = (
    base.Rule(
        cel="self.partialRollout || self.kvCacheOnUpdate == 'recompute'",
        message="kvCacheOnUpdate keep only applies with partialRollout true (without it no request is in"
        " flight across an update): leave it recompute",
        field_path=".kvCacheOnUpdate",
        check=lambda r: r.partial_rollout or r.kv_cache_on_update == "recompute",
    ),
)


class RolloutSpec(base.APIModel):
    """The rollout role: a StatefulSet of vLLM replicas generating trajectories. Scalable via /scale."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_ROLLOUT_RULES))

    replicas: int = pydantic.Field(default=1, ge=0, le=1024)
    """Rollout replicas (one vLLM engine each). The target of `kubectl scale asyncrljob/x --replicas=N`;
    changing it never restarts the trainer. New replicas join weight sync at the next policy version."""
    gpus_per_replica: int = pydantic.Field(default=1, ge=0, le=64)
    """nvidia.com/gpu per rollout pod (= vLLM tensor-parallel size). 0 runs the CPU engine."""
    image: str = pydantic.Field(
        default=DEFAULT_ROLLOUT_IMAGE, min_length=1, max_length=MAX_IMAGE_LENGTH, pattern=IMAGE
    )
    """Container image with vLLM and asyncrl's rollout entry point (`asyncrl-rollout`)."""
    engine: EngineSpec = pydantic.Field(default_factory=EngineSpec)
    """Inference engine settings."""
    sampling: SamplingSpec = pydantic.Field(default_factory=SamplingSpec)
    """Sampling settings."""
    partial_rollout: bool = True
    """On a weight update, interrupt in-flight requests, keep their prefix and continue under the new
    weights (tokens then carry several policy versions). False lets in-flight requests finish first."""
    kv_cache_on_update: Literal["recompute", "keep"] = "recompute"
    """What an update does to the KV cache of requests in flight (only with partialRollout true).
    recompute: their KV is dropped and rebuilt, so every token after the switch is sampled from the
    new policy exactly. keep: they go on with the KV the old weights computed (no re-prefill, faster;
    PipelineRL-style). Behaviour logprobs stay exactly what was sampled, all that decoupled PPO / TIS
    need; a sample may have been shaped by the policy it was submitted under, which is its oldest
    token version unless it waited unscheduled across the update. A request only reuses prefix-cache
    blocks of requests submitted under the same version."""
    max_inflight_prompts: int = pydantic.Field(default=16, ge=1, le=65536)
    """Prompts each replica keeps in flight at once (each expands to sampling.n requests)."""
    resources: Resources = pydantic.Field(default_factory=Resources)
    """Extra resources (cpu, memory) per rollout pod."""
    node_selector: dict[LabelKey, LabelValue] = pydantic.Field(default_factory=dict, max_length=64)
    """Node labels rollout pods must match, e.g. {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}."""
    tolerations: list[Toleration] = pydantic.Field(default_factory=list, max_length=32)
    """Tolerations for rollout pods."""
    autoscale: autoscale_mod.AutoscaleSpec | None = None
    """Size `replicas` from the trainer's report (docs/autoscaling.md): the operator changes it through
    the /scale subresource, within minReplicas..maxReplicas. Only one controller may own the replicas:
    not together with an HPA or a KEDA ScaledObject on this job."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> RolloutSpec:
        base.check_rules(self, _ROLLOUT_RULES)
        return self


class Parallelism(base.APIModel):
    """Model parallelism of the trainer. Data parallelism is derived: dp = total GPUs / (tp*pp*cp)."""

    tp: int = pydantic.Field(default=1, ge=1, le=64)
    """Tensor parallel size (backend megatron; must divide the trainer's processes and the model's
    attention heads). 1 with fsdp2: it shards over a 1-D data-parallel mesh."""
    pp: int = pydantic.Field(default=1, ge=1, le=64)
    """Pipeline parallel size. Must be 1 today (megatron's pipeline schedule is not built yet)."""
    cp: int = pydantic.Field(default=1, ge=1, le=64)
    """Context parallel size. Must be 1 today with either backend."""
    ep: int = pydantic.Field(default=1, ge=1, le=256)
    """Expert parallel size for MoE models. Must be 1 today (dense models only)."""


AlgorithmSpec = algorithm_mod.AlgorithmSpec
"""spec.trainer.algorithm (asyncrl_api/algorithm.py)."""


class OptimizerSpec(base.APIModel):
    """AdamW settings."""

    name: Literal["adamw"] = "adamw"
    """Optimizer."""
    lr: float = pydantic.Field(default=1e-6, gt=0.0, le=1.0)
    """Learning rate."""
    weight_decay: float = pydantic.Field(default=0.0, ge=0.0, le=1.0)
    """Decoupled weight decay."""
    grad_clip: float = pydantic.Field(default=1.0, gt=0.0, le=1e6)
    """Max global gradient norm."""
    warmup_steps: int = pydantic.Field(default=0, ge=0, le=1_000_000)
    """Linear learning-rate warmup steps."""


class BatchSpec(base.APIModel):
    """What one trainer step consumes."""

    prompts: int = pydantic.Field(default=64, ge=1, le=1_000_000)
    """Prompt groups per step (each group holds sampling.n trajectories)."""
    mini_batches: int = pydantic.Field(default=4, ge=1, le=4096)
    """Optimizer updates per step: the step's batch is split into this many mini-batches."""
    micro_batch_tokens: int = pydantic.Field(default=8192, ge=64, le=16_777_216)
    """Padded tokens per trainer rank in one forward/backward: each mini-batch is split into
    length-sorted micro-batches of at most this size (gradients accumulate), so long-tailed responses
    do not pad every row to the longest; with memory.packing, real tokens. Lower it when a step runs
    out of accelerator memory."""


class MemorySpec(base.APIModel):
    """How the trainer fits a model and long sequences in accelerator memory (docs/model-scale.md).
    Backend settings, applied where the model is built and sharded; none changes the loss or the
    gradients (tests/dataplane/test_memory.py)."""

    activation_checkpointing: bool = True
    """Keep only each decoder layer's input in forward and recompute the layer in backward (verl's
    default): activation memory drops from all layers' to about one layer's, for about one more
    forward of compute. fsdp2: torch.utils.checkpoint around every decoder layer; megatron: its full
    uniform recompute of every layer on GPU, torch.utils.checkpoint around every layer on CPU (megatron's
    recompute saves the CUDA RNG state)."""
    logprob_chunk_tokens: int | None = pydantic.Field(default=None, ge=0, le=1_048_576)
    """Log-probabilities and entropy are computed from the final hidden states this many tokens at a
    time (the language-model head, log-softmax and the token's pick per chunk, each chunk recomputed
    in backward), so [tokens x vocabulary] logits never exist for a whole micro-batch: for a 152k
    vocabulary a 16k-token micro-batch's float32 logits would hold 10 GB. Unset: sized for the
    vocabulary, as many tokens as keep one chunk's float32 logits within 512 MiB (4096 tokens at a 32k
    vocabulary, 883 at Qwen's 152k; megatron: the vocabulary per tensor-parallel rank). 0: the whole
    micro-batch's logits at once. Both backends (megatron: each chunk's logits also split over
    tensor-parallel ranks, its vocabulary-parallel log-softmax)."""
    packing: bool = False
    """Pack each micro-batch's sequences into one row without padding (fsdp2): position ids restart at
    each sequence, and attention takes the sequences' lengths instead of a mask (flash-attention's varlen
    kernel where flash-attn is installed, else one causal sdpa call per sequence); batch.microBatchTokens
    then counts real tokens. The
    same log-probabilities and gradients as the padded rows; megatron refuses it (its CPU attention
    takes no packed sequences and its GPU path is not built for them)."""
    offload: bool = False
    """Keep what the accelerator does not need between uses in CPU memory. fsdp2: torch's
    CPUOffloadPolicy (parameter shards, gradients and the optimizer step on the CPU; each layer's
    parameters are copied in for its forward and backward); megatron: its distributed optimizer's
    CPU offload (Adam's float32 state and step on the CPU; such a job does not resume from its
    checkpoints yet: the trainer refuses, and resumes with offload false). Needs gpusPerReplica > 0."""


_CHECKPOINT_RULES = (
    base.Rule(
        cel="self.everySteps > 0 || self.keep == 2",
        message="checkpoint.keep has no effect with everySteps 0 (no checkpoints): leave it unset",
        field_path=".keep",
        check=lambda c: c.every_steps > 0 or c.keep == 2,
    ),
)


class CheckpointSpec(base.APIModel):
    """Trainer checkpoints, used to resume after a gang restart."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_CHECKPOINT_RULES))

    path: str = pydantic.Field(default="/checkpoints", min_length=1, max_length=4096)
    """Directory for checkpoints (put it on a volume from spec.volumes to survive pod restarts)."""
    every_steps: int = pydantic.Field(default=50, ge=0, le=1_000_000)
    """Save every N steps; 0 disables checkpointing."""
    keep: int = pydantic.Field(default=2, ge=1, le=1000)
    """How many recent checkpoints to keep."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> CheckpointSpec:
        base.check_rules(self, _CHECKPOINT_RULES)
        return self


def _one_with_fsdp2(axis: str, trainer: Any) -> bool:
    return bool(trainer.backend != "fsdp2" or getattr(trainer.parallelism, axis) == 1)


_TRAINER_RULES = (
    base.Rule(
        cel="self.gpusPerReplica == 0"
        " || self.gpusPerReplica % (self.parallelism.tp * self.parallelism.cp) == 0",
        message="parallelism.tp * parallelism.cp must divide gpusPerReplica",
        field_path=".parallelism.tp",
        check=lambda t: (
            t.gpus_per_replica == 0 or t.gpus_per_replica % (t.parallelism.tp * t.parallelism.cp) == 0
        ),
    ),
    base.Rule(
        cel="(self.replicas * (self.gpusPerReplica == 0 ? 1 : self.gpusPerReplica)) % "
        "(self.parallelism.tp * self.parallelism.pp * self.parallelism.cp) == 0",
        message="tp * pp * cp must divide the trainer's total GPUs (replicas * gpusPerReplica)",
        field_path=".parallelism",
        check=lambda t: (
            (t.replicas * max(t.gpus_per_replica, 1))
            % (t.parallelism.tp * t.parallelism.pp * t.parallelism.cp)
            == 0
        ),
    ),
    base.Rule(
        cel="self.backend != 'megatron' || self.parallelism.pp == 1",
        message="parallelism.pp must be 1 with backend megatron: its pipeline schedule is not built yet"
        " (megatron-core's schedules allocate on CUDA, pipeline_parallel/schedules.py:596, and the"
        " backend runs one model chunk per rank); use tp and data parallelism",
        field_path=".parallelism.pp",
        check=lambda t: t.backend != "megatron" or t.parallelism.pp == 1,
    ),
    base.Rule(
        cel="self.backend != 'megatron' || (self.parallelism.cp == 1 && self.parallelism.ep == 1)",
        message="parallelism.cp and parallelism.ep must be 1 with backend megatron: context parallelism and"
        " mixture-of-experts models are not supported by its model conversion (dense Llama/Qwen2 only)",
        field_path=".parallelism",
        check=lambda t: t.backend != "megatron" or (t.parallelism.cp == 1 and t.parallelism.ep == 1),
    ),
    *(
        base.Rule(
            cel=f"self.backend != 'fsdp2' || self.parallelism.{axis} == 1",
            message=f"parallelism.{axis} must be 1 with backend fsdp2: it shards over a 1-D data-parallel"
            f" mesh ({what} parallelism is not implemented yet); dp comes from the GPU count",
            field_path=f".parallelism.{axis}",
            check=functools.partial(_one_with_fsdp2, axis),
        )
        for axis, what in (("tp", "tensor"), ("cp", "context"))
    ),
    base.Rule(
        cel="self.backend == 'megatron' || (self.parallelism.pp == 1 && self.parallelism.ep == 1)",
        message="pipeline (pp) and expert (ep) parallelism are not implemented with backend fsdp2 (nor yet"
        " with megatron): leave them 1",
        field_path=".parallelism",
        check=lambda t: t.backend == "megatron" or (t.parallelism.pp == 1 and t.parallelism.ep == 1),
    ),
    base.Rule(
        cel="self.backend != 'megatron' || !self.memory.packing",
        message="memory.packing is fsdp2's: megatron's attention here takes no packed sequences (its CPU"
        " attention refuses them, and its GPU path would need THD packed-sequence parameters); leave it"
        " false",
        field_path=".memory.packing",
        check=lambda t: t.backend != "megatron" or not t.memory.packing,
    ),
    base.Rule(
        cel="!self.memory.offload || self.gpusPerReplica > 0",
        message="memory.offload moves accelerator memory to the CPU: a CPU trainer (gpusPerReplica 0)"
        " has nothing to offload; leave it false",
        field_path=".memory.offload",
        check=lambda t: not t.memory.offload or t.gpus_per_replica > 0,
    ),
    base.Rule(
        cel="self.backend == 'fsdp2' || !has(self.lora)",
        message="lora is built on backend fsdp2 only (peft adapters on the FSDP2 policy); megatron has no"
        " LoRA yet: use backend fsdp2 or leave lora unset",
        field_path=".lora",
        check=lambda t: t.backend == "fsdp2" or t.lora is None,
    ),
    base.Rule(
        cel="self.batch.prompts >= self.batch.miniBatches",
        message="batch.miniBatches may not exceed batch.prompts",
        field_path=".batch.miniBatches",
        check=lambda t: t.batch.prompts >= t.batch.mini_batches,
    ),
)


class TrainerSpec(base.APIModel):
    """The trainer role: a gang of pods (one per node) running torchrun-style distributed training."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_TRAINER_RULES))

    replicas: int = pydantic.Field(default=1, ge=1, le=1024)
    """Trainer pods (= nodes). They form one gang: if one fails, all are recreated from the checkpoint."""
    gpus_per_replica: int = pydantic.Field(default=8, ge=0, le=64)
    """nvidia.com/gpu per trainer pod (= processes per node). 0 trains on CPU with gloo (one process)."""
    image: str = pydantic.Field(
        default=DEFAULT_TRAINER_IMAGE, min_length=1, max_length=MAX_IMAGE_LENGTH, pattern=IMAGE
    )
    """Container image with torch and asyncrl's trainer entry point (`asyncrl-trainer`)."""
    backend: Annotated[
        Literal["fsdp2", "megatron"], pydantic.Field(json_schema_extra=base.immutable("trainer.backend"))
    ] = "fsdp2"
    """Training backend: fsdp2 (torch FSDP2, data parallel) or megatron (megatron-core GPTModel, tensor
    parallel over parallelism.tp and data parallel over the rest; dense Llama/Qwen2-style models;
    docs/megatron.md). Immutable."""
    parallelism: Parallelism = pydantic.Field(default_factory=Parallelism)
    """Model parallelism; dp is derived."""
    algorithm: AlgorithmSpec = pydantic.Field(default_factory=AlgorithmSpec)
    """Objective and off-policy correction."""
    optimizer: OptimizerSpec = pydantic.Field(default_factory=OptimizerSpec)
    """Optimizer settings."""
    lora: lora_mod.LoraSpec | None = None
    """Train low-rank adapters instead of the whole policy (asyncrl_api/lora.py; docs/model-scale.md):
    only the adapters train, are checkpointed and are sent to the rollouts, which serve them as a vLLM
    LoRA adapter. Unset: full fine-tuning. fsdp2 only; its checkpoints resume only a LoRA job."""
    batch: BatchSpec = pydantic.Field(default_factory=BatchSpec)
    """Batch per step."""
    checkpoint: CheckpointSpec = pydantic.Field(default_factory=CheckpointSpec)
    """Checkpointing."""
    memory: MemorySpec = pydantic.Field(default_factory=MemorySpec)
    """Activation checkpointing, chunked log-probabilities and offload."""
    resources: Resources = pydantic.Field(default_factory=Resources)
    """Extra resources (cpu, memory) per trainer pod."""
    node_selector: dict[LabelKey, LabelValue] = pydantic.Field(default_factory=dict, max_length=64)
    """Node labels trainer pods must match."""
    tolerations: list[Toleration] = pydantic.Field(default_factory=list, max_length=32)
    """Tolerations for trainer pods."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> TrainerSpec:
        base.check_rules(self, _TRAINER_RULES)
        return self

    def nproc_per_node(self) -> int:
        """Processes per trainer pod: one per GPU, or one on CPU."""
        return max(self.gpus_per_replica, 1)

    def world_size(self) -> int:
        """Processes in the trainer's default process group."""
        return self.replicas * self.nproc_per_node()
