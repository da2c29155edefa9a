"""Advantage estimators and policy losses, one function per variant, chosen from config by a mapping.

Called by trainer/backend.py once per micro-batch. All tensors are token-aligned with the response:

    logprobs            (B, T)  log pi_theta(a_t | s_t) under the policy being optimised (requires grad)
    proximal_logprobs   (B, T)  log pi_prox: the trainer's policy before this update (no grad)
    behaviour_logprobs  (B, T)  log pi_behav: what the rollout engine sampled with (possibly stale)
    advantages          (B,)    one scalar per sequence, broadcast over its tokens
    mask                (B, T)  1.0 for trained tokens, 0.0 for padding and tool output

Losses are token-level means (DAPO, Yu et al. 2025) over `num_tokens`, the trained-token count of the
*global* batch, so data-parallel ranks holding different token counts still sum to one mean. Each loss
returns `(loss, metrics)` where metrics are detached Python floats.

A job with spec.teacher adds `teacher_kl_loss` (reverse KL to the teacher on generated tokens, on-policy
distillation) to the policy loss; its `teacher_logprobs` (B, T) come from the teacher endpoint
(trainer/teacher.py). No KL-to-reference term: there is no reference model in this trainer
(spec.trainer.algorithm.kl > 0 is refused at admission).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

Metrics = dict[str, float]


@dataclasses.dataclass(frozen=True)
class LossInputs:
    logprobs: torch.Tensor
    proximal_logprobs: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    num_tokens: float


@dataclasses.dataclass(frozen=True)
class ClipSettings:
    clip_low: float = 0.2
    """Lower clip epsilon: the ratio is clipped below at 1 - clip_low."""
    clip_high: float = 0.28
    """Upper clip epsilon (DAPO "clip-higher"): the ratio is clipped above at 1 + clip_high."""
    is_cap: float = 2.0
    """Cap on the behaviour importance weight pi_prox / pi_behav (tis truncates, decoupled masks)."""


# --- advantages -------------------------------------------------------------------------------------


def grpo_advantages(rewards: torch.Tensor, group_ids: Sequence[str], eps: float = 1e-6) -> torch.Tensor:
    """GRPO group-normalised advantage (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300):

        A_i = (r_i - mean_{j in g(i)} r_j) / (std_{j in g(i)} r_j + eps)

    with the unbiased std. A group of one sample, or with equal rewards, carries no signal: A = 0.
    rewards (B,) -> advantages (B,)
    """
    adv = torch.zeros_like(rewards)
    for gid in dict.fromkeys(group_ids):
        idx = torch.tensor([i for i, g in enumerate(group_ids) if g == gid])
        r = rewards[idx]
        if len(idx) < 2:
            continue
        adv[idx] = (r - r.mean()) / (r.std() + eps)
    return adv


def baseline_advantages(rewards: torch.Tensor, group_ids: Sequence[str], eps: float = 1e-6) -> torch.Tensor:
    """Critic-free PPO advantage: the batch mean as baseline, A_i = r_i - mean_j r_j (Williams 1992's
    REINFORCE baseline; PPO here means the PPO-clip objective below without a value model).
    rewards (B,) -> advantages (B,)
    """
    del group_ids, eps
    return rewards - rewards.mean()


ADVANTAGES: dict[str, Callable[[torch.Tensor, Sequence[str]], torch.Tensor]] = {
    "grpo": grpo_advantages,
    "ppo": baseline_advantages,
}


# --- policy losses ----------------------------------------------------------------------------------


def _clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, clip: ClipSettings
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss -min(r A, clip(r, 1-eps_low, 1+eps_high) A) and where clipping was active."""
    clipped = ratio.clamp(1.0 - clip.clip_low, 1.0 + clip.clip_high)
    unclipped_obj = ratio * adv  # (B, T)
    clipped_obj = clipped * adv  # (B, T)
    per_token = -torch.minimum(unclipped_obj, clipped_obj)  # (B, T)
    return per_token, (clipped_obj < unclipped_obj).float()


