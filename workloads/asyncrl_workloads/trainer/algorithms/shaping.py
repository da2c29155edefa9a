"""What happens to the rewards before the advantage estimator: DAPO's overlong penalty, the placement of
each sample's score on its tokens, the KL penalty in the reward and its adaptive coefficient.

Called by trainer/backend.py once per step, on the whole step's batch, in this order:
overlong_penalty (scores) -> token_rewards (scores + optional -kl * KL per token) -> the estimator.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from asyncrl_workloads.trainer.algorithms import regularizers


@dataclasses.dataclass(frozen=True)
class Overlong:
    buffer_tokens: int
    penalty_factor: float
    max_tokens: int
    """The generation budget (rollout.sampling.maxTokens): the penalty is full there."""


def overlong_penalty(scores: torch.Tensor, lengths: torch.Tensor, overlong: Overlong) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476; verl's DAPO reward manager
    overlong_buffer, AReaL's reward_overlong_penalty):

        expected = max_tokens - buffer;  s' = s + min(-(len - expected) / buffer * factor, 0)

    scores (B,), lengths (B,) generated tokens of each response -> (B,)
    """
    expected = overlong.max_tokens - overlong.buffer_tokens
    exceed = lengths.to(scores.dtype) - expected
    return scores + torch.clamp(-exceed / overlong.buffer_tokens * overlong.penalty_factor, max=0.0)


def token_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each sample's score on its last trained token, zero elsewhere (verl's token_level_scores).
    scores (B,), mask (B, T) -> (B, T)"""
    out = torch.zeros_like(mask, dtype=scores.dtype)
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, -1).max(dim=1).values  # (B,): -1 for a row with no token
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = scores[rows]
    return out


def kl_in_reward(
    rewards: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
    estimator: str,
) -> tuple[torch.Tensor, float]:
    """verl's apply_kl_penalty (and AReaL's kl_ctl reward): r_t <- r_t - coef * KL_t on trained tokens,
    KL_t estimated on the behaviour policy's own tokens. Returns the shaped rewards (B, T) and the
    current KL: the mean over samples of each sample's mean KL per token (what the adaptive controller
    follows, verl's actor/reward_kl_penalty).
    rewards, logprobs, ref_logprobs, mask (B, T)"""
    kld = regularizers.KL_ESTIMATORS[estimator](logprobs, ref_logprobs) * mask  # (B, T)
    per_sample = kld.sum(-1) / (mask.sum(-1) + 1e-8)  # (B,)
    return rewards - coef * kld, float(per_sample.mean())


class AdaptiveKL:
    """The adaptive KL coefficient of Ziegler et al. 2019 (arXiv 1909.08593), as verl's
    AdaptiveKLController: after each step, coef *= 1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon,
    n the step's samples. A fixed coefficient is the same object with target None."""

    def __init__(self, coef: float, target: float | None, horizon: int) -> None:
        self.value = coef
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_samples: int) -> None:
        if self.target is None:
            return
        error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + error * n_samples / self.horizon
