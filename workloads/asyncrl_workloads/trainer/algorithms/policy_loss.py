"""Per-token policy losses, one function per variant, registered in POLICY_LOSSES by
spec.trainer.algorithm.policyLoss.

Called by trainer/loss.py for each micro-batch. Every loss takes

    logprobs      (B, T)  log pi_theta (requires grad)
    old_logprobs  (B, T)  the policy the trust region is centred on: pi_prox with a correction (the
                          trainer's policy before the step), pi_behav (the engine's) without
    advantages    (B, T)  per-token advantages
    mask          (B, T)  trained tokens after the mismatch filter

and returns the per-token loss (B, T) before the correction weight and the aggregation (trainer/loss.py
multiplies by the weight and aggregates, as verl's losses do with rollout_is_weights and agg_loss),
plus detached metrics (masked means over the micro-batch). Log-ratios are clamped to [-20, 20] before
exp, as verl does (AReaL does not clamp; the two differ only beyond a ratio of e^20).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

Metrics = dict[str, float]


@dataclasses.dataclass(frozen=True)
class LossSettings:
    clip_low: float = 0.2
    """The ratio is clipped below at 1 - clip_low."""
    clip_high: float = 0.28
    """... and above at 1 + clip_high (DAPO's clip-higher)."""
    clip_ratio_c: float | None = None
    """Dual-clip bound for A < 0 (None: off)."""
    tau_pos: float = 1.0
    """SAPO's gate temperature for A > 0."""
    tau_neg: float = 1.05
    """SAPO's gate temperature for A <= 0."""


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / (mask.sum() + 1e-8))


def _ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)  # (B, T)
    return torch.exp(log_ratio), log_ratio


def ppo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
) -> tuple[torch.Tensor, Metrics]:
    """PPO-clip (Schulman et al. 2017, arXiv 1707.06347) with DAPO's asymmetric clip and optional dual-clip
    (Ye et al. 2020, arXiv 1912.09729); verl compute_policy_loss_vanilla, AReaL ppo_actor_loss_fn:

        L_t = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
        L_t = min(L_t, -A c)  where A < 0                (dual-clip, c = clip_ratio_c)
    """
    ratio, log_ratio = _ratio(logprobs, old_logprobs)
    loss1 = -advantages * ratio  # (B, T)
    loss2 = -advantages * ratio.clamp(1.0 - settings.clip_low, 1.0 + settings.clip_high)  # (B, T)
    clipped = torch.maximum(loss1, loss2)  # (B, T)
    metrics = {
        "clip_fraction": _masked_mean((loss2 > loss1).float(), mask),
        "ppo_kl": _masked_mean(-log_ratio.detach(), mask),
    }
    if settings.clip_ratio_c is None:
        return clipped, metrics
    loss3 = -advantages * settings.clip_ratio_c  # (B, T)
    negative = advantages < 0
    metrics["dual_clip_fraction"] = _masked_mean(((clipped > loss3) & negative).float(), mask)
    return torch.where(negative, torch.minimum(loss3, clipped), clipped), metrics


def gspo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
) -> tuple[torch.Tensor, Metrics]:
    """GSPO (Zheng et al. 2025, arXiv 2507.18071; verl compute_policy_loss_gspo; AReaL
    importance_sampling_level sequence): the ratio is the sequence's geometric mean, with each token's
    gradient (GSPO-token):

        s_i = exp(mean_t (log pi_theta - log pi_old)),  s_it = sg(s_i) pi_theta(t) / sg(pi_theta(t))
        L_t = max(-A s_it, -A clip(s_it, 1 - eps_low, 1 + eps_high))

    log s_it is clamped at 10. With outcome advantages (one per sequence) this is AReaL's sequence-level
    loss in value and gradient; AReaL also averages token advantages per sequence first.
    """
    log_ratio = logprobs - old_logprobs  # (B, T)
    lengths = mask.sum(-1).clamp(min=1.0)  # (B,)
    seq_log_ratio = (log_ratio * mask).sum(-1) / lengths  # (B,)
    log_s = (logprobs - logprobs.detach() + seq_log_ratio.detach()[:, None]).clamp(max=10.0)  # (B, T)
    ratio = torch.exp(log_s)
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1.0 - settings.clip_low, 1.0 + settings.clip_high)
    return torch.maximum(loss1, loss2), {
        "clip_fraction": _masked_mean((loss2 > loss1).float(), mask),
        "ppo_kl": _masked_mean(-log_ratio.detach(), mask),
    }


def cispo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
) -> tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax-M1, arXiv 2506.13585; verl compute_policy_loss_cispo): the clipped ratio as a
    stop-gradient weight on the REINFORCE term, so clipped tokens still pass gradient:

        L_t = -sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi_theta
    """
    ratio, log_ratio = _ratio(logprobs, old_logprobs)
    clipped = ratio.clamp(1.0 - settings.clip_low, 1.0 + settings.clip_high)
    return -clipped.detach() * advantages * logprobs, {
        "clip_fraction": _masked_mean((ratio != clipped).float(), mask),
        "ppo_kl": _masked_mean(-log_ratio.detach(), mask),
    }


def sapo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
) -> tuple[torch.Tensor, Metrics]:
    """SAPO (Gao et al. 2025, arXiv 2511.20347; verl compute_policy_loss_sapo, AReaL sapo_loss_fn): a soft
    sigmoid gate in place of the hard clip,

        f(r) = sigmoid(tau (r - 1)) 4 / tau,  tau = tau_pos if A > 0 else tau_neg;  L_t = -f(r) A
    """
    ratio, log_ratio = _ratio(logprobs, old_logprobs)
    tau = torch.where(
        advantages > 0,
        torch.as_tensor(settings.tau_pos, dtype=advantages.dtype, device=advantages.device),
        torch.as_tensor(settings.tau_neg, dtype=advantages.dtype, device=advantages.device),
    )  # (B, T)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return -gate * advantages, {"ppo_kl": _masked_mean(-log_ratio.detach(), mask)}


PolicyLoss = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, LossSettings], tuple[torch.Tensor, Metrics]
]
POLICY_LOSSES: dict[str, PolicyLoss] = {"ppo": ppo, "gspo": gspo, "cispo": cispo, "sapo": sapo}