def _reduce(per_token: torch.Tensor, mask: torch.Tensor, num_tokens: float) -> torch.Tensor:
    return (per_token * mask).sum() / max(num_tokens, 1.0)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1.0))


def ppo_clip_loss(inputs: LossInputs, clip: ClipSettings) -> tuple[torch.Tensor, Metrics]:
    """PPO-clip against the behaviour policy, no off-policy correction (Schulman et al. 2017,
    arXiv 1707.06347; asymmetric clip from DAPO, arXiv 2503.14476):

        r_t = pi_theta / pi_behav,  L = -mean_t min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)

    Right when samples are on-policy (mode sync); with stale samples the trust region is centred on
    whatever policy generated them.
    """
    adv = inputs.advantages[:, None]  # (B, 1)
    ratio = torch.exp(inputs.logprobs - inputs.behaviour_logprobs)  # (B, T)
    per_token, was_clipped = _clipped_surrogate(ratio, adv, clip)
    loss = _reduce(per_token, inputs.mask, inputs.num_tokens)
    return loss, {"clip_fraction": _masked_mean(was_clipped, inputs.mask)}


def decoupled_ppo_loss(inputs: LossInputs, clip: ClipSettings) -> tuple[torch.Tensor, Metrics]:
    """Decoupled PPO (Hilton et al. 2022, arXiv 2110.00641; as used by AReaL, Fu et al. 2025,
    arXiv 2505.24298): the trust region is centred on the proximal policy (the trainer's policy before
    this update) and the behaviour mismatch is corrected by an importance weight:

        w_t = pi_prox / pi_behav,  r_t = pi_theta / pi_prox
        L = -mean_t 1[w_t <= cap] * w_t * min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)

    Tokens whose weight exceeds `is_cap` are masked out (AReaL's behav_imp_weight_cap), not truncated.
    """
    adv = inputs.advantages[:, None]  # (B, 1)
    weight = torch.exp(inputs.proximal_logprobs - inputs.behaviour_logprobs).detach()  # (B, T)
    keep = (weight <= clip.is_cap).float()  # (B, T)
    ratio = torch.exp(inputs.logprobs - inputs.proximal_logprobs)  # (B, T)
    per_token, was_clipped = _clipped_surrogate(ratio, adv, clip)
    loss = _reduce(per_token * weight * keep, inputs.mask, inputs.num_tokens)
    return loss, {
        "clip_fraction": _masked_mean(was_clipped, inputs.mask),
        "is_weight_mean": _masked_mean(weight, inputs.mask),
        "is_masked_fraction": _masked_mean(1.0 - keep, inputs.mask),
    }


def tis_ppo_loss(inputs: LossInputs, clip: ClipSettings) -> tuple[torch.Tensor, Metrics]:
    """PPO-clip around the proximal policy with truncated importance sampling (IMPALA-style truncation,
    Espeholt et al. 2018, arXiv 1802.01561; for LLM RL "Your Efficient RL Framework Secretly Brings You
    Off-Policy RL Training", Yao et al. 2025):

        w_t = min(pi_prox / pi_behav, cap),  r_t = pi_theta / pi_prox
        L = -mean_t w_t * min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)
    """
    adv = inputs.advantages[:, None]  # (B, 1)
    raw = torch.exp(inputs.proximal_logprobs - inputs.behaviour_logprobs).detach()  # (B, T)
    weight = raw.clamp(max=clip.is_cap)  # (B, T)
    ratio = torch.exp(inputs.logprobs - inputs.proximal_logprobs)  # (B, T)
    per_token, was_clipped = _clipped_surrogate(ratio, adv, clip)
    loss = _reduce(per_token * weight, inputs.mask, inputs.num_tokens)
    return loss, {
        "clip_fraction": _masked_mean(was_clipped, inputs.mask),
        "is_weight_mean": _masked_mean(weight, inputs.mask),
        "is_truncated_fraction": _masked_mean((raw > clip.is_cap).float(), inputs.mask),
    }


LOSSES: dict[str, Callable[[LossInputs, ClipSettings], tuple[torch.Tensor, Metrics]]] = {
    "none": ppo_clip_loss,
    "decoupled": decoupled_ppo_loss,
    "tis": tis_ppo_loss,
}


