"""spec.trainer.lora on the FSDP2 backend: peft adapters on the policy, and their weight-sync payload.

Called by trainer/backend.py (FSDP2Backend wraps the policy with ``apply`` before FSDP2 shards it, sends
``adapter_tensors`` instead of the full weights, and runs the reference policy as the policy with the
adapters off), trainer/main.py (``settings`` from the spec, the sender's payload kind) and
trainer/export.py (``apply`` again on the base model to merge a checkpoint's adapters).

peft's ``get_peft_model(model, LoraConfig(...))`` freezes every base weight and adds ``lora_A`` (r x in)
and ``lora_B`` (out x r, zero-initialised, so version 0 is the base model exactly) beside each target
projection; the forward adds (alpha / r) * B A x. In the wrapped model's state dict an adapter weight is
``base_model.model.<module>.lora_A.default.weight`` ("default" is peft's adapter name); peft saves it,
and vLLM loads it, as ``base_model.model.<module>.lora_A.weight`` (``saved_name``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed.tensor

from asyncrl_workloads.weightsync import base as weightsync_base

ADAPTER = "default"
"""peft's name for the one adapter."""


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """spec.trainer.lora (asyncrl_api/lora.py)."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    dropout: float = 0.0

    def wire(self) -> weightsync_base.Adapter:
        """The weight-sync payload kind of this job's rounds."""
        return weightsync_base.Adapter(self.rank, self.alpha, self.target_modules)

    def meta(self) -> dict[str, Any]:
        """What a checkpoint's meta.json records (``asyncrl export`` rebuilds the adapters from it)."""
        return {"rank": self.rank, "alpha": self.alpha, "target_modules": list(self.target_modules),
                "dropout": self.dropout}  # fmt: skip

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> LoraSettings:
        return cls(int(meta["rank"]), float(meta["alpha"]), tuple(meta["target_modules"]),
                   float(meta.get("dropout", 0.0)))  # fmt: skip


def apply(model: torch.nn.Module, settings: LoraSettings) -> torch.nn.Module:
    """``model`` wrapped by peft with the adapters (base weights frozen, adapters trainable)."""
    peft: Any = importlib.import_module("peft")  # heavy and untyped: only here
    config = peft.LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        target_modules=list(settings.target_modules),
        lora_dropout=settings.dropout,
        bias="none",
        task_type="CAUSAL_LM",
    )
    wrapped: torch.nn.Module = peft.get_peft_model(model, config)
    return wrapped


def saved_name(name: str) -> str | None:
    """peft's saved (and vLLM's) name of a wrapped model's state-dict entry; None for a base weight."""
    if ".lora_A." not in name and ".lora_B." not in name:
        return None
    return name.replace(f".{ADAPTER}.", ".")


def adapter_tensors(
    model: torch.nn.Module, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(saved name, full tensor) of every adapter weight in a fixed order, cast to ``dtype`` when given.
    Collective like fsdp.full_tensors: every rank iterates to the end (only adapters are gathered)."""
    for name, value in model.state_dict().items():
        saved = saved_name(name)
        if saved is None:
            continue
        if isinstance(value, torch.distributed.tensor.DTensor):
            value = value.full_tensor()
        yield saved, (value.to(dtype) if dtype is not None else value).detach()


def dropouts(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The adapters' dropout modules (peft's ``lora_dropout``): train mode only in the training forward."""
    return [m for name, m in model.named_modules() if name.endswith(f"lora_dropout.{ADAPTER}")]


@contextlib.contextmanager
def training(modules: list[torch.nn.Module]) -> Iterator[None]:
    """``modules`` in train mode for the block (the model itself stays in eval mode)."""
    for m in modules:
        m.train()
    try:
        yield
    finally:
        for m in modules:
            m.eval()
