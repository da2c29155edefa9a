"""Token log-probabilities and entropy from final hidden states, the vocabulary projection chunk by chunk.

Called by trainer/fsdp.py (the root unit's ``token_logprobs`` method, FSDP2Backend's forward). The
plain path, ``log_softmax(lm_head(h) / T)`` over a whole micro-batch, holds [tokens x vocabulary]
float32 logits, their log-softmax and, for backward, both again: for a 152k vocabulary and 16k tokens
that is 10 GB per copy. Here the head, log-softmax and the pick of each target token run over
``chunk_tokens`` tokens at a time, each chunk under torch.utils.checkpoint, so forward keeps only the
chunk's hidden states and its (chunk,) results, and backward recomputes one chunk's logits at a time:
peak logits memory is one chunk's, whatever the micro-batch. The values and gradients are those of
the plain path (tests/dataplane/test_memory.py); the cost is one more head matmul per token in
backward. Liger's fused linear cross-entropy and verl's ``FusedLinearForPPO`` do the same.

``map_chunks`` is the loop alone, for any per-chunk head: the megatron backend passes its
vocabulary-parallel one (trainer/megatron/model.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint

from asyncrl_workloads.trainer.algorithms import regularizers


class _TargetLogprob(torch.autograd.Function):
    """log_softmax(x)[n, target[n]] per row, its backward in one (N, V) buffer.

    log_softmax + gather keep the (N, V) log-softmax for backward and make two more (N, V) tensors
    there (the gather's dense gradient, then the log-softmax's): with the recomputed logits, three
    chunk-sized copies at once, the step's peak on a large vocabulary (bench_memory.py). Here forward
    keeps x and the (N,) log-sum-exp, and backward writes g * (onehot(target) - softmax(x)) into one
    new buffer."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # (N, V), (N,)
        lse = torch.logsumexp(x, dim=-1)  # (N,)
        ctx.save_for_backward(x, targets, lse)
        return x.gather(-1, targets[:, None]).squeeze(-1) - lse  # (N,)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # (N,)
        x, targets, lse = ctx.saved_tensors
        out = x.sub(lse[:, None]).exp_()  # (N, V): softmax(x)
        out.mul_(-grad[:, None]).scatter_add_(-1, targets[:, None], grad[:, None])
        return out, None


AUTO_CHUNK_BYTES = 512 * 2**20
"""spec.trainer.memory.logprobChunkTokens unset: one chunk's float32 logits stay within this."""


def chunk_tokens(configured: int | None, vocabulary: int) -> int:
    """spec.trainer.memory.logprobChunkTokens as set, or unset: as many tokens as keep one chunk's
    float32 logits over ``vocabulary`` (the logits a rank holds) within AUTO_CHUNK_BYTES, at least 64.
    A fixed token count would hold 2.3 GiB per chunk copy at Qwen's 152k vocabulary and 4096 tokens,
    more than a decoder layer's activations (bench_memory.py), and backward holds two copies."""
    if configured is not None:
        return configured
    return max(64, AUTO_CHUNK_BYTES // (4 * max(vocabulary, 1)))


def _head_logprobs(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,  # (N, H)
    targets: torch.Tensor,  # (N,)
    temperature: float,
    entropy: bool,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) logprob of each target and (N,) entropy (empty without ``entropy``) for one chunk."""
    logits = head(hidden).float()  # (N, V)
    if softcap:  # gemma's final_logit_softcapping, as transformers applies it after the head
        logits = torch.tanh(logits / softcap) * softcap
    # In place: the head's output is a fresh tensor nothing saved for backward, and a second (N, V)
    # copy alive beside it and the log-softmax would be the chunk's peak (bench_memory.py).
    scaled = logits.div_(temperature) if temperature != 1.0 else logits  # (N, V)
    picked: torch.Tensor = _TargetLogprob.apply(scaled, targets)  # type: ignore[no-untyped-call]  # (N,)
    ent = regularizers.entropy_from_logits(scaled) if entropy else picked.new_zeros(0)  # (N,)
    return picked, ent


ChunkHead = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""(N, H) hidden states, (N,) targets -> (N,) logprob of each target, (N,) entropy or an empty tensor."""


def token_logprobs(
    hidden: torch.Tensor,  # (B, T, H)
    head: Callable[[torch.Tensor], torch.Tensor],
    targets: torch.Tensor,  # (B, T)
    temperature: float,
    chunk_tokens: int,
    entropy: bool = False,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, T) log p(targets[b, t] | hidden[b, t]) under softmax(head(hidden) / temperature), and with
    ``entropy`` the (B, T) entropy of that distribution (else None); ``chunk_tokens`` tokens of the
    flattened B x T at a time (0: all at once, no recompute)."""
    per_chunk = functools.partial(
        _head_logprobs, head, temperature=temperature, entropy=entropy, softcap=softcap
    )
    return map_chunks(per_chunk, hidden, targets, chunk_tokens, entropy)


def map_chunks(
    per_chunk: ChunkHead,
    hidden: torch.Tensor,  # (B, T, H)
    targets: torch.Tensor,  # (B, T)
    chunk_tokens: int,
    entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``per_chunk`` over ``chunk_tokens`` tokens of the flattened B x T at a time, each chunk under
    torch.utils.checkpoint while autograd records (0: all at once, no recompute): the (B, T) logprobs
    and, with ``entropy``, the (B, T) entropy (else None)."""
    b, t, h = hidden.shape
    flat = hidden.reshape(b * t, h)  # (B*T, H)
    flat_targets = targets.reshape(b * t)  # (B*T,)
    if chunk_tokens <= 0 or chunk_tokens >= b * t:
        picked, ent = per_chunk(flat, flat_targets)
    else:
        parts: list[tuple[torch.Tensor, torch.Tensor]] = []
        for start in range(0, b * t, chunk_tokens):
            h_chunk = flat[start : start + chunk_tokens]  # (N, H)
            t_chunk = flat_targets[start : start + chunk_tokens]  # (N,)
            if torch.is_grad_enabled():
                out = torch.utils.checkpoint.checkpoint(per_chunk, h_chunk, t_chunk, use_reentrant=False)
            else:
                out = per_chunk(h_chunk, t_chunk)
            parts.append(out)
        picked = torch.cat([p for p, _ in parts])  # (B*T,)
        ent = torch.cat([e for _, e in parts])  # (B*T,) or (0,)
    return picked.reshape(b, t), (ent.reshape(b, t) if entropy else None)
