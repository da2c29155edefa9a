"""KL estimators to a reference policy and the entropy of the policy's distribution.

Called by trainer/loss.py (KL and entropy terms of the objective), algorithms/shaping.py (KL in the
reward) and algorithms/correction.py (KL metrics of the mismatch filter). Estimators follow Schulman's
"Approximating KL divergence" (2020, http://joschu.net/blog/kl-approx.html) with verl's clamps
(verl/trainer/ppo/core_algos.py kl_penalty_forward): for samples from pi, with log r = log pi_ref - log pi,

    k1  = log pi - log pi_ref                      unbiased, high variance, can be negative
    abs = |log pi - log pi_ref|
    k2  = (log pi - log pi_ref)^2 / 2              biased, low variance; its gradient is the KL's
    k3  = exp(log r) - log r - 1                   unbiased, low variance, >= 0 (verl low_var_kl);
                                                   log r clamped to [-20, 20], k3 to [-10, 10]

AReaL's KLEstimator clamps every estimate to [-10, 10] by default; this module clamps only k3, as
verl does (the two agree wherever the estimate is inside [-10, 10]: |log pi - log pi_ref| <= 10 for k1,
<= sqrt(20) for k2, everywhere for k3).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return logprobs - ref_logprobs


def absolute(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return (logprobs - ref_logprobs).abs()


def k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprobs - ref_logprobs).square()


def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    log_r = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return (torch.exp(log_r) - log_r - 1.0).clamp(-10.0, 10.0)


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": k1,
    "abs": absolute,
    "k2": k2,
    "k3": k3,
}
"""spec.trainer.algorithm.klEstimator -> per-token estimate (B, T) from logprobs and reference logprobs."""


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H(p) = logsumexp(l) - sum softmax(l) l over the last dimension (verl entropy_from_logits).
    logits (..., V) -> (...)"""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)
