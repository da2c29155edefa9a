"""spec.trainer.algorithm: the advantage estimator, the policy loss, its aggregation, the staleness
correction, KL to a reference policy, the entropy bonus and DAPO's reward shaping and dynamic sampling.

Imported by ``asyncrl_api.roles`` (TrainerSpec.algorithm) and read by the trainer (trainer/main.py turns
it into trainer/algorithms settings). Every field names the verl and AReaL option it corresponds to;
docs/algorithms.md lists them side by side. A field that only means something beside another (the
group std switch with grpo, a SAPO temperature with the sapo loss) is refused elsewhere, so no value is
accepted and then ignored.
"""

from __future__ import annotations

from typing import Literal

import pydantic

from asyncrl_api import base

Estimator = Literal["grpo", "rloo", "reinforce++", "reinforce++-baseline", "ppo", "gae"]
GROUP_ESTIMATORS = ("grpo", "rloo", "reinforce++-baseline")
"""Estimators whose baseline is the prompt's group: with one sample per prompt every advantage is 0."""
PolicyLoss = Literal["ppo", "gspo", "cispo", "sapo"]
Aggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLEstimator = Literal["k1", "k2", "k3", "abs"]


class AdvantageNormSpec(base.APIModel):
    """Batch-level advantage normalisation over the step's trained tokens (AReaL's actor.adv_norm with
    mean_level and std_level batch): A <- (A - mean) / (std + eps)."""

    std: bool = True
    """Divide by the batch std (AReaL std_level batch); false centres only (std_level null)."""
    leave_one_out: bool = False
    """Subtract each token's leave-one-out batch mean instead of the full mean (AReaL mean_leave1out)."""
    unbiased: bool = True
    """Unbiased (Bessel-corrected) std, AReaL's std_unbiased default."""
    eps: float = pydantic.Field(default=1e-5, gt=0.0, le=1.0)
    """Added to the std before dividing (AReaL's eps)."""


_REJECTION_RULES = (
    base.Rule(
        cel="self.level == 'sequence' || self.agg == 'mean'",
        message="rejection.agg aggregates a sequence's tokens: it needs level sequence",
        field_path=".agg",
        check=lambda r: r.level == "sequence" or r.agg == "mean",
    ),
    base.Rule(
        cel="self.action == 'mask' || self.metric == 'ratio'",
        message="rejection.action clamp bounds the importance weight itself: it needs metric ratio (a KL"
        " metric can only mask)",
        field_path=".action",
        check=lambda r: r.action == "mask" or r.metric == "ratio",
    ),
    base.Rule(
        cel="!has(self.lower) || self.lower < self.upper",
        message="rejection.lower must be below rejection.upper",
        field_path=".lower",
        check=lambda r: r.lower is None or r.lower < r.upper,
    ),
)


class RejectionSpec(base.APIModel):
    """Training-inference mismatch filter on the proximal / behaviour policies (AReaL's
    actor.rejection_sampling; verl's algorithm.rollout_correction rollout_is / rollout_rs): tokens or
    whole sequences whose metric leaves [lower, upper] are masked out of the loss, or their importance
    weight pi_prox / pi_behav is clamped to the bounds."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_REJECTION_RULES))

    level: Literal["token", "sequence"] = "token"
    """token: each token judged alone; sequence: the sequence's tokens share one fate, and with metric
    ratio one weight, the geometric mean of its token ratios."""
    action: Literal["mask", "clamp"] = "mask"
    """mask: drop out-of-bounds tokens (sequences) from the loss; clamp: clamp their weight to the bounds."""
    metric: Literal["ratio", "k1", "k2", "k3"] = "ratio"
    """ratio: pi_prox / pi_behav; k1/k2/k3: Schulman's estimators of KL(pi_prox || pi_behav) per token."""
    agg: Literal["mean", "sum", "max"] = "mean"
    """How level sequence aggregates its tokens' metric (a ratio in log space: mean is the geometric mean)."""
    upper: float = pydantic.Field(ge=0.0, le=1e6)
    """Upper bound on the metric (required)."""
    lower: float | None = pydantic.Field(default=None, ge=0.0, le=1e6)
    """Optional lower bound on the metric."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> RejectionSpec:
        base.check_rules(self, _REJECTION_RULES)
        return self


class SapoSpec(base.APIModel):
    """SAPO's soft gates (Gao et al. 2025, arXiv 2511.20347): sigmoid(tau (r - 1)) 4 / tau."""

    tau_pos: float = pydantic.Field(default=1.0, gt=0.0, le=100.0)
    """Gate temperature for tokens with a positive advantage (verl tau_pos)."""
    tau_neg: float = pydantic.Field(default=1.05, gt=0.0, le=100.0)
    """Gate temperature for the others (verl tau_neg)."""


