"""A megatron-core GPTModel for a Llama/Qwen2-style Hugging Face model, on CPU (gloo) or on GPU.

Called by the megatron backend (next) and the data-plane tests, after parallel.initialize. `build` makes
one tensor-parallel rank's GPTModel from an Architecture (architecture.from_hf), `load_hf` puts the HF
weights in it (convert.to_megatron), `hf_state` gathers them back (convert.to_hf), `token_logprobs` is
the per-token log-probability the losses use (vocabulary-parallel).

spec.trainer.memory, where the model is built and called:
  - activation checkpointing (`build`'s `recompute`): on GPU megatron's own full uniform recompute of
    every layer ("megatron": its tensor_parallel.checkpoint saves and restores the CUDA RNG state and
    megatron's RNG tracker); on CPU, where there is no CUDA RNG state to save, each TransformerLayer's
    forward under torch.utils.checkpoint, non-reentrant ("torch": fsdp.checkpoint_forward, the FSDP2
    backend's wrapper, which saves the CPU RNG state). Both keep each layer's input only and recompute
    the layer in backward. megatron-core 0.16.1 has no recompute that runs without CUDA: full
    (tensor_parallel.CheckpointFunction), selective (CheckpointWithoutOutput) and Transformer Engine's
    all save the CUDA RNG state (tensor_parallel/random.py `_get_all_rng_states`).
  - chunked log-probs (`token_logprobs_entropy`'s `chunk_tokens`): GPTModel's forward up to its final
    norm (`hidden_states`: the output layer stood aside for the call), then megatron's output layer,
    the vocabulary-parallel log-softmax and entropy over `chunk_tokens` tokens at a time, each chunk
    recomputed in backward (trainer/chunked.py's map_chunks, the FSDP2 backend's loop): a micro-batch
    never holds [tokens x vocabulary / tp] logits, one chunk does.

On GPU (`torch.cuda.is_available()`) the model is megatron's own: the local layer spec with its
DotProductAttention and RotaryEmbedding. On CPU two of its modules allocate on CUDA, so two narrow
adapters stand in, each a subclass installed on this model only (no megatron module is patched):
  - SdpaAttention (through the layer spec's core_attention): DotProductAttention.forward takes its score
    buffer from the global memory buffer, allocated on `torch.cuda.current_device()`
    (transformer/dot_product_attention.py:189 -> utils.py:631), and a causal mask with no mask given
    comes from get_default_causal_mask, `device="cuda"` (fusions/fused_softmax.py:327 ->
    transformer/utils.py:35).
  - CpuRotaryEmbedding (replaces GPTModel.rotary_pos_emb after construction; GPTModel builds its
    RotaryEmbedding itself, gpt/gpt_model.py:160, not through a spec): RotaryEmbedding.get_emb moves
    inv_freq to `torch.cuda.current_device()` when it is on CPU
    (models/common/embeddings/rotary_pos_embedding.py:162).
Both paths: weights initialised on CPU when there is no GPU (use_cpu_initialization), every fusion off
(fused kernels are CUDA-only), dropout 0 (HF's configs have none, and the CPU RNG tracker cannot fork,
parallel.py), float32 parameters unless `dtype` says otherwise.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import torch
import torch.nn.functional as F

from asyncrl_workloads.trainer import chunked, fsdp
from asyncrl_workloads.trainer.megatron import architecture, convert, parallel

with parallel.quiet_imports():
    from megatron.core import tensor_parallel
    from megatron.core.models.common.embeddings import rotary_pos_embedding
    from megatron.core.models.gpt import gpt_layer_specs, gpt_model
    from megatron.core.transformer import dot_product_attention, spec_utils, transformer_config

Arch = architecture.Architecture
Recompute = Literal["megatron", "torch"]
"""Activation checkpointing's implementation (module doc): megatron's own (GPU) or torch's (CPU)."""