# --- distillation -----------------------------------------------------------------------------------


def teacher_kl_loss(
    inputs: LossInputs, teacher_logprobs: torch.Tensor, kl_coef: float, clip: ClipSettings
) -> tuple[torch.Tensor, Metrics]:
    """Per-token reverse KL to a teacher on the generated tokens (on-policy distillation: Agarwal et al.
    2024, GKD, arXiv 2306.13649; Gu et al. 2024, MiniLLM, arXiv 2306.08543; Thinking Machines' "On-Policy
    Distillation", 2025; prime-rl's teacher via prompt logprobs; slime's teacher advantage shaping):

        delta_t = sg(log pi_theta(a_t) - log pi_T(a_t))            (the k1 estimate of KL(pi_theta || pi_T))
        w_t     = sg(min(pi_theta(a_t) / pi_behav(a_t), cap))      (truncated importance weight, cap: is_cap)
        b       = masked mean of delta_t over the micro-batch                (a baseline)
        L       = klCoef * sum_t mask_t * w_t * ((delta_t - b) * pi_theta(a_t) / sg(pi_theta(a_t)) + b)
                  / num_tokens

    Value: klCoef * mean_t w_t delta_t. Gradient: klCoef * mean_t w_t (delta_t - b) grad log pi_theta(a_t),
    the score-function gradient of the reverse KL with each token's own delta as its (negated) reward, as
    if the advantage were A_t - klCoef * delta_t inside the importance-weighted policy loss (slime,
    prime-rl) with discount 0 (Thinking Machines): the future tokens' deltas, which the exact sequence-level
    gradient would also credit to a_t, are left out, and so is the exact full-vocabulary KL (the teacher
    returns only the sampled token's logprob). Differentiating klCoef * delta_t itself would give klCoef *
    grad log pi_theta, whose expectation is zero on-policy: it would not move the policy toward the teacher.
    The baseline b changes no expectation (E[grad log pi] = 0; up to b's O(1/tokens) dependence on the
    token itself) but the variance a great deal: delta is ~2.4 nats on average for a tiny model far from
    its teacher, and without b every sampled token was pushed down hard, mass flowing to whatever was not
    sampled; on the e2e job the KL hardly fell.

    Off-policy: the tokens were sampled by the behaviour policy (the rollout engine, up to maxStaleness
    versions old). Without w_t the estimate E_behav[delta grad log pi_theta] is not the on-policy gradient:
    E_behav[grad log pi_theta] is not zero off-policy, and the mean of delta times it pushes the policy
    away from the one that sampled (without w_t and b, a tiny model one version stale drifted away from its
    teacher instead of toward it). w_t removes the bias (up to the truncation at cap, IMPALA-style;
    Espeholt et al. 2018, arXiv 1802.01561); for fresh samples w_t = 1. Tool output and padding (mask 0)
    carry no term. log pi_theta is at the sampling temperature (backend.py), the teacher's at temperature 1
    (prompt logprobs).

    teacher_logprobs (B, T), aligned with inputs.logprobs; metrics: teacher_kl, the masked mean delta_t
    (unweighted: over the behaviour policy's tokens), and teacher_is_weight_mean.
    """
    logprobs, mask = inputs.logprobs, inputs.mask  # (B, T)
    delta = (logprobs - teacher_logprobs).detach()  # (B, T)
    weight = torch.exp(logprobs.detach() - inputs.behaviour_logprobs).clamp(max=clip.is_cap)  # (B, T)
    score = torch.exp(logprobs - logprobs.detach())  # (B, T): 1 in value, grad log pi_theta in gradient
    baseline = (delta * mask).sum() / mask.sum().clamp(min=1.0)  # ()
    per_token = weight * ((delta - baseline) * score + baseline)  # (B, T): value w delta
    loss = kl_coef * _reduce(per_token, mask, inputs.num_tokens)
    return loss, {
        "teacher_kl": _masked_mean(delta, mask),
        "teacher_is_weight_mean": _masked_mean(weight, mask),
    }
