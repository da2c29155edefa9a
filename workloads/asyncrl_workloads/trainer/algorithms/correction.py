"""The training-inference mismatch filter: how far the behaviour policy (the rollout engine, possibly
stale) is from the proximal one (the trainer's before the step), and what to do about it.

Called by trainer/loss.py for each micro-batch of a job with correction decoupled or tis. It is AReaL's
apply_rejection_sampling (areal/utils/functional/functional.py) on padded (B, T) tensors, which also
expresses verl's rollout_correction (rollout_is: a clamped token or sequence weight; rollout_rs: a
rejection by a token or sequence KL metric). spec.trainer.algorithm maps to it:

    correction decoupled           Rejection(token, mask,  ratio, upper=isCap)   (AReaL behav_imp_weight_cap)
    correction tis                 Rejection(token, clamp, ratio, upper=isCap)   (truncated IS)
    correction decoupled + rejection: the spec's own filter

    w_t    = pi_prox / pi_behav per token; at level sequence with metric ratio, the geometric mean over
             the sequence's trained tokens, the same for all of them
    metric = w (ratio) or a KL estimate of pi_prox against pi_behav (k1, k2, k3, unclamped), aggregated
             per sequence at level sequence (mean, sum or max; a ratio in log space)
    mask:  tokens (sequences) with metric outside [lower, upper] leave the loss (their mask becomes 0)
    clamp: their weight is clamped to [lower or 0, upper]

The weight multiplies every policy loss per token (trainer/loss.py), as both anchors apply it.
"""

from __future__ import annotations

import dataclasses

import torch

from asyncrl_workloads.trainer.algorithms import regularizers


@dataclasses.dataclass(frozen=True)
class Rejection:
    level: str = "token"
    """token | sequence"""
    action: str = "mask"
    """mask | clamp"""
    metric: str = "ratio"
    """ratio | k1 | k2 | k3"""
    agg: str = "mean"
    """mean | sum | max: how level sequence aggregates its tokens' metric"""
    upper: float = 2.0
    lower: float | None = None


@dataclasses.dataclass(frozen=True)
class Filtered:
    weight: torch.Tensor
    """(B, T) detached importance weight pi_prox / pi_behav after clamping, 0 where filtered or untrained."""
    mask: torch.Tensor
    """(B, T) the trained tokens that stay (mask action) or the input mask (clamp action)."""
    filtered_fraction: float
    """Fraction of the trained tokens masked (mask) or whose weight was clamped (clamp)."""


def _in_bounds(metric: torch.Tensor, rejection: Rejection) -> torch.Tensor:
    inside = metric <= rejection.upper
    return inside & (metric >= rejection.lower) if rejection.lower is not None else inside


def _clamp(weight: torch.Tensor, rejection: Rejection) -> torch.Tensor:
    return weight.clamp(min=rejection.lower if rejection.lower is not None else 0.0, max=rejection.upper)


def apply(
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    rejection: Rejection,
) -> Filtered:
    """The filtered weight and mask. proximal_logprobs, behaviour_logprobs, mask (B, T)."""
    log_ratio = proximal_logprobs.detach().float() - behaviour_logprobs.detach().float()  # (B, T)
    log_ratio = torch.where(torch.isfinite(log_ratio), log_ratio, 0.0)
    if rejection.metric == "ratio":
        metric = torch.exp(log_ratio)
    else:
        metric = regularizers.KL_ESTIMATORS[rejection.metric](
            proximal_logprobs.detach(), behaviour_logprobs.detach()
        )
        if rejection.metric == "k3":  # AReaL's unclamped k3: exp(-x) - 1 + x, x = log pi_prox - log pi_behav
            metric = torch.exp(-log_ratio) - 1.0 + log_ratio
    weight = torch.exp(log_ratio)
    original = weight
    trained = mask > 0
    in_bounds: torch.Tensor | None = None
    if rejection.level == "sequence":
        use_log = rejection.metric == "ratio"
        values = log_ratio if use_log else metric
        masked = torch.where(trained, values, 0.0)
        count = mask.sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1)
        if use_log:
            weight = torch.exp(masked.sum(-1, keepdim=True) / count).expand_as(log_ratio)
            original = weight
        if rejection.agg == "sum":
            seq = masked.sum(-1, keepdim=True)
        elif rejection.agg == "mean":
            seq = masked.sum(-1, keepdim=True) / count
        else:  # max; a sequence with no trained token is in bounds
            seq = values.masked_fill(~trained, float("-inf")).max(-1, keepdim=True).values
            seq = torch.where(mask.sum(-1, keepdim=True) == 0, torch.zeros_like(seq), seq)
        seq_metric = torch.exp(seq) if use_log else seq  # (B, 1)
        seq_in = _in_bounds(seq_metric, rejection).expand_as(mask)
        if rejection.action == "mask":
            in_bounds = seq_in
        else:
            weight = torch.where(~seq_in, _clamp(weight, rejection), weight)
    elif rejection.action == "mask":
        in_bounds = _in_bounds(metric, rejection)
    else:
        weight = _clamp(weight, rejection)
    total = max(int(trained.sum()), 1)
    if in_bounds is not None:
        kept = trained & in_bounds
        out_mask = kept.to(mask.dtype)
        fraction = int((trained & ~in_bounds).sum()) / total
    else:
        out_mask = mask
        fraction = int((trained & (original != weight)).sum()) / total
    return Filtered(torch.where(out_mask > 0, weight, 0.0), out_mask, fraction)