class OverlongSpec(base.APIModel):
    """DAPO's overlong reward shaping (Yu et al. 2025, arXiv 2503.14476; verl's overlong_buffer, AReaL's
    overlong_reward_penalty): a response whose generated tokens exceed maxTokens - bufferTokens loses
    penaltyFactor * excess / bufferTokens of its reward (at most penaltyFactor)."""

    buffer_tokens: int = pydantic.Field(ge=1, le=1_048_576)
    """Length of the soft-penalty zone before rollout.sampling.maxTokens (verl overlong_buffer.len)."""
    penalty_factor: float = pydantic.Field(default=1.0, gt=0.0, le=100.0)
    """Penalty at maxTokens (verl overlong_buffer.penalty_factor)."""


class CriticSpec(base.APIModel):
    """The value model of PPO with GAE (verl critic, AReaL's gsm8k_ppo critic): the policy's architecture
    with a one-output token head (transformers' *ForTokenClassification), initialised from the policy's
    base (or `path`), sharded like the policy on the trainer ranks, trained by its own AdamW on the clipped
    value loss and checkpointed with the policy."""

    path: str | None = pydantic.Field(default=None, min_length=1, max_length=4096)
    """Model directory the critic starts from; unset: spec.model.path (verl critic.model.path defaults to
    the actor's). Its value head is new either way."""
    lr: float = pydantic.Field(default=1e-5, gt=0.0, le=1.0)
    """The critic's learning rate (verl critic.optim.lr)."""
    value_clip: float = pydantic.Field(default=0.5, gt=0.0, le=1e6)
    """Clip range of the value update around the step's old values (verl critic.cliprange_value)."""


class DynamicSamplingSpec(base.APIModel):
    """DAPO's dynamic sampling (verl algorithm.filter_groups, AReaL dynamic_bs): prompt groups whose
    rewards are all equal carry no GRPO signal and are dropped before the step (acked, counted
    dropped{reason="zero_variance"}), the step filled with further groups from the queue."""

    max_drops_per_step: int = pydantic.Field(default=64, ge=1, le=1_000_000)
    """Groups dropped at most per step; once reached, further equal-reward groups train (with zero
    group advantage) so a task the model always solves or always fails cannot stall training."""