class SdpaAttention(dot_product_attention.DotProductAttention):  # type: ignore[misc]  # untyped base
    """Causal core attention through torch's scaled_dot_product_attention (CPU path; see module doc).

    Inputs are megatron's (s, b, heads, d) tensors with GQA key/value heads; padding is on the right,
    so a causal mask is the whole mask (the attention_mask argument is ignored)."""

    def forward(
        self,
        query: torch.Tensor,  # (sq, b, np, d)
        key: torch.Tensor,  # (sk, b, ng, d)
        value: torch.Tensor,  # (sk, b, ng, d)
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("SdpaAttention: packed sequences and attention bias are not built")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # (b, heads, s, d)
        context = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=q.shape[1] != k.shape[1]
        )  # (b, np, sq, d)
        sq, b = query.shape[0], query.shape[1]
        return context.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)


class CpuRotaryEmbedding(rotary_pos_embedding.RotaryEmbedding):  # type: ignore[misc]  # untyped base
    """megatron's RotaryEmbedding with inv_freq left where it is (CPU path; see module doc)."""

    def get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        if self.rotary_interleaved:
            raise NotImplementedError("CpuRotaryEmbedding: interleaved rotary is not built")
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)  # (s, d/2)
        return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]  # (s, 1, 1, d)


def config_for(
    arch: Arch, tp: int = 1, dtype: torch.dtype = torch.float32, recompute: bool = False
) -> transformer_config.TransformerConfig:
    """``recompute``: spec.trainer.memory.activationCheckpointing - megatron's full recompute, every
    layer its own unit (method uniform, 1 layer): forward keeps each layer's input only."""
    cuda = torch.cuda.is_available()
    return transformer_config.TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_query_groups,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=not cuda,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        attention_softmax_in_fp32=True,
        cuda_graph_scope=[],  # the default, "full", is deprecated and warns (transformer_config.py:1705)
        recompute_granularity="full" if recompute else None,
        recompute_method="uniform" if recompute else None,
        recompute_num_layers=1 if recompute else None,
    )


def layer_spec() -> spec_utils.ModuleSpec:
    """megatron's local layer spec; on CPU its core attention is SdpaAttention."""
    spec = gpt_layer_specs.get_gpt_layer_local_spec(normalization="RMSNorm")
    if not torch.cuda.is_available():
        spec.submodules.self_attention.submodules.core_attention = SdpaAttention
    return spec


def build(
    arch: Arch,
    tp: int = 1,
    dtype: torch.dtype = torch.float32,
    vocab_multiple: int = 128,
    recompute: Recompute | None = None,
) -> Any:
    """This rank's GPTModel (parallel.initialize first). Its logits are this rank's slice of the
    vocabulary padded to arch.padded_vocab_size; token_logprobs reduces over TP and masks the padding.
    ``recompute``: activation checkpointing, megatron's (config_for) or torch's around each layer
    (module doc); None: none."""
    arch.check_tp(tp)
    config = config_for(arch, tp, dtype, recompute == "megatron")
    model = gpt_model.GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(),
        vocab_size=arch.padded_vocab_size(tp, vocab_multiple),
        max_sequence_length=arch.max_position_embeddings,
        parallel_output=True,
        share_embeddings_and_output_weights=arch.tied_embeddings,
        position_embedding_type="rope",
        rotary_base=arch.rope_theta,  # annotated int in megatron; RoPE's theta is a float (1e6, 5e5)
    )
    if not torch.cuda.is_available():
        model.rotary_pos_emb = CpuRotaryEmbedding(
            kv_channels=config.kv_channels,
            rotary_percent=1.0,
            rotary_base=arch.rope_theta,
            use_cpu_initialization=True,
            cp_group=model.rotary_pos_emb.cp_group,
        )
    if recompute == "torch":
        for layer in model.decoder.layers:
            fsdp.checkpoint_forward(layer)
    return model


def recompute_for(device: torch.device) -> Recompute:
    """Which activation checkpointing `build` applies on ``device`` (module doc)."""
    return "megatron" if device.type == "cuda" else "torch"


def load_hf(
    model: torch.nn.Module,
    hf: Mapping[str, torch.Tensor],
    arch: Arch,
    tp: int = 1,
    rank: int = 0,
    vocab_multiple: int = 128,
) -> None:
    """Copy a HF state dict into this rank's GPTModel; every parameter is set, none left over."""
    load_local(model, convert.to_megatron(hf, arch, tp, rank, vocab_multiple))


def load_local(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy this rank's tensors under GPTModel names (convert.to_megatron's) into it, cast to its dtype;
    every parameter is set, none left over."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("_extra_state")]
    if missing or unexpected:
        raise ValueError(f"megatron load: missing {missing}, unexpected {unexpected}")


