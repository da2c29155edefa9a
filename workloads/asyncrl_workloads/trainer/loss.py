"""One micro-batch's objective: the policy loss, its correction weight, the KL and entropy terms, each
aggregated over the mini-batch, from the pure functions in trainer/algorithms/.

Called by trainer/backend.py once per micro-batch. All tensors are token-aligned with the response:

    logprobs            (B, T)  log pi_theta(a_t | s_t) under the policy being optimised (requires grad)
    proximal_logprobs   (B, T)  log pi_prox: the trainer's policy before this update (no grad)
    behaviour_logprobs  (B, T)  log pi_behav: what the rollout engine sampled with (possibly stale)
    advantages          (B, T)  per-token advantages (trainer/algorithms/advantages.py)
    mask                (B, T)  1.0 for trained tokens, 0.0 for padding and tool output
    reference_logprobs  (B, T)  log pi_ref of the frozen initial model (KL in the loss only)
    entropy             (B, T)  the policy's entropy at each position (requires grad; entropyCoef only)

    old  = pi_prox with a correction (decoupled, tis), pi_behav without (none)
    w, m = correction_mod.apply(pi_prox, pi_behav, mask)          (weight and filtered mask; none: 1, mask)
    L    = agg(w * policy_loss(pi_theta, old, A), m)
           + kl * agg(KL(pi_theta || pi_ref), mask)            (klPlacement loss)
           - entropyCoef * agg(H(pi_theta), mask)
           + the teacher term (spec.teacher)

as verl's actor composes them (dp_actor.py: pg_loss + kl_loss * kl_coef - entropy * entropy_coeff) and
AReaL's decoupled loss weighs pi_prox / pi_behav. Each share is divided by the mini-batch's global counts
(algorithms/aggregation.py), so ranks holding different token counts still sum to one mean. Returns
`(loss, metrics)` where metrics are detached Python floats.
"""

from __future__ import annotations

import dataclasses

import torch

from asyncrl_workloads.trainer.algorithms import aggregation, regularizers
from asyncrl_workloads.trainer.algorithms import correction as correction_mod
from asyncrl_workloads.trainer.algorithms import policy_loss as policy_loss_mod

Metrics = dict[str, float]


@dataclasses.dataclass(frozen=True)
class LossInputs:
    logprobs: torch.Tensor
    proximal_logprobs: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    batch: aggregation.BatchInfo
    reference_logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class Objective:
    """What spec.trainer.algorithm says about the loss (trainer/main.py builds it)."""

    policy_loss: str = "ppo"
    loss: policy_loss_mod.LossSettings = dataclasses.field(default_factory=policy_loss_mod.LossSettings)
    aggregation: str = "token-mean"
    correction: str = "decoupled"
    """decoupled | tis | none: whether the trust region is centred on pi_prox (and weighted) or pi_behav."""
    rejection: correction_mod.Rejection = dataclasses.field(default_factory=correction_mod.Rejection)
    """The mismatch filter of decoupled/tis (unused with none)."""
    is_cap: float = 2.0
    """Cap of the teacher term's importance weight (spec isCap)."""
    kl_in_loss: float = 0.0
    """KL coefficient of the loss term (0 with the KL in the reward, or none)."""
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1.0))


def policy_objective(inputs: LossInputs, objective: Objective) -> tuple[torch.Tensor, Metrics]:
    """This rank's share of the mini-batch loss for one micro-batch, and its metrics."""
    mask = inputs.mask
    aggregate = aggregation.AGGREGATIONS[objective.aggregation]
    if objective.correction == "none":
        old, weight, trained, metrics = inputs.behaviour_logprobs, None, mask, {}
    else:
        filtered = correction_mod.apply(
            inputs.proximal_logprobs, inputs.behaviour_logprobs, mask, objective.rejection
        )
        old, weight, trained = inputs.proximal_logprobs, filtered.weight, filtered.mask
        metrics = {
            "is_weight_mean": _masked_mean(filtered.weight, trained),
            "is_filtered_fraction": filtered.filtered_fraction,
        }
    per_token, loss_metrics = policy_loss_mod.POLICY_LOSSES[objective.policy_loss](
        inputs.logprobs, old, inputs.advantages, trained, objective.loss
    )
    metrics.update(loss_metrics)
    if weight is not None:
        per_token = per_token * weight
    total = aggregate(per_token, trained, inputs.batch)
    if objective.kl_in_loss > 0.0:
        assert inputs.reference_logprobs is not None, "KL in the loss needs reference logprobs"
        kld = regularizers.KL_ESTIMATORS[objective.kl_estimator](inputs.logprobs, inputs.reference_logprobs)
        total = total + objective.kl_in_loss * aggregate(kld, mask, inputs.batch)
        metrics["kl_loss"] = _masked_mean(kld.detach(), mask)
    if objective.entropy_coef > 0.0:
        assert inputs.entropy is not None, "an entropy bonus needs the policy's entropy"
        total = total - objective.entropy_coef * aggregate(inputs.entropy, mask, inputs.batch)
    if inputs.entropy is not None:
        metrics["entropy"] = _masked_mean(inputs.entropy.detach(), mask)
    return total, metrics


# --- distillation -----------------------------------------------------------------------------------


def teacher_kl_loss(
    inputs: LossInputs, teacher_logprobs: torch.Tensor, kl_coef: float, is_cap: float
) -> tuple[torch.Tensor, Metrics]:
    """Per-token reverse KL to a teacher on the generated tokens (on-policy distillation: Agarwal et al.
    2024, GKD, arXiv 2306.13649; Gu et al. 2024, MiniLLM, arXiv 2306.08543; Thinking Machines' "On-Policy
    Distillation", 2025; prime-rl's teacher via prompt logprobs; slime's teacher advantage shaping):

        delta_t = sg(log pi_theta(a_t) - log pi_T(a_t))            (the k1 estimate of KL(pi_theta || pi_T))
        w_t     = sg(min(pi_theta(a_t) / pi_behav(a_t), cap))      (truncated importance weight, cap: isCap)
        b       = masked mean of delta_t over the micro-batch                (a baseline)
        L       = klCoef * sum_t mask_t * w_t * ((delta_t - b) * pi_theta(a_t) / sg(pi_theta(a_t)) + b)
                  / N_tokens

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
    weight = torch.exp(logprobs.detach() - inputs.behaviour_logprobs).clamp(max=is_cap)  # (B, T)
    score = torch.exp(logprobs - logprobs.detach())  # (B, T): 1 in value, grad log pi_theta in gradient
    baseline = (delta * mask).sum() / mask.sum().clamp(min=1.0)  # ()
    per_token = weight * ((delta - baseline) * score + baseline)  # (B, T): value w delta
    loss = kl_coef * aggregation.token_mean(per_token, mask, inputs.batch)
    return loss, {
        "teacher_kl": _masked_mean(delta, mask),
        "teacher_is_weight_mean": _masked_mean(weight, mask),
    }
