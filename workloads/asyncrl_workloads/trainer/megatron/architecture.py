"""The shape of a Llama/Qwen2-style causal LM, read from its Hugging Face config.

Called by model.py (to build the megatron-core GPTModel) and convert.py (to lay the weights out); pure,
no megatron import, so the conversion is testable without it. `from_hf` refuses what the megatron path
does not reproduce yet (other activations, rope scaling, sliding windows, MLP or output-projection
biases) with the config field that is the reason, rather than building a model whose logprobs differ.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

SUPPORTED = ("llama", "qwen2")
"""HF model_type values: pre-norm RMSNorm decoder, SwiGLU MLP, RoPE (rotate-half), GQA; qwen2 adds a
bias to q, k and v."""


class UnsupportedModel(ValueError):
    """The HF config asks for something the megatron path cannot build faithfully."""


@dataclasses.dataclass(frozen=True)
class Architecture:
    vocab_size: int
    hidden_size: int
    ffn_hidden_size: int
    num_layers: int
    num_heads: int
    num_query_groups: int
    """Key/value heads (GQA); == num_heads for plain multi-head attention."""
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tied_embeddings: bool
    qkv_bias: bool

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_query_groups

    def padded_vocab_size(self, tp: int, multiple: int = 128) -> int:
        """Megatron splits the vocabulary evenly over TP ranks; like Megatron-LM's
        --make-vocab-size-divisible-by (128 per rank) the embedding and output layer get zero rows up to
        a multiple of `multiple * tp`. The padded logits are sliced off before any softmax."""
        step = multiple * tp
        return math.ceil(self.vocab_size / step) * step

    def check_tp(self, tp: int) -> None:
        for name, value in (
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_query_groups),
            ("intermediate_size", self.ffn_hidden_size),
        ):
            if value % tp:
                raise UnsupportedModel(f"{name} {value} is not divisible by tensor parallel size {tp}")


def _field(config: Any, name: str, default: Any = None) -> Any:
    value = getattr(config, name, default)
    return default if value is None else value


def from_hf(config: Any) -> Architecture:
    """The architecture of a transformers `PretrainedConfig` (LlamaConfig, Qwen2Config)."""
    kind = _field(config, "model_type", "")
    if kind not in SUPPORTED:
        raise UnsupportedModel(f"model_type {kind!r}: the megatron backend builds {', '.join(SUPPORTED)}")
    if _field(config, "hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"hidden_act {config.hidden_act!r}: only silu (SwiGLU) is built")
    if _field(config, "mlp_bias", False):
        raise UnsupportedModel("mlp_bias true: the MLP is built without biases")
    if kind == "llama" and _field(config, "attention_bias", False):
        raise UnsupportedModel("attention_bias true: llama's o_proj bias is not built")
    if _field(config, "use_sliding_window", False):
        raise UnsupportedModel("use_sliding_window true: attention is full causal")
    rope = dict(_field(config, "rope_parameters", None) or _field(config, "rope_scaling", None) or {})
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise UnsupportedModel(f"rope_parameters {rope}: only the default rope (no scaling) is built")
    theta = rope.get("rope_theta", _field(config, "rope_theta", 10000.0))
    heads = int(config.num_attention_heads)
    groups = int(_field(config, "num_key_value_heads", heads))
    if heads % groups:
        raise UnsupportedModel(
            f"num_attention_heads {heads} is not a multiple of num_key_value_heads {groups}"
        )
    return Architecture(
        vocab_size=int(config.vocab_size),
        hidden_size=int(config.hidden_size),
        ffn_hidden_size=int(config.intermediate_size),
        num_layers=int(config.num_hidden_layers),
        num_heads=heads,
        num_query_groups=groups,
        head_dim=int(_field(config, "head_dim", config.hidden_size // heads)),
        rms_norm_eps=float(_field(config, "rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        max_position_embeddings=int(_field(config, "max_position_embeddings", 4096)),
        tied_embeddings=bool(_field(config, "tie_word_embeddings", False)),
        qkv_bias=kind == "qwen2",
    )
