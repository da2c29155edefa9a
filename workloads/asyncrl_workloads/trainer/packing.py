"""Attention over packed rows without a (tokens x tokens) mask: one causal sdpa call per sequence.

Used by trainer/backend.py when spec.trainer.memory.packing is on. A packed row holds several sequences
back to back, position ids restarting at each. transformers' sdpa and eager paths turn those restarts
into a dense block-diagonal causal mask over the whole row: (packed tokens)^2 float32, 0.79 GiB at 14.6k
tokens, alive through every layer's backward, and the peak of the 16k-token row in bench_memory.py.
flash-attention's varlen kernel takes the sequences' cumulative lengths instead and has no mask; it is
what transformers runs under ``flash_attention_2`` (GPU, the flash-attn package), and ``implementation``
picks it when it is importable. Elsewhere (CPU, or a GPU without flash-attn) this module registers
``asyncrl_packed_sdpa`` with transformers' attention and mask interfaces: the same cumulative lengths
(flash-attention's keyword arguments, ``cu_seq_lens_q`` ...) split the row, and each sequence runs
transformers' own ``sdpa_attention_forward`` causally (torch's kernels: no mask materialised), a
sliding-window layer (gemma3, mistral) with a (sequence x sequence) banded mask where the sequence is
longer than its window. Rows that come with a padding mask (the padded path, the critic) get sdpa's
mask and call unchanged. Values equal the padded path's (tests/dataplane/test_memory.py).
"""

from __future__ import annotations

import importlib.util
import itertools
from typing import Any

import torch

NAME = "asyncrl_packed_sdpa"
"""The attention implementation this module registers with transformers."""


LENGTHS = "asyncrl_packed_lengths"
"""The keyword ``row_kwargs`` adds beside flash-attention's: the lengths as Python ints, read here
without a device-to-host copy per layer (and under FakeTensorMode, where tensors hold no values)."""


def _segments(query: torch.Tensor, kwargs: dict[str, Any]) -> list[tuple[int, int]] | None:
    """[start, end) of each sequence in the packed row, from ``row_kwargs``'s lengths, flash-attention's
    ``cu_seq_lens_q``, or where ``position_ids`` restart; None when none is given (one sequence)."""
    lengths = kwargs.get(LENGTHS)
    cu = kwargs.get("cu_seq_lens_q")
    if lengths is not None:
        bounds = [0, *itertools.accumulate(lengths)]
        return list(zip(bounds[:-1], bounds[1:], strict=False))
    if cu is not None:
        bounds = [int(b) for b in cu.tolist()]
        return list(zip(bounds[:-1], bounds[1:], strict=False))
    positions = kwargs.get("position_ids")
    if positions is None or query.shape[0] != 1:
        return None
    starts = [int(i) for i in torch.nonzero(positions[0] == 0).flatten().tolist()]
    if starts[:1] != [0] or len(starts) == 1:
        return None
    return list(zip(starts, [*starts[1:], query.shape[2]], strict=True))


def attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # (1, heads, T, D)
    key: torch.Tensor,  # (1, kv heads, T, D)
    value: torch.Tensor,  # (1, kv heads, T, D)
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: the (B, T, heads, D) output, no weights."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    segments = _segments(query, kwargs) if attention_mask is None else None
    if segments is None:
        if attention_mask is None and sliding_window and query.shape[2] > sliding_window:
            segments = [(0, query.shape[2])]
        else:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling)
    outputs = []
    for start, end in segments:
        n = end - start
        mask = None
        if sliding_window and n > sliding_window:  # transformers' window: kv > q - window, and causal
            i = torch.arange(n, device=query.device)
            mask = ((i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - sliding_window))[None, None]
        out, _ = sdpa_attention_forward(
            module,
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            mask,  # (1, 1, n, n) bool or None: causal
            dropout,
            scaling,
        )
        outputs.append(out)  # (1, n, heads, D)
    return torch.cat(outputs, dim=1), None


def mask(**kwargs: Any) -> torch.Tensor | None:
    """The mask interface's entry (transformers passes keywords): no mask for an unpadded (packed) row,
    sdpa's for a padded batch."""
    if kwargs.get("attention_mask") is None:
        return None
    from transformers.masking_utils import sdpa_mask

    result: torch.Tensor | None = sdpa_mask(**kwargs)
    return result


def register() -> None:
    """Make NAME an attention implementation transformers knows (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, mask)


def implementation(device: torch.device) -> str:
    """The attention implementation for packed rows on ``device``: flash-attention's varlen kernel
    where it is installed (CUDA), else NAME (registered here)."""
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    register()
    return NAME


def row_kwargs(lengths: list[int], device: torch.device) -> dict[str, Any]:
    """flash-attention's keyword arguments for a row packing sequences of ``lengths`` tokens: what
    transformers' varlen path and ``attention`` above read instead of a mask."""
    cu = torch.tensor([0, *lengths], device=device).cumsum(0, dtype=torch.int32)  # (S+1,)
    longest = max(lengths)
    flash = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}
    return {**flash, LENGTHS: tuple(lengths)}
