"""From a step's trajectories to per-token advantages: overlong shaping, token rewards, the KL penalty in
the reward, the estimator and batch-level normalisation.

Called by trainer/backend.py at the start of each step, on every rank with the same batch (so every rank
computes the same advantages without a collective). Pure: trajectories, reference logprobs and settings
in, advantages out; the adaptive KL coefficient is the only state, held by the caller.

    scores  s_i       the trajectory's reward, minus DAPO's overlong penalty on its generated tokens
    rewards r_it      s_i on the last trained token; with klPlacement reward, - kl * KL_t on every one
                      (KL of the engine's tokens: behaviour logprobs against the reference's)
    A_it              ESTIMATORS[name](r, mask, groups), or GAE over r and the critic's values V_it
                      (name gae, with the returns the critic trains toward); then AReaL's batch
                      normalisation if set
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch

from asyncrl_workloads.bus import trajectory as trajectory_mod
from asyncrl_workloads.trainer.algorithms import advantages, shaping, value


@dataclasses.dataclass(frozen=True)
class AdvantageSettings:
    estimator: str = "grpo"
    estimator_settings: advantages.EstimatorSettings = dataclasses.field(
        default_factory=advantages.EstimatorSettings
    )
    batch_norm: advantages.BatchNorm | None = None
    overlong: shaping.Overlong | None = None
    kl_in_reward: bool = False
    kl_estimator: str = "k1"
    lam: float = 1.0
    """GAE's lambda (estimator gae; its gamma is estimator_settings.gamma)."""


@dataclasses.dataclass(frozen=True)
class StepAdvantages:
    per_sample: dict[str, torch.Tensor]
    """trajectory id -> (R,) advantages of its response tokens."""
    metrics: dict[str, float]
    returns: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    """gae: trajectory id -> (R,) returns, the critic's targets."""


def pad(rows: Sequence[Sequence[float]], value: float = 0.0) -> torch.Tensor:
    """Rows of unequal length -> (B, longest) float32, right-padded with value."""
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=torch.float32)


def compute(
    batch: Sequence[trajectory_mod.Trajectory],
    settings: AdvantageSettings,
    reference: Mapping[str, torch.Tensor] | None = None,
    kl_coef: float = 0.0,
    values: Mapping[str, torch.Tensor] | None = None,
) -> StepAdvantages:
    """Advantages of every sample of the step. `reference`: id -> (R,) reference logprobs (KL in the
    reward only); `kl_coef`: the reward KL's current coefficient; `values`: id -> (R,) the critic's values
    before the step (gae only)."""
    mask = pad([t.mask for t in batch])  # (N, R)
    scores = torch.tensor([t.reward for t in batch], dtype=torch.float32)  # (N,)
    metrics: dict[str, float] = {"reward_mean": float(scores.mean())}
    if settings.overlong is not None:
        scores = shaping.overlong_penalty(scores, mask.sum(-1), settings.overlong)
        metrics["overlong_penalty_mean"] = float(scores.mean()) - metrics["reward_mean"]
    rewards = shaping.token_rewards(scores, mask)  # (N, R)
    if settings.kl_in_reward:
        assert reference is not None, "KL in the reward needs reference logprobs"
        behaviour = pad([t.behaviour_logprobs for t in batch])  # (N, R)
        ref = pad([reference[t.id].tolist() for t in batch])  # (N, R)
        rewards, current_kl = shaping.kl_in_reward(
            rewards, behaviour, ref, mask, kl_coef, settings.kl_estimator
        )
        metrics["reward_kl"] = current_kl
        metrics["kl_coef"] = kl_coef
    returns: dict[str, torch.Tensor] = {}
    if settings.estimator == "gae":
        assert values is not None, "gae needs the critic's values"
        old = pad([values[t.id].tolist() for t in batch])  # (N, R)
        gamma = settings.estimator_settings.gamma
        adv, ret = value.gae(rewards, old, mask, gamma, settings.lam)
        returns = {t.id: ret[i, : len(t.response_ids)].clone() for i, t in enumerate(batch)}
        metrics["value_mean"] = float((old * mask).sum() / mask.sum().clamp(min=1.0))
    else:
        groups = [t.group_id for t in batch]
        adv = advantages.ESTIMATORS[settings.estimator](rewards, mask, groups, settings.estimator_settings)
    if settings.batch_norm is not None:
        adv = advantages.normalize_batch(adv, mask, settings.batch_norm)
    metrics["advantage_abs_mean"] = float((adv.abs() * mask).sum() / mask.sum().clamp(min=1.0))
    per_sample = {t.id: adv[i, : len(t.response_ids)].clone() for i, t in enumerate(batch)}
    return StepAdvantages(per_sample, metrics, returns)