_ALGORITHM_RULES = (
    base.Rule(
        cel="self.name == 'grpo' || self.groupStd",
        message="groupStd false (Dr.GRPO) only changes name grpo",
        field_path=".groupStd",
        check=lambda a: a.name == "grpo" or a.group_std,
    ),
    base.Rule(
        cel="self.name in ['reinforce++', 'gae'] || self.gamma == 1.0",
        message="gamma discounts per-token returns, which only names reinforce++ and gae compute",
        field_path=".gamma",
        check=lambda a: a.name in ("reinforce++", "gae") or a.gamma == 1.0,
    ),
    base.Rule(
        cel="self.name == 'gae' || self.lam == 1.0",
        message="lam is GAE's lambda: it needs name gae",
        field_path=".lam",
        check=lambda a: a.name == "gae" or a.lam == 1.0,
    ),
    base.Rule(
        cel="self.name == 'gae' || !has(self.critic)",
        message="critic is the value model of name gae (PPO with a critic): set name gae or leave it unset",
        field_path=".critic",
        check=lambda a: a.name == "gae" or a.critic is None,
    ),
    base.Rule(
        cel="!has(self.clipRatioC) || self.policyLoss == 'ppo'",
        message="clipRatioC (dual-clip) applies to policyLoss ppo only",
        field_path=".clipRatioC",
        check=lambda a: a.clip_ratio_c is None or a.policy_loss == "ppo",
    ),
    base.Rule(
        cel="!has(self.sapo) || self.policyLoss == 'sapo'",
        message="sapo sets the gates of policyLoss sapo: set policyLoss sapo or leave it unset",
        field_path=".sapo",
        check=lambda a: a.sapo is None or a.policy_loss == "sapo",
    ),
    base.Rule(
        cel="!has(self.lossScaleFactor) || self.lossAggregation == 'seq-mean-token-sum-norm'",
        message="lossScaleFactor divides seq-mean-token-sum-norm only",
        field_path=".lossScaleFactor",
        check=lambda a: a.loss_scale_factor is None or a.loss_aggregation == "seq-mean-token-sum-norm",
    ),
    base.Rule(
        cel="self.kl > 0.0 || (!has(self.klEstimator) && self.klPlacement == 'loss' && !has(self.klTarget))",
        message="klEstimator, klPlacement and klTarget shape a KL term: set kl above 0 or leave them unset",
        field_path=".kl",
        check=lambda a: (
            a.kl > 0.0 or (a.kl_estimator is None and a.kl_placement == "loss" and a.kl_target is None)
        ),
    ),
    base.Rule(
        cel="!has(self.klTarget) || self.klPlacement == 'reward'",
        message="klTarget (the adaptive controller) moves a KL penalty in the reward: set klPlacement reward",
        field_path=".klTarget",
        check=lambda a: a.kl_target is None or a.kl_placement == "reward",
    ),
    base.Rule(
        cel="!has(self.rejection) || self.correction == 'decoupled'",
        message="rejection filters on pi_prox / pi_behav, which correction decoupled computes (tis is"
        " rejection {action: clamp}); set correction decoupled",
        field_path=".rejection",
        check=lambda a: a.rejection is None or a.correction == "decoupled",
    ),
    base.Rule(
        cel="!has(self.rejection) || self.isCap == 2.0",
        message="isCap is the default filter's bound; with rejection set its upper bound replaces it",
        field_path=".isCap",
        check=lambda a: a.rejection is None or a.is_cap == 2.0,
    ),
)


