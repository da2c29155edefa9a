"""What spec.model.dtype means for the trainer: FSDP2's mixed-precision policy on GPU, float32 on CPU.

Called by trainer/backend.py (FSDP2Backend: the policy it shards with, the dtype weight sync sends;
trainer/main.py passes spec.model.dtype and spec.rollout.gpusPerReplica in TrainSettings). Pure
functions of the spec, the device and the model's config.json, so the choice is unit-tested without a
GPU (tests/unit/test_trainer_precision.py).

GPU: the model loads in float32 and stays float32 in FSDP2's shards: those are the master weights
the optimizer updates. `fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype=<dtype>,
reduce_dtype=float32))` all-gathers each unit's parameters cast to <dtype>, so forward and backward
run in <dtype>, and reduce-scatters gradients in float32 into the float32 shards (torchtitan's and
verl's recipe). float16 adds dynamic loss scaling (FSDP's ShardedGradScaler), bfloat16 needs none.
`auto` is the dtype the model's config.json names (float32 when it names none); float32 is no policy.

CPU: float32, with the reason logged once. Low-precision CPU kernels are slow and partly missing, and
the CPU rollout engines run float32 too (rollout/main.py), so float32 training is what keeps the
trainer's logprobs equal to the engine's (the loop's fresh_logprob_gap) on the machines tests run on.

Weight sync sends the full tensors in the dtype the rollout engines hold (``engine_dtype``): the
float32 master weights rounded once, exactly what the engine would round them to when loading, at
half the bytes for a bfloat16 engine. The trainer's own forward uses the same rounding (the policy's
cast), so a GPU engine holds the weights the trainer computed its logprobs with.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import torch
import torch.distributed.fsdp

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclasses.dataclass(frozen=True)
class Precision:
    compute: torch.dtype
    """dtype of the unsharded parameters in forward and backward; the shards stay float32."""
    policy: torch.distributed.fsdp.MixedPrecisionPolicy | None
    """What fully_shard gets; None: compute in the parameters' own dtype (float32)."""
    loss_scaling: bool
    """float16 compute: gradients need dynamic loss scaling to not underflow."""
    note: str | None
    """Why the trainer does not compute in spec.model.dtype, for the log (None when it does)."""


def config_dtype(model_path: str | pathlib.Path) -> str | None:
    """The dtype a Hugging Face config.json names (`dtype`, or `torch_dtype` before transformers 5)."""
    try:
        config = json.loads((pathlib.Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = (config.get("dtype") or config.get("torch_dtype")) if isinstance(config, dict) else None
    return value if isinstance(value, str) else None


def resolve(dtype: str, model_dtype: str | None) -> torch.dtype:
    """spec.model.dtype as a torch dtype; `auto` is the model config's dtype (float32 if none or unknown)."""
    if dtype == "auto":
        return DTYPES.get(model_dtype or "", torch.float32)
    return DTYPES[dtype]


def choose(dtype: str, device_type: str, model_dtype: str | None) -> Precision:
    """The trainer's precision for spec.model.dtype `dtype` on a `device_type` ("cuda", "cpu") device,
    with `model_dtype` what the model's config.json names (``config_dtype``)."""
    wanted = resolve(dtype, model_dtype)
    shown = dtype if dtype != "auto" else f"auto ({model_dtype or 'not in config.json'})"
    if wanted == torch.float32:
        return Precision(torch.float32, None, False, None)
    if device_type != "cuda":
        note = (
            f"model.dtype {shown} ignored on CPU: {device_type} kernels for it are slow or missing and the "
            "CPU rollout engines hold float32 weights; training in float32"
        )
        return Precision(torch.float32, None, False, note)
    policy = torch.distributed.fsdp.MixedPrecisionPolicy(param_dtype=wanted, reduce_dtype=torch.float32)
    return Precision(wanted, policy, wanted == torch.float16, None)


def engine_dtype(dtype: str, rollout_gpus: int, model_dtype: str | None) -> torch.dtype:
    """The dtype weight sync sends: what the rollout engines hold (rollout/main.py engine_settings:
    float32 on CPU, spec.model.dtype on GPU). For `auto` the config's dtype: when vLLM's own `auto`
    picks lower (it serves a float32 config in bfloat16) the engine rounds on load, as it would have."""
    return torch.float32 if rollout_gpus == 0 else resolve(dtype, model_dtype)
