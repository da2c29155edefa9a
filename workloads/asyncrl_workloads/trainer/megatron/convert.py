"""Hugging Face <-> megatron-core weights for a Llama/Qwen2-style model, one tensor-parallel rank at a time.

Called by model.py (loading HF weights into a rank's GPTModel) and, next, by the megatron backend's
weight sync and export (gather every rank's state dict, `to_hf`). Pure tensor functions: no process
group, no megatron import; the layouts below are megatron-core 0.16's GPTModel with the local layer spec
(input_layernorm / pre_mlp_layernorm as their own modules; Transformer Engine's spec fuses them into
linear_qkv / linear_fc1 as `layer_norm_weight` and is not handled here).

Layouts (g query groups = KV heads, h = heads per group, d = head_dim, H = hidden, F = ffn, tp ranks):
  linear_qkv.weight  (g * (h + 2) * d, H): per group, its h query heads then its key then its value;
                     TP splits dim 0 into tp contiguous blocks of g / tp whole groups.
  linear_qkv.bias    (g * (h + 2) * d,): the same order (Qwen2).
  linear_proj.weight (H, g * h * d): o_proj, TP splits dim 1 (row parallel).
  linear_fc1.weight  (2 * F / tp, H) per rank: that rank's slice of gate_proj, then its slice of up_proj
                     (megatron's SwiGLU chunks its local output in two), so the unsharded tensor is
                     not [gate; up] but the ranks' [gate_r; up_r] blocks in rank order.
  linear_fc2.weight  (H, F): down_proj, TP splits dim 1.
  word_embeddings / output_layer (V', H): V padded with zero rows to V' (Architecture.padded_vocab_size),
                     TP splits dim 0. A tied model has no output_layer (and no lm_head in `to_hf`).
  norms: replicated on every rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from asyncrl_workloads.trainer.megatron import architecture

Arch = architecture.Architecture

LAYER_NORMS = {
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
}
"""HF name within a layer -> megatron name within a layer, for the replicated per-layer norms."""


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: Arch) -> torch.Tensor:
    """(g*h*d, ...), (g*d, ...), (g*d, ...) -> (g*(h+2)*d, ...), grouped as megatron's linear_qkv."""
    g, rest = arch.num_query_groups, q.shape[1:]
    q = q.reshape(g, arch.heads_per_group * arch.head_dim, *rest)
    k = k.reshape(g, arch.head_dim, *rest)
    v = v.reshape(g, arch.head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def _split_qkv(fused: torch.Tensor, arch: Arch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of _fuse_qkv (fused over all groups, i.e. the TP shards concatenated on dim 0)."""
    g, d, rest = arch.num_query_groups, arch.head_dim, fused.shape[1:]
    grouped = fused.reshape(g, (arch.heads_per_group + 2) * d, *rest)
    q, k, v = torch.split(grouped, [arch.heads_per_group * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _pad_vocab(weight: torch.Tensor, padded: int) -> torch.Tensor:
    """(V, H) -> (padded, H) with zero rows."""
    return torch.cat([weight, weight.new_zeros(padded - weight.shape[0], *weight.shape[1:])])


def _shard(t: torch.Tensor, dim: int, tp: int, rank: int) -> torch.Tensor:
    return t.chunk(tp, dim=dim)[rank].contiguous()


def to_megatron(
    hf: Mapping[str, torch.Tensor], arch: Arch, tp: int = 1, rank: int = 0, vocab_multiple: int = 128
) -> dict[str, torch.Tensor]:
    """The state dict of TP rank `rank` (of `tp`) of the GPTModel, from a HF LlamaForCausalLM /
    Qwen2ForCausalLM state dict (names as `model.state_dict()` or the safetensors files give them)."""
    arch.check_tp(tp)
    padded = arch.padded_vocab_size(tp, vocab_multiple)
    out = {
        "embedding.word_embeddings.weight": _shard(
            _pad_vocab(hf["model.embed_tokens.weight"], padded), 0, tp, rank
        ),
        "decoder.final_layernorm.weight": hf["model.norm.weight"].contiguous(),
    }
    if not arch.tied_embeddings:
        out["output_layer.weight"] = _shard(_pad_vocab(hf["lm_head.weight"], padded), 0, tp, rank)
    for i in range(arch.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        for hf_name, meg_name in LAYER_NORMS.items():
            out[dst + meg_name] = hf[src + hf_name].contiguous()
        attn = src + "self_attn."
        kinds = ("weight", "bias") if arch.qkv_bias else ("weight",)
        for kind in kinds:
            q, k, v = (hf[f"{attn}{p}_proj.{kind}"] for p in "qkv")
            fused = _fuse_qkv(q, k, v, arch)
            out[f"{dst}self_attention.linear_qkv.{kind}"] = _shard(fused, 0, tp, rank)
        out[dst + "self_attention.linear_proj.weight"] = _shard(hf[attn + "o_proj.weight"], 1, tp, rank)
        gate, up = (hf[f"{src}mlp.{p}_proj.weight"] for p in ("gate", "up"))
        out[dst + "mlp.linear_fc1.weight"] = torch.cat([_shard(gate, 0, tp, rank), _shard(up, 0, tp, rank)])
        out[dst + "mlp.linear_fc2.weight"] = _shard(hf[f"{src}mlp.down_proj.weight"], 1, tp, rank)
    return out


def to_hf(shards: Sequence[Mapping[str, torch.Tensor]], arch: Arch) -> dict[str, torch.Tensor]:
    """The HF state dict from every TP rank's GPTModel state dict, `shards[r]` being rank r's. Extra
    megatron entries (`_extra_state`) are ignored; a tied model yields no lm_head.weight."""
    out = head_to_hf(shards, arch)
    for i in range(arch.num_layers):
        out.update(layer_to_hf(shards, arch, i))
    return out


def head_to_hf(shards: Sequence[Mapping[str, torch.Tensor]], arch: Arch) -> dict[str, torch.Tensor]:
    """to_hf's part outside the decoder layers: the embedding, the final norm, an untied head (names
    ``layer_index`` puts in no layer)."""
    out = {
        "model.embed_tokens.weight": _cat(shards, "embedding.word_embeddings.weight", 0)[: arch.vocab_size],
        "model.norm.weight": shards[0]["decoder.final_layernorm.weight"],
    }
    if not arch.tied_embeddings:
        out["lm_head.weight"] = _cat(shards, "output_layer.weight", 0)[: arch.vocab_size]
    return {name: t.contiguous() for name, t in out.items()}


def layer_to_hf(shards: Sequence[Mapping[str, torch.Tensor]], arch: Arch, i: int) -> dict[str, torch.Tensor]:
    """to_hf's part for decoder layer ``i``; reads only names under ``decoder.layers.<i>.``."""
    src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
    first = shards[0]
    out: dict[str, torch.Tensor] = {}
    for hf_name, meg_name in LAYER_NORMS.items():
        out[dst + hf_name] = first[src + meg_name]
    kinds = ("weight", "bias") if arch.qkv_bias else ("weight",)
    for kind in kinds:
        q, k, v = _split_qkv(_cat(shards, f"{src}self_attention.linear_qkv.{kind}", 0), arch)
        for proj, t in zip("qkv", (q, k, v), strict=True):
            out[f"{dst}self_attn.{proj}_proj.{kind}"] = t
    out[dst + "self_attn.o_proj.weight"] = _cat(shards, src + "self_attention.linear_proj.weight", 1)
    halves = [s[src + "mlp.linear_fc1.weight"].chunk(2, dim=0) for s in shards]
    out[dst + "mlp.gate_proj.weight"] = torch.cat([h[0] for h in halves])
    out[dst + "mlp.up_proj.weight"] = torch.cat([h[1] for h in halves])
    out[dst + "mlp.down_proj.weight"] = _cat(shards, src + "mlp.linear_fc2.weight", 1)
    return {name: t.contiguous() for name, t in out.items()}


def layer_index(name: str) -> int | None:
    """The decoder layer a GPTModel state-dict name belongs to (None: the embedding, final norm, head)."""
    if not name.startswith("decoder.layers."):
        return None
    return int(name.split(".")[2])


def _cat(shards: Sequence[Mapping[str, torch.Tensor]], name: str, dim: int) -> torch.Tensor:
    return torch.cat([s[name] for s in shards], dim=dim)
