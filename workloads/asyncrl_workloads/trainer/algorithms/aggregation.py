"""Per-token losses -> one rank's share of the mini-batch loss (verl's agg_loss, its four modes).

Called by trainer/loss.py for the policy, KL and entropy terms of each micro-batch. A mini-batch is
split over data-parallel ranks and micro-batches; every share is divided by the *global* count of the
mini-batch (BatchInfo), so the shares of all ranks and micro-batches sum to the loss verl computes on
the whole mini-batch at once, whatever tokens each rank holds. The backends turn the ranks' averaged
gradients back into that sum (backend.py _backward multiplies by the data-parallel size, as verl's
agg_loss does with dp_size).

    token-mean               sum_{i,t} m L / N_tokens                  every trained token weighs the same
    seq-mean-token-sum       sum_i (sum_t m L) / N_seqs                 long sequences weigh more
    seq-mean-token-mean      sum_i (sum_t m L / sum_t m) / N_seqs       every sequence weighs the same
    seq-mean-token-sum-norm  sum_i (sum_t m L) / N_seqs / scale         Dr.GRPO (scale: a constant length)

N_tokens and N_seqs count the mini-batch before the mismatch filter (AReaL keeps its denominator too:
a rejected token is not replaced by inflating the others); N_seqs counts sequences with any trained token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch


@dataclasses.dataclass(frozen=True)
class BatchInfo:
    tokens: float
    """Trained tokens of the mini-batch over all ranks."""
    sequences: float
    """Sequences of the mini-batch with at least one trained token, over all ranks."""
    scale: float = 1.0
    """seq-mean-token-sum-norm's divisor (spec lossScaleFactor, default rollout.sampling.maxTokens)."""


def token_mean(loss: torch.Tensor, mask: torch.Tensor, info: BatchInfo) -> torch.Tensor:
    return (loss * mask).sum() / max(info.tokens, 1.0)


def _seq_sums(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask > 0, loss, 0.0).mul(mask).sum(-1)  # (B,), NaN outside the mask kept out


def seq_mean_token_sum(loss: torch.Tensor, mask: torch.Tensor, info: BatchInfo) -> torch.Tensor:
    return _seq_sums(loss, mask).sum() / max(info.sequences, 1.0)


def seq_mean_token_mean(loss: torch.Tensor, mask: torch.Tensor, info: BatchInfo) -> torch.Tensor:
    per_seq = _seq_sums(loss, mask) / (mask.sum(-1) + 1e-8)  # (B,)
    return per_seq.sum() / max(info.sequences, 1.0)


def seq_mean_token_sum_norm(loss: torch.Tensor, mask: torch.Tensor, info: BatchInfo) -> torch.Tensor:
    return seq_mean_token_sum(loss, mask, info) / info.scale


AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, BatchInfo], torch.Tensor]] = {
    "token-mean": token_mean,
    "seq-mean-token-sum": seq_mean_token_sum,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}
"""spec.trainer.algorithm.lossAggregation -> (per-token loss (B, T), mask (B, T), info) -> scalar share."""
