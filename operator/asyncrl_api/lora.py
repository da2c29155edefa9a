"""spec.trainer.lora: train low-rank adapters instead of the whole policy.

Imported by ``asyncrl_api.roles`` (TrainerSpec.lora) and read by the trainer (trainer/lora.py applies
peft's LoraConfig to the policy before FSDP2 shards it) and the rollout (vLLM serves the adapter:
``enable_lora``, ``max_lora_rank`` from ``rank``). The weight sync then sends the adapter alone, and the
KL term's reference policy is the base model with the adapter off. verl's ``lora_rank`` /
``lora_alpha`` / ``target_modules`` and peft's ``LoraConfig`` name the same things.
"""

from __future__ import annotations

from typing import Literal

import pydantic

from asyncrl_api import base

TargetModule = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
"""The projections of a Llama/Qwen-style decoder layer that both peft and vLLM's LoRA layers adapt."""
ALL_MODULES: tuple[TargetModule, ...] = (
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
)  # fmt: skip

VLLM_MAX_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""vLLM's allowed ``max_lora_rank`` values (vllm/config/lora.py MaxLoRARanks); the rollout takes the
smallest one that holds ``rank``."""


_LORA_RULES = (
    base.Rule(
        cel="self.targetModules.all(m, self.targetModules.exists_one(x, x == m))",
        message="name each module at most once",
        field_path=".targetModules",
        check=lambda s: len(set(s.target_modules)) == len(s.target_modules),
    ),
)


class LoraSpec(base.APIModel):
    """Low-rank adapters on the policy (peft LoRA): only their weights train, are checkpointed and are
    sent to the rollout engines, which serve them as a vLLM LoRA adapter over the base model."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_LORA_RULES))

    rank: int = pydantic.Field(default=16, ge=1, le=512)
    """The adapters' rank r (peft ``r``, verl ``lora_rank``); vLLM's ``max_lora_rank`` is the smallest
    of 1, 8, 16, 32, 64, 128, 256, 320, 512 that holds it."""
    alpha: float = pydantic.Field(default=32.0, gt=0.0, le=4096.0)
    """The scale numerator: the adapter adds (alpha / rank) * B A x (peft ``lora_alpha``)."""
    target_modules: list[TargetModule] = pydantic.Field(
        default_factory=lambda: list(ALL_MODULES),
        min_length=1,
        max_length=7,
    )
    """The decoder-layer projections that get adapters (default all seven, verl's ``all-linear``); no
    duplicates. Embeddings and the LM head stay frozen (vLLM serves no adapters there)."""
    dropout: float = pydantic.Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the adapters' input in the training forward (peft ``lora_dropout``). With dropout > 0
    the proximal logprobs come from a separate forward without it (one more forward per step)."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> LoraSpec:
        base.check_rules(self, _LORA_RULES)
        return self

    def max_lora_rank(self) -> int:
        """The vLLM engine argument for this rank."""
        return next(r for r in VLLM_MAX_RANKS if r >= self.rank)