class AlgorithmSpec(base.APIModel):
    """The policy-gradient objective and its off-policy correction (docs/algorithms.md)."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_ALGORITHM_RULES))

    name: Estimator = "grpo"
    """Advantage estimator. grpo: (r - group mean) / group std (verl grpo; AReaL reward_norm group);
    rloo: leave-one-out group baseline (verl rloo; AReaL mean_leave1out); reinforce++: discounted
    per-token returns whitened over the batch (verl reinforce_plus_plus); reinforce++-baseline: r - group
    mean, whitened over the batch (verl reinforce_plus_plus_baseline); ppo: r - batch mean (no critic);
    gae: PPO with a critic, GAE over token rewards and the critic's values, whitened over the batch
    (verl gae; AReaL gsm8k_ppo; fsdp2 only)."""
    group_std: bool = True
    """grpo only: divide by the group std; false is Dr.GRPO (verl norm_adv_by_std_in_grpo false; AReaL
    reward_norm.std_level null)."""
    gamma: float = pydantic.Field(default=1.0, ge=0.0, le=1.0)
    """reinforce++ and gae: discount of the per-token returns (verl algorithm.gamma; AReaL discount)."""
    lam: float = pydantic.Field(default=1.0, ge=0.0, le=1.0)
    """gae only: GAE's lambda (verl algorithm.lam; AReaL gae_lambda)."""
    critic: CriticSpec | None = None
    """gae only: the value model (defaults when unset)."""
    advantage_norm: AdvantageNormSpec | None = None
    """Batch-level normalisation of the advantages after the estimator (AReaL adv_norm); unset: none."""
    policy_loss: PolicyLoss = "ppo"
    """ppo: PPO-clip (verl vanilla; AReaL ppo_actor_loss_fn); gspo: sequence-level geometric-mean ratio
    (verl gspo; AReaL importance_sampling_level sequence); cispo: clipped, stop-gradient IS weight times
    log-prob (verl cispo); sapo: soft sigmoid gates (verl sapo; AReaL sapo)."""
    clip_low: float = pydantic.Field(default=0.2, ge=0.0, le=1.0)
    """Lower clip range: the ratio is clipped at 1 - clipLow (verl clip_ratio_low; AReaL eps_clip)."""
    clip_high: float = pydantic.Field(default=0.28, ge=0.0, le=10.0)
    """Upper clip range: the ratio is clipped at 1 + clipHigh (DAPO's clip-higher when > clipLow; verl
    clip_ratio_high; AReaL eps_clip_higher)."""
    clip_ratio_c: float | None = pydantic.Field(default=None, gt=1.0, le=100.0)
    """Dual-clip bound for negative advantages (Ye et al. 2020, arXiv 1912.09729): the loss of a token
    with A < 0 is at most clipRatioC * |A|. verl's clip_ratio_c (always on there, 3.0), AReaL's c_clip.
    Unset: off."""
    sapo: SapoSpec | None = None
    """policyLoss sapo's gate temperatures (defaults tauPos 1.0, tauNeg 1.05 when unset)."""
    loss_aggregation: Aggregation = "token-mean"
    """How per-token losses become the mini-batch loss (verl loss_agg_mode), over all data-parallel
    ranks: token-mean (every trained token weighs the same; AReaL), seq-mean-token-sum, seq-mean-token-mean
    (each sequence weighs the same), seq-mean-token-sum-norm (Dr.GRPO: token sums / lossScaleFactor)."""
    loss_scale_factor: int | None = pydantic.Field(default=None, ge=1, le=16_777_216)
    """seq-mean-token-sum-norm's constant divisor; unset: rollout.sampling.maxTokens (verl's default, the
    padded response length)."""
    kl: float = pydantic.Field(default=0.0, ge=0.0, le=10.0)
    """Coefficient of a KL penalty to the reference policy, a frozen copy of the initial model held on
    the trainer ranks (verl kl_loss_coef or kl_ctrl.kl_coef; AReaL kl_ctl). 0: no reference model."""
    kl_estimator: KLEstimator | None = None
    """k1 (log pi - log pi_ref), k2 (half its square), k3 (verl low_var_kl, clamped to [-10, 10]) or abs.
    Unset: k3 in the loss (verl's low_var_kl), k1 in the reward (verl's and AReaL's default)."""
    kl_placement: Literal["loss", "reward"] = "loss"
    """loss: kl * the aggregated estimate joins the policy loss (verl use_kl_loss); reward: each token's
    reward gets -kl * the estimate on the behaviour policy's tokens before the advantages (verl
    use_kl_in_reward, AReaL's kl_ctl)."""
    kl_target: float | None = pydantic.Field(default=None, gt=0.0, le=100.0)
    """klPlacement reward: adapt the coefficient toward this KL per sequence (Ziegler et al. 2019; verl
    kl_ctrl.type adaptive, target_kl). Unset: a fixed coefficient."""
    kl_horizon: int = pydantic.Field(default=10000, ge=1, le=100_000_000)
    """The adaptive controller's horizon in samples (verl kl_ctrl.horizon)."""
    entropy_coef: float = pydantic.Field(default=0.0, ge=0.0, le=10.0)
    """Entropy bonus: the loss subtracts entropyCoef * the aggregated per-token entropy of the policy
    (verl entropy_coeff)."""
    correction: Literal["decoupled", "tis", "none"] = "decoupled"
    """Off-policy correction for stale samples: decoupled PPO (the trust region around the proximal
    policy, the trainer's before the update; weight pi_prox / pi_behav, tokens above isCap masked),
    tis (the same with the weight truncated at isCap), or none (the ratio against the behaviour policy)."""
    is_cap: float = pydantic.Field(default=2.0, ge=1.0, le=100.0)
    """Cap on the behaviour importance weight (tis truncates at it, decoupled masks above it)."""
    rejection: RejectionSpec | None = None
    """correction decoupled: the mismatch filter in place of the isCap mask (AReaL rejection_sampling)."""
    overlong: OverlongSpec | None = None
    """DAPO's overlong penalty on the reward, from the response's generated-token count."""
    dynamic_sampling: DynamicSamplingSpec | None = None
    """DAPO's dynamic sampling: drop prompt groups whose rewards are all equal."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> AlgorithmSpec:
        base.check_rules(self, _ALGORITHM_RULES)
        return self