def hf_state(model: torch.nn.Module, arch: Arch) -> dict[str, torch.Tensor]:
    """The whole model in HF names and layouts, on every TP rank: each tensor all-gathered over the TP
    group (collective: every TP rank calls it), then convert.to_hf. For weight sync and export."""
    return gather_hf(model.state_dict(), arch)


def hf_parts(model: torch.nn.Module, arch: Arch, gather: bool = True) -> Iterator[dict[str, torch.Tensor]]:
    """hf_state a part at a time, for weight sync: the embedding, final norm and head
    (convert.head_to_hf), then each decoder layer (convert.layer_to_hf), each part's tensors all-gathered
    over the TP group when it is reached (collective: every TP rank iterates to the end), so a rank
    holds one part in HF layout, not the model. ``gather=False``: the same parts, in the same order, on
    the meta device and without a collective: the names, dtypes and shapes alone (the sync's plan)."""
    groups: dict[int | None, dict[str, torch.Tensor]] = {}
    for name, t in model.state_dict().items():
        if not name.endswith("_extra_state"):
            groups.setdefault(convert.layer_index(name), {})[name] = t
    yield convert.head_to_hf(_tp_shards(groups.get(None, {}), gather), arch)
    for i in range(arch.num_layers):
        yield convert.layer_to_hf(_tp_shards(groups[i], gather), arch, i)


def _tp_shards(local: Mapping[str, torch.Tensor], gather: bool) -> list[dict[str, torch.Tensor]]:
    """Every TP rank's tensors of ``local``'s names (all-gathered), or meta tensors shaped like them."""
    if not gather:
        meta = {n: torch.empty(t.shape, dtype=t.dtype, device="meta") for n, t in local.items()}
        return [meta] * parallel.tp_size()
    group = parallel.tp_group()
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(parallel.tp_size())]
    for name, t in local.items():
        copies = [torch.empty_like(t) for _ in shards]
        torch.distributed.all_gather(copies, t.contiguous(), group=group)
        for shard, copy in zip(shards, copies, strict=True):
            shard[name] = copy
    return shards


def gather_hf(local: Mapping[str, torch.Tensor], arch: Arch) -> dict[str, torch.Tensor]:
    """This TP rank's tensors under GPTModel state-dict names (the weights, or anything shaped like them:
    AdamW's moments) -> the whole set in HF names and layouts, on every TP rank (collective)."""
    kept = {n: t for n, t in local.items() if not n.endswith("_extra_state")}
    return convert.to_hf(_tp_shards(kept, gather=True), arch)


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    vocab_size: int,
    temperature: float = 1.0,
    chunk_tokens: int = 0,
) -> torch.Tensor:
    """token_logprobs_entropy's logprobs alone."""
    logp, _ = token_logprobs_entropy(model, input_ids, vocab_size, temperature, chunk_tokens=chunk_tokens)
    return logp


