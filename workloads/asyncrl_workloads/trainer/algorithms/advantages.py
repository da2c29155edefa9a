"""Advantage estimators, one function per variant, registered in ESTIMATORS by spec.trainer.algorithm.name.

Called by trainer/backend.py once per step, on the whole step's batch (every rank holds all of it, so
"batch" statistics need no collective). Each estimator takes

    token_rewards  (B, T)  the reward of each response token: the sample's score on its last trained
                           token, plus -kl * KL on every token when the KL is in the reward (shaping.py)
    mask           (B, T)  1.0 on trained (generated) tokens, 0.0 on tool output and padding
    groups         B ids   the prompt group of each sample

and returns per-token advantages (B, T), zero where mask is 0. Outcome estimators sum the token rewards
into one score per sample and broadcast their advantage over its tokens, as verl's do.

A group of one sample gets advantage 0 from every group estimator (grpo, rloo, reinforce++-baseline), as
AReaL's group normalisation gives it for grpo; verl uses mean 0 and std 1 there, and AReaL's leave-one-out
mean (its rloo) is 0 for a group of one, so their advantage is the raw score (an unbaselined REINFORCE
term from a prompt that was sampled once). Admission refuses group estimators
with one sample per prompt, so this only meets groups that lost samples (a teacher's failure drop).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch


@dataclasses.dataclass(frozen=True)
class EstimatorSettings:
    group_std: bool = True
    """grpo: divide by the group std (false: Dr.GRPO)."""
    gamma: float = 1.0
    """reinforce++: discount of the per-token returns."""
    eps: float = 1e-6
    """Added to the group std (verl's epsilon)."""


def _group_index(groups: Sequence[str]) -> dict[str, list[int]]:
    index: dict[str, list[int]] = {}
    for i, gid in enumerate(groups):
        index.setdefault(gid, []).append(i)
    return index


def _broadcast(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return scores[:, None] * mask  # (B, T)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl's masked_whiten: (x - mean) / sqrt(var + 1e-8) over the masked elements, unbiased var.
    With fewer than two masked elements (verl raises) the values are only centred."""
    count = mask.sum()
    mean = (values * mask).sum() / (count + 1e-8)
    if count < 2:
        return values - mean
    var = (((values - mean) ** 2) * mask).sum() / (count + 1e-8) * (count / (count - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def grpo(
    token_rewards: torch.Tensor, mask: torch.Tensor, groups: Sequence[str], settings: EstimatorSettings
) -> torch.Tensor:
    """GRPO (Shao et al. 2024, arXiv 2402.03300; verl compute_grpo_outcome_advantage):

    A_i = (s_i - mean_g s) / (std_g s + eps)       (unbiased std; group_std false: Dr.GRPO,
                                                   Liu et al. 2025, arXiv 2503.20783: s_i - mean_g s)
    """
    scores = token_rewards.sum(-1)  # (B,)
    adv = torch.zeros_like(scores)
    for idx in _group_index(groups).values():
        if len(idx) < 2:
            continue
        s = scores[idx]
        centred = s - s.mean()
        adv[idx] = centred / (s.std() + settings.eps) if settings.group_std else centred
    return _broadcast(adv, mask)


def rloo(
    token_rewards: torch.Tensor, mask: torch.Tensor, groups: Sequence[str], settings: EstimatorSettings
) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024, arXiv 2402.14740; verl compute_rloo_outcome_advantage): the baseline
    of each sample is the mean of the others in its group,

        A_i = s_i - (sum_g s - s_i) / (n - 1) = n / (n - 1) (s_i - mean_g s)
    """
    del settings
    scores = token_rewards.sum(-1)  # (B,)
    adv = torch.zeros_like(scores)
    for idx in _group_index(groups).values():
        n = len(idx)
        if n < 2:
            continue
        s = scores[idx]
        adv[idx] = s * n / (n - 1) - s.mean() * n / (n - 1)
    return _broadcast(adv, mask)


def reinforce_plus_plus(
    token_rewards: torch.Tensor, mask: torch.Tensor, groups: Sequence[str], settings: EstimatorSettings
) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262; verl compute_reinforce_plus_plus_outcome_advantage):
    discounted returns G_t = r_t + gamma G_{t+1} over trained tokens (tool output carries the running
    return through unchanged), whitened over every trained token of the batch."""
    del groups
    returns = torch.zeros_like(token_rewards)  # (B, T)
    running = torch.zeros_like(token_rewards[:, 0])  # (B,)
    for t in reversed(range(token_rewards.shape[1])):
        m = mask[:, t]
        new = token_rewards[:, t] + settings.gamma * running
        returns[:, t] = new * m
        running = new * m + running * (1 - m)
    return masked_whiten(returns, mask) * mask


def reinforce_plus_plus_baseline(
    token_rewards: torch.Tensor, mask: torch.Tensor, groups: Sequence[str], settings: EstimatorSettings
) -> torch.Tensor:
    """REINFORCE++-baseline (Hu 2025, arXiv 2501.03262; verl
    compute_reinforce_plus_plus_baseline_outcome_advantage): s_i - mean_g s, broadcast over the tokens
    and whitened over every trained token of the batch."""
    del settings
    scores = token_rewards.sum(-1)  # (B,)
    centred = torch.zeros_like(scores)
    for idx in _group_index(groups).values():
        if len(idx) >= 2:
            centred[idx] = scores[idx] - scores[idx].mean()
    return masked_whiten(_broadcast(centred, mask), mask) * mask


def batch_baseline(
    token_rewards: torch.Tensor, mask: torch.Tensor, groups: Sequence[str], settings: EstimatorSettings
) -> torch.Tensor:
    """Critic-free PPO: the batch mean as baseline, A_i = s_i - mean_j s_j (Williams 1992's REINFORCE
    baseline; asyncrl's `ppo` estimator before verl's names arrived, kept for existing jobs)."""
    del groups, settings
    scores = token_rewards.sum(-1)  # (B,)
    return _broadcast(scores - scores.mean(), mask)


Estimator = Callable[[torch.Tensor, torch.Tensor, Sequence[str], EstimatorSettings], torch.Tensor]
ESTIMATORS: dict[str, Estimator] = {
    "grpo": grpo,
    "rloo": rloo,
    "reinforce++": reinforce_plus_plus,
    "reinforce++-baseline": reinforce_plus_plus_baseline,
    "ppo": batch_baseline,
}


# --- batch-level normalisation ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BatchNorm:
    """AReaL's adv_norm (NormConfig with mean_level and std_level batch)."""

    std: bool = True
    leave_one_out: bool = False
    unbiased: bool = True
    eps: float = 1e-5


def normalize_batch(advantages: torch.Tensor, mask: torch.Tensor, norm: BatchNorm) -> torch.Tensor:
    """AReaL's Normalization over the step's trained tokens (areal/utils/data.py, batch level), in float64:

        mean   = sum(A m) / sum(m)                  or, leave-one-out, (sum(A m) - A_t) / (sum(m) - 1)
        A'     = (A - mean) m / (std + eps)         std = sqrt(sum(((A - mean) m)^2) / (sum(m) - 1))

    (std over sum(m) when not unbiased; without std: A' = (A - mean) m.) Every rank holds the whole
    step, so this is AReaL's all-reduced statistic without the all-reduce.
    advantages (B, T), mask (B, T) -> (B, T) float32
    """
    x = advantages.double()
    m = mask.double()
    count = m.sum()
    if count == 0:
        return advantages.float()
    total = (x * m).sum()
    if norm.leave_one_out:
        if count <= 1:
            mean = torch.zeros_like(x)
        else:
            mean = torch.where(m > 0, (total - x * m) / (count - m).clamp(min=1.0), total / count)
    else:
        mean = (total / count).expand_as(x)
    centred = (x - mean) * m
    if not norm.std:
        return centred.float()
    sum_sq = ((x * m - mean * m) ** 2).sum()
    if norm.unbiased:
        std = (sum_sq / (count - 1)).sqrt() if count > 1 else torch.ones_like(sum_sq)
    else:
        std = (sum_sq / count).sqrt()
    return (centred / (std + norm.eps)).float()