def token_logprobs_entropy(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    vocab_size: int,
    temperature: float = 1.0,
    entropy: bool = False,
    chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, T) right-padded ids -> (B, T-1): log p(input_ids[:, t+1] | input_ids[:, :t+1]) under
    log_softmax(logits / temperature) in float32, as the FSDP2 backend computes it, with autograd; with
    `entropy` also the (B, T-1) entropy of that distribution (else None). ``model``: the GPTModel or a
    wrapper of it (megatron's DistributedDataParallel, Float16Module). ``chunk_tokens``:
    spec.trainer.memory.logprobChunkTokens, the output layer and what follows it over that many tokens
    at a time (trainer/chunked.py map_chunks; 0: the whole batch at once); the same values either way.

    The logits stay split over the vocabulary (parallel_output): gathering them would allocate on CUDA
    (tensor_parallel/mappings.py:91) and cost V/tp times the memory; megatron's
    vocab_parallel_cross_entropy reduces the softmax over TP instead, and the entropy
    H = log Z - sum_v p_v s_v is reduced the same way (max, sum of exp and sum of exp * s over TP, the
    sums through reduce_from_tensor_model_parallel_region so gradients flow). Padded vocabulary columns
    (convert._pad_vocab) are masked to -inf first, so they take no probability."""
    gpt = _gpt(model)
    states = hidden_states(model, input_ids)[:, :-1]  # (B, T-1, H)
    per_chunk = functools.partial(
        _chunk_logprobs, gpt, vocab_size=vocab_size, temperature=temperature, entropy=entropy
    )
    return chunked.map_chunks(per_chunk, states, input_ids[:, 1:], chunk_tokens, entropy)


def hidden_states(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) ids -> (B, T, H): GPTModel's final hidden states (after its final norm), through
    ``model``'s own forward (wrappers included) with the output layer returning its input for the call.
    Under Float16Module they come back in float32 (its output cast); _chunk_logprobs casts them back."""
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    with _output_layer_passes_through(_gpt(model)):
        out: torch.Tensor = model(input_ids=input_ids, position_ids=positions, attention_mask=None)
    return out  # GPTModel transposes its "logits" (s, b, h) to (b, s, h)


@contextlib.contextmanager
def _output_layer_passes_through(gpt: Any) -> Iterator[None]:
    """GPTModel._postprocess calls ``output_layer(hidden, weight=..., runtime_gather_output=...)`` and
    returns ``logits.transpose(0, 1)``: with the layer's forward set on the instance to return
    ``(hidden, None)``, the model returns its hidden states. The class's forward is back on exit."""
    gpt.output_layer.forward = lambda hidden, *_, **__: (hidden, None)
    try:
        yield
    finally:
        del gpt.output_layer.forward


def _gpt(model: torch.nn.Module) -> Any:
    """The GPTModel inside megatron's wrappers (DistributedDataParallel, Float16Module: `.module`)."""
    inner: Any = model
    while not isinstance(inner, gpt_model.GPTModel):
        inner = inner.module
    return inner


def _chunk_logprobs(
    gpt: Any,
    hidden: torch.Tensor,  # (N, H)
    targets: torch.Tensor,  # (N,)
    vocab_size: int,
    temperature: float,
    entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk (chunked.ChunkHead): (N,) logprob of each target, (N,) entropy (empty without
    ``entropy``), through megatron's output layer (the shared embedding when tied, as _postprocess)."""
    weight = gpt.shared_embedding_or_output_weight() if gpt.share_embeddings_and_output_weights else None
    dtype = (gpt.output_layer.weight if weight is None else weight).dtype
    local, _ = gpt.output_layer(hidden.to(dtype)[:, None], weight=weight)  # (N, 1, V'/tp): megatron's (s, b)
    scores = local[:, 0].float() / temperature  # (N, V'/tp)
    width = scores.shape[-1]
    first = parallel.tp_rank() * width  # global id of this rank's first vocabulary column
    padding = torch.arange(first, first + width, device=scores.device) >= vocab_size  # (V'/tp,)
    scores = scores.masked_fill(padding, float("-inf"))
    token_entropy = _vocab_parallel_entropy(scores, padding) if entropy else scores.new_zeros(0)
    # vocab_parallel_cross_entropy subtracts the max from its input in place: give it its own copy when
    # the entropy's graph holds on to scores
    nll: torch.Tensor = tensor_parallel.vocab_parallel_cross_entropy(
        scores.clone() if entropy else scores, targets
    )  # (N,)
    return -nll, token_entropy


def _vocab_parallel_entropy(scores: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """(N, V'/tp) this rank's scores (padding columns -inf) -> (N,) entropy over the whole vocabulary."""
    peak = scores.detach().max(-1, keepdim=True).values  # (N, 1): a constant shift, no gradient
    if parallel.tp_size() > 1:
        torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX, group=parallel.tp_group())
    shifted = scores - peak  # (N, V'/tp)
    exp = torch.exp(shifted)  # padding columns: 0
    finite = shifted.masked_fill(padding, 0.0)  # 0 * -inf would be nan
    reduce = tensor_parallel.mappings.reduce_from_tensor_model_parallel_region
    sum_exp = reduce(exp.sum(-1), parallel.tp_group())  # (N,)
    sum_exp_s = reduce((exp * finite).sum(-1), parallel.tp_group())  # (N,)
    out: torch.Tensor = torch.log(sum_exp) - sum_exp_s / sum_exp
    return out
