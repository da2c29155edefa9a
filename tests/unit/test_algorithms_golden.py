"""The learning core (trainer/algorithms/, trainer/loss.py) against the anchors' own code on the same
tensors: verl 0.9.1 (verl/trainer/ppo/core_algos.py, verl/utils/torch_functional.py) and AReaL 1.0.4
(areal/utils/functional/functional.py, areal/utils/data.py), imported by tools/asyncrl_testing/anchors.py.

Each test names the anchor function it matches. The batch has responses of unequal length: tool output
(mask 0) inside, padding at the end, one response with no trained token; groups of one, groups with
equal rewards; and log-ratios beyond +-20, where verl's clamp (and ours) differs from AReaL's none.
Where a variant deliberately differs from an anchor, the test asserts both values and says why.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable

import numpy as np
import pytest
import torch
from asyncrl_testing import anchors as anchor_imports
from asyncrl_workloads.trainer import loss
from asyncrl_workloads.trainer.algorithms import (
    advantages,
    aggregation,
    correction,
    policy_loss,
    regularizers,
    shaping,
    value,
)
from torch.testing import assert_close

MISSING = anchor_imports.missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"verl/AReaL anchors {MISSING}")

MASK = torch.tensor(
    [
        [1, 1, 1, 1, 1, 1],
        [1, 1, 0, 0, 1, 1],  # tool output inside
        [1, 1, 1, 0, 0, 0],  # padding at the end
        [1, 0, 1, 1, 0, 0],  # both
        [1, 1, 1, 1, 1, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 0],  # no trained token
    ],
    dtype=torch.float32,
)  # (B, T) = (8, 6)
SCORES = torch.tensor([1.0, 0.0, 0.5, 0.7, 0.7, 0.9, -1.0, 2.0])  # (B,)
GROUPS = ["a", "a", "a", "b", "b", "c", "d", "d"]  # b: equal rewards; c: one sample
MODES = list(aggregation.AGGREGATIONS)
SCALE = 4.0  # seq-mean-token-sum-norm's constant
EXTREME = ((0, 2, 25.0), (3, 3, -25.0), (4, 1, 22.0), (5, 0, 24.0))  # row, column, log pi_theta - log pi_old
"""Row 5 (two tokens) then has a mean log-ratio above 10, where GSPO's clamp acts."""


@pytest.fixture(scope="module")
def anchors() -> anchor_imports.Anchors:
    return anchor_imports.load()


def _rng(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _batch_info() -> aggregation.BatchInfo:
    return aggregation.BatchInfo(
        tokens=float(MASK.sum()), sequences=float((MASK.sum(-1) > 0).sum()), scale=SCALE
    )


def _policy_tensors(seed: int, extreme: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logprobs, old_logprobs, token advantages (B, T); extreme: log-ratios beyond +-20 on trained tokens,
    with A < 0 where the ratio is huge (where a clamp or dual clip decides)."""
    gen = _rng(seed)
    old = -3.0 * torch.rand(MASK.shape, generator=gen)
    logprobs = old + 0.4 * torch.randn(MASK.shape, generator=gen)
    adv = torch.randn(MASK.shape, generator=gen) * MASK
    if extreme:
        for row, col, log_ratio in EXTREME:
            logprobs[row, col] = old[row, col] + log_ratio
            adv[row, col] = -1.5 if log_ratio > 0 else 0.8
    return logprobs, old, adv


def _value_and_grad(
    fn: Callable[[torch.Tensor], torch.Tensor], logprobs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = logprobs.clone().requires_grad_(True)
    value = fn(leaf)
    (grad,) = torch.autograd.grad(value, leaf)
    return value.detach(), grad


def _verl_config(anchors: anchor_imports.Anchors, **fields: object) -> object:
    """verl's ActorConfig: what compute_policy_loss_* read (clip_ratio_low/high, clip_ratio_c, tau_pos/neg,
    global_batch_info -> agg_loss's dp_size, batch_num_tokens, global_batch_size, loss_scale_factor)."""
    base = {
        "strategy": "fsdp",
        "rollout_n": 1,
        "ppo_micro_batch_size_per_gpu": 1,
        "global_batch_info": {"loss_scale_factor": SCALE},
    }
    return anchors.verl_actor_config(**(base | fields))


def _ours(name: str, mode: str, settings: policy_loss.LossSettings) -> Callable[..., torch.Tensor]:
    def objective(logprobs: torch.Tensor, old: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        per_token, _ = policy_loss.POLICY_LOSSES[name](logprobs, old, adv, MASK, settings)
        return aggregation.AGGREGATIONS[mode](per_token, MASK, _batch_info())

    return objective


# --- advantages -------------------------------------------------------------------------------------


def _outcome_rewards() -> torch.Tensor:
    return shaping.token_rewards(SCORES, MASK)  # (B, T)


@pytest.mark.parametrize("group_std", [True, False])
def test_grpo_matches_verl_compute_grpo_outcome_advantage(
    anchors: anchor_imports.Anchors, group_std: bool
) -> None:
    """verl compute_grpo_outcome_advantage(norm_adv_by_std_in_grpo). Deliberate difference: a group of one
    (c, row 5) gets 0 here and its raw score from verl (verl's mean 0, std 1 there)."""
    rewards = _outcome_rewards()
    ours = advantages.grpo(rewards, MASK, GROUPS, advantages.EstimatorSettings(group_std=group_std))
    theirs, _ = anchors.core_algos.compute_grpo_outcome_advantage(
        rewards.clone(), MASK, np.array(GROUPS), epsilon=1e-6, norm_adv_by_std_in_grpo=group_std
    )
    others = [i for i, g in enumerate(GROUPS) if g != "c"]
    assert_close(ours[others], theirs[others])
    assert_close(ours[3:5], torch.zeros(2, 6))  # equal rewards
    assert_close(ours[5], torch.zeros(6))
    assert_close(theirs[5], SCORES[5] * MASK[5])


@pytest.mark.parametrize("group_size", [1, 2, 4])
@pytest.mark.parametrize("group_std", [True, False])
def test_grpo_matches_areal_group_normalization(
    anchors: anchor_imports.Anchors, group_std: bool, group_size: int
) -> None:
    """AReaL Normalization(NormConfig(mean_level="group", std_level="group" or None, group_size=n,
    eps=1e-6)) on the scores, in contiguous groups of equal size (rows 2, 3 share a reward). Groups of one
    get 0 from both."""
    rewards = shaping.token_rewards(torch.tensor([1.0, 0.0, 0.5, 0.5, 0.7, 0.9, -1.0, 2.0]), MASK)
    groups = [str(i // group_size) for i in range(8)]
    config = anchors.areal_cli_args.NormConfig(
        mean_level="group", std_level="group" if group_std else None, group_size=group_size, eps=1e-6
    )
    theirs = anchors.areal_data.Normalization(config)(rewards.sum(-1))  # (B,)
    settings = advantages.EstimatorSettings(group_std=group_std)
    ours = advantages.grpo(rewards, MASK, groups, settings)
    assert_close(ours, theirs[:, None] * MASK)


def test_rloo_matches_verl_compute_rloo_outcome_advantage(anchors: anchor_imports.Anchors) -> None:
    """verl compute_rloo_outcome_advantage. Deliberate difference: a group of one gets 0 here, its raw
    score from verl (no other sample to be its baseline; verl leaves the score as it is)."""
    rewards = _outcome_rewards()
    ours = advantages.rloo(rewards, MASK, GROUPS, advantages.EstimatorSettings())
    theirs, _ = anchors.core_algos.compute_rloo_outcome_advantage(rewards.clone(), MASK, np.array(GROUPS))
    others = [i for i, g in enumerate(GROUPS) if g != "c"]
    assert_close(ours[others], theirs[others])
    assert_close(ours[5], torch.zeros(6))
    assert_close(theirs[5], SCORES[5] * MASK[5])


@pytest.mark.parametrize("group_size", [2, 4])
def test_rloo_matches_areal_leave_one_out_normalization(
    anchors: anchor_imports.Anchors, group_size: int
) -> None:
    """AReaL Normalization(NormConfig(mean_level="group", mean_leave1out=True, std_level=None))."""
    groups = [str(i // group_size) for i in range(8)]
    config = anchors.areal_cli_args.NormConfig(
        mean_level="group", mean_leave1out=True, std_level=None, group_size=group_size
    )
    theirs = anchors.areal_data.Normalization(config)(_outcome_rewards().sum(-1))
    ours = advantages.rloo(_outcome_rewards(), MASK, groups, advantages.EstimatorSettings())
    assert_close(ours, theirs[:, None] * MASK)


def test_rloo_group_of_one_differs_from_areal_leave_one_out(anchors: anchor_imports.Anchors) -> None:
    """AReaL's leave-one-out with group_size 1 uses mean 0, so the advantage is the raw score, as verl's;
    ours is 0 (a prompt sampled once carries no baseline, so no signal)."""
    config = anchors.areal_cli_args.NormConfig(
        mean_level="group", mean_leave1out=True, std_level=None, group_size=1
    )
    theirs = anchors.areal_data.Normalization(config)(SCORES.clone())
    ours = advantages.rloo(
        _outcome_rewards(), MASK, [str(i) for i in range(8)], advantages.EstimatorSettings()
    )
    assert_close(theirs, SCORES)
    assert_close(ours, torch.zeros_like(MASK))


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus_matches_verl(anchors: anchor_imports.Anchors, gamma: float) -> None:
    """verl compute_reinforce_plus_plus_outcome_advantage: token rewards at several positions (one on a
    tool-output token, which both drop), the running return carried through tool output, whitened over
    every trained token."""
    rewards = torch.zeros_like(MASK)
    for row, col, r in ((0, 1, 0.5), (0, 5, 1.0), (1, 2, 0.7), (1, 5, -1.0), (2, 2, 1.0), (3, 0, 0.3),
                            (3, 3, 0.4), (4, 4, -0.5), (5, 1, 1.0), (6, 0, 0.2), (6, 3, 0.8)):  # fmt: skip
        rewards[row, col] = r
    ours = advantages.reinforce_plus_plus(rewards, MASK, GROUPS, advantages.EstimatorSettings(gamma=gamma))
    theirs, _ = anchors.core_algos.compute_reinforce_plus_plus_outcome_advantage(
        rewards.clone(), MASK, config=types.SimpleNamespace(gamma=gamma)
    )
    assert_close(ours, theirs)


def test_reinforce_plus_plus_baseline_matches_verl(anchors: anchor_imports.Anchors) -> None:
    """verl compute_reinforce_plus_plus_baseline_outcome_advantage. Deliberate difference: a group of one
    is centred to 0 here (verl keeps its raw score), so ours equals verl's on the batch whose singleton
    scored 0; on the real batch the singleton's raw score also moves the batch whitening."""
    rewards = _outcome_rewards()
    ours = advantages.reinforce_plus_plus_baseline(rewards, MASK, GROUPS, advantages.EstimatorSettings())
    singleton_zeroed = rewards.clone()
    singleton_zeroed[5] = 0.0
    fn = anchors.core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage
    theirs, _ = fn(singleton_zeroed, MASK, np.array(GROUPS))
    assert_close(ours, theirs)
    raw, _ = fn(rewards.clone(), MASK, np.array(GROUPS))
    assert float(raw[5, 0]) > 0.5 and not torch.allclose(ours, raw)


@pytest.mark.parametrize("std", [True, False])
@pytest.mark.parametrize("leave_one_out", [True, False])
@pytest.mark.parametrize("unbiased", [True, False])
def test_normalize_batch_matches_areal_batch_normalization(
    anchors: anchor_imports.Anchors, std: bool, leave_one_out: bool, unbiased: bool
) -> None:
    """AReaL Normalization(NormConfig(mean_level="batch", std_level="batch" or None, mean_leave1out,
    std_unbiased)) with a loss mask, on token advantages."""
    adv = torch.randn(MASK.shape, generator=_rng(3)) * MASK + 0.3
    config = anchors.areal_cli_args.NormConfig(
        mean_level="batch",
        std_level="batch" if std else None,
        mean_leave1out=leave_one_out,
        std_unbiased=unbiased,
        eps=1e-5,
    )
    theirs = anchors.areal_data.Normalization(config)(adv.clone(), MASK)
    norm = advantages.BatchNorm(std=std, leave_one_out=leave_one_out, unbiased=unbiased, eps=1e-5)
    assert_close(advantages.normalize_batch(adv, MASK, norm), theirs)


# --- policy losses ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("clip_ratio_c", [None, 3.0])
def test_ppo_matches_verl_compute_policy_loss_vanilla(
    anchors: anchor_imports.Anchors, mode: str, clip_ratio_c: float | None
) -> None:
    """verl compute_policy_loss_vanilla (+ agg_loss) in value and gradient, with log-ratios of +-25 (both
    clamp them to +-20). verl's dual clip cannot be switched off: None is compared with a bound no ratio
    reaches (1e10 > e^20)."""
    logprobs, old, adv = _policy_tensors(0, extreme=True)
    settings = policy_loss.LossSettings(clip_low=0.2, clip_high=0.28, clip_ratio_c=clip_ratio_c)
    config = _verl_config(
        anchors, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=clip_ratio_c or 1e10
    )
    ours = _value_and_grad(lambda lp: _ours("ppo", mode, settings)(lp, old, adv), logprobs)
    theirs = _value_and_grad(
        lambda lp: anchors.core_algos.compute_policy_loss_vanilla(old, lp, adv, MASK, mode, config)[0],
        logprobs,
    )
    assert_close(ours, theirs)


@pytest.mark.parametrize("clip_ratio_c", [None, 3.0])
def test_ppo_matches_areal_ppo_actor_loss_fn(
    anchors: anchor_imports.Anchors, clip_ratio_c: float | None
) -> None:
    """AReaL ppo_actor_loss_fn (token-mean, c_clip None/3.0, no rejection sampling) in value and gradient."""
    logprobs, old, adv = _policy_tensors(1, extreme=False)
    settings = policy_loss.LossSettings(clip_low=0.2, clip_high=0.28, clip_ratio_c=clip_ratio_c)
    ours = _value_and_grad(lambda lp: _ours("ppo", "token-mean", settings)(lp, old, adv), logprobs)
    theirs = _value_and_grad(
        lambda lp: anchors.areal_functional.ppo_actor_loss_fn(
            lp, old, old, adv, 0.2, MASK.bool(), eps_clip_higher=0.28, c_clip=clip_ratio_c
        )[0],
        logprobs,
    )
    assert_close(ours, theirs)


def test_ppo_log_ratio_clamp_differs_from_areal_beyond_20(anchors: anchor_imports.Anchors) -> None:
    """A token with log r = 25 and A = -1.5, no dual clip: ours (as verl) clamps log r to 20, so the loss is
    1.5 e^20 with no gradient; AReaL does not clamp: 1.5 e^25 and gradient 1.5 e^25."""
    logprobs, old, adv = _policy_tensors(0, extreme=True)
    mask = torch.zeros_like(MASK)
    mask[0, 2] = 1.0
    settings = policy_loss.LossSettings(clip_low=0.2, clip_high=0.28)
    leaf = logprobs.clone().requires_grad_(True)
    per_token, _ = policy_loss.ppo(leaf, old, adv, mask, settings)
    (ours_grad,) = torch.autograd.grad(per_token[0, 2], leaf)
    value, _ = anchors.areal_functional.ppo_actor_loss_fn(leaf, old, old, adv, 0.2, mask.bool(), 0.28)
    (theirs_grad,) = torch.autograd.grad(value, leaf)
    assert_close(per_token[0, 2].detach(), torch.tensor(1.5 * np.exp(20.0), dtype=torch.float32))
    assert float(ours_grad.abs().sum()) == 0.0
    expected = torch.tensor(1.5 * np.exp(25.0), dtype=torch.float32)
    assert_close(value.detach(), expected, rtol=1e-4, atol=0.0)
    assert_close(theirs_grad[0, 2], expected, rtol=1e-4, atol=0.0)


@pytest.mark.parametrize("mode", MODES)
def test_gspo_matches_verl_compute_policy_loss_gspo(anchors: anchor_imports.Anchors, mode: str) -> None:
    """verl compute_policy_loss_gspo (+ agg_loss) in value and gradient, token advantages, with the
    extreme tokens (the sequence log-ratio clamped at 10 by both)."""
    logprobs, old, adv = _policy_tensors(2, extreme=True)
    settings = policy_loss.LossSettings(clip_low=0.2, clip_high=0.28)
    config = _verl_config(anchors, clip_ratio_low=0.2, clip_ratio_high=0.28)
    ours = _value_and_grad(lambda lp: _ours("gspo", mode, settings)(lp, old, adv), logprobs)
    theirs = _value_and_grad(
        lambda lp: anchors.core_algos.compute_policy_loss_gspo(old, lp, adv, MASK, mode, config)[0], logprobs
    )
    assert_close(ours, theirs)


def test_gspo_matches_areal_sequence_level_importance_sampling(anchors: anchor_imports.Anchors) -> None:
    """AReaL ppo_actor_loss_fn(importance_sampling_level="sequence") with outcome advantages (one per
    sequence), token-mean: the same value and gradient (AReaL differentiates the geometric mean itself,
    ours each token's GSPO-token ratio; with one advantage per sequence the sums agree)."""
    logprobs, old, _ = _policy_tensors(3, extreme=False)
    adv = torch.randn(8, generator=_rng(4))[:, None] * MASK
    settings = policy_loss.LossSettings(clip_low=0.2, clip_high=0.28)
    ours = _value_and_grad(lambda lp: _ours("gspo", "token-mean", settings)(lp, old, adv), logprobs)
    theirs = _value_and_grad(
        lambda lp: anchors.areal_functional.ppo_actor_loss_fn(
            lp, old, old, adv, 0.2, MASK.bool(), eps_clip_higher=0.28, importance_sampling_level="sequence"
        )[0],
        logprobs,
    )
    assert_close(ours, theirs)


@pytest.mark.parametrize("mode", MODES)
def test_cispo_matches_verl_compute_policy_loss_cispo(anchors: anchor_imports.Anchors, mode: str) -> None:
    """verl compute_policy_loss_cispo (+ agg_loss) in value and gradient, with the extreme tokens."""
    logprobs, old, adv = _policy_tensors(5, extreme=True)
    settings = policy_loss.LossSettings(clip_low=0.2, clip_high=0.28)
    config = _verl_config(anchors, clip_ratio_low=0.2, clip_ratio_high=0.28)
    ours = _value_and_grad(lambda lp: _ours("cispo", mode, settings)(lp, old, adv), logprobs)
    theirs = _value_and_grad(
        lambda lp: anchors.core_algos.compute_policy_loss_cispo(old, lp, adv, MASK, mode, config)[0], logprobs
    )
    assert_close(ours, theirs)


def test_sapo_matches_verl_compute_policy_loss_sapo(anchors: anchor_imports.Anchors) -> None:
    """verl compute_policy_loss_sapo, which always aggregates seq-mean-token-mean (whatever loss_agg_mode
    says): ours + seq-mean-token-mean, in value and gradient, with the extreme tokens."""
    logprobs, old, adv = _policy_tensors(6, extreme=True)
    settings = policy_loss.LossSettings(tau_pos=1.0, tau_neg=1.05)
    config = _verl_config(anchors, tau_pos=1.0, tau_neg=1.05)
    ours = _value_and_grad(lambda lp: _ours("sapo", "seq-mean-token-mean", settings)(lp, old, adv), logprobs)
    theirs = _value_and_grad(
        lambda lp: anchors.core_algos.compute_policy_loss_sapo(old, lp, adv, MASK, "token-mean", config)[0],
        logprobs,
    )
    assert_close(ours, theirs)


def test_sapo_matches_areal_sapo_loss_fn(anchors: anchor_imports.Anchors) -> None:
    """AReaL sapo_loss_fn (token level, token-mean) in value and gradient."""
    logprobs, old, adv = _policy_tensors(7, extreme=False)
    settings = policy_loss.LossSettings(tau_pos=1.0, tau_neg=1.05)
    ours = _value_and_grad(lambda lp: _ours("sapo", "token-mean", settings)(lp, old, adv), logprobs)
    theirs = _value_and_grad(
        lambda lp: anchors.areal_functional.sapo_loss_fn(lp, old, adv, 1.0, 1.05, MASK.bool())[0], logprobs
    )
    assert_close(ours, theirs)


# --- aggregation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_aggregation_matches_verl_agg_loss(anchors: anchor_imports.Anchors, mode: str) -> None:
    """verl agg_loss on one rank (dp_size 1), a row with no trained token excluded from the sequences."""
    per_token = torch.randn(MASK.shape, generator=_rng(8))
    ours = aggregation.AGGREGATIONS[mode](per_token, MASK, _batch_info())
    theirs = anchors.core_algos.agg_loss(per_token, MASK, mode, loss_scale_factor=SCALE)
    assert_close(ours, theirs)


@pytest.mark.parametrize("mode", MODES)
def test_aggregation_shares_of_two_ranks_sum_to_verl_on_the_whole_batch(
    anchors: anchor_imports.Anchors, mode: str
) -> None:
    """The batch's rows split over 2 ranks holding 16 and 11 trained tokens: each rank's share with the
    global counts (BatchInfo) sums to verl agg_loss on the whole batch (dp_size 1), and equals the mean
    over ranks (DDP's gradient averaging) of verl agg_loss(dp_size=2, batch_num_tokens and
    global_batch_size global) on each rank's rows: verl's dp_size factor is what the mean divides out."""
    per_token = torch.randn(MASK.shape, generator=_rng(9))
    info = _batch_info()
    ranks = (slice(0, 4), slice(4, 8))
    assert [float(MASK[r].sum()) for r in ranks] == [16.0, 11.0]
    shares = [aggregation.AGGREGATIONS[mode](per_token[r], MASK[r], info) for r in ranks]
    whole = anchors.core_algos.agg_loss(per_token, MASK, mode, loss_scale_factor=SCALE)
    assert_close(sum(shares), whole)
    per_rank = [
        anchors.core_algos.agg_loss(
            per_token[r], MASK[r], mode, dp_size=2, batch_num_tokens=info.tokens,
            global_batch_size=info.sequences, loss_scale_factor=SCALE,
        )
        for r in ranks
    ]  # fmt: skip
    assert_close(sum(per_rank) / 2, whole)
    for share, theirs in zip(shares, per_rank, strict=True):
        assert_close(share * 2, theirs)  # backend.py multiplies by the data-parallel size, as verl


# --- regularizers -----------------------------------------------------------------------------------

VERL_KL = {"k1": "k1", "k2": "k2", "k3": "low_var_kl", "abs": "abs"}


def _kl_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = _rng(10)
    ref = -3.0 * torch.rand(4, 9, generator=gen)
    logprobs = ref + torch.randn(4, 9, generator=gen)
    logprobs[0, :] = ref[0, :] + torch.tensor([-30.0, -21.0, -11.0, -5.0, 4.0, 9.0, 12.0, 21.0, 30.0])
    return logprobs, ref


@pytest.mark.parametrize("name", list(regularizers.KL_ESTIMATORS))
def test_kl_estimators_match_verl_kl_penalty(anchors: anchor_imports.Anchors, name: str) -> None:
    """verl kl_penalty("k1", "k2", "low_var_kl", "abs") in value and gradient, with |log pi - log pi_ref| up
    to 30 (k3's clamps at 20 and 10 are verl's)."""
    logprobs, ref = _kl_inputs()
    ours = _value_and_grad(lambda lp: regularizers.KL_ESTIMATORS[name](lp, ref).sum(), logprobs)
    theirs = _value_and_grad(lambda lp: anchors.core_algos.kl_penalty(lp, ref, VERL_KL[name]).sum(), logprobs)
    assert_close(ours, theirs)
    assert_close(
        regularizers.KL_ESTIMATORS[name](logprobs, ref),
        anchors.core_algos.kl_penalty(logprobs, ref, VERL_KL[name]),
    )


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_kl_estimators_match_areal_kl_estimator_inside_its_clamp(
    anchors: anchor_imports.Anchors, name: str
) -> None:
    """AReaL KLEstimator clamps every estimate to [-10, 10]; ours clamps only k3 (as verl). They agree
    wherever the estimate is inside [-10, 10] (|log pi - log pi_ref| <= 10 for k1, <= sqrt(20) for k2, k3
    everywhere) and differ beyond: e.g. k1 at 12 is 12 here, 10 in AReaL; k2 at 9 is 40.5 here, 10 there."""
    logprobs, ref = _kl_inputs()
    ours = regularizers.KL_ESTIMATORS[name](logprobs, ref)
    theirs = anchors.areal_data.KLEstimator(name)(logprobs, ref)
    inside = ours.abs() <= 10.0
    assert_close(ours[inside], theirs[inside])
    assert_close(theirs, ours.clamp(-10.0, 10.0))
    if name != "k3":
        assert not bool(inside.all())
    if name == "k1":
        assert (float(ours[0, 6]), float(theirs[0, 6])) == pytest.approx((12.0, 10.0))
    if name == "k2":
        assert (float(ours[0, 5]), float(theirs[0, 5])) == pytest.approx((40.5, 10.0), rel=1e-5)


def test_entropy_matches_verl_entropy_from_logits(anchors: anchor_imports.Anchors) -> None:
    """verl.utils.torch_functional.entropy_from_logits, including logits of +-50."""
    logits = 3.0 * torch.randn(3, 5, 11, generator=_rng(11))
    logits[0, 0, 0], logits[1, 2, :] = 50.0, -50.0
    ours = _value_and_grad(lambda x: regularizers.entropy_from_logits(x).sum(), logits)
    theirs = _value_and_grad(lambda x: anchors.verl_functional.entropy_from_logits(x).sum(), logits)
    assert_close(ours, theirs)


# --- shaping ----------------------------------------------------------------------------------------


def test_overlong_penalty_matches_areal_reward_overlong_penalty(anchors: anchor_imports.Anchors) -> None:
    """AReaL reward_overlong_penalty (lengths: each response's trained tokens, 0..6 with a budget of 6 and
    a buffer of 3: no penalty up to 3, -factor at 6)."""
    overlong = shaping.Overlong(buffer_tokens=3, penalty_factor=0.5, max_tokens=6)
    data = {"rewards": SCORES.clone(), "input_ids": torch.zeros(8, 6, dtype=torch.long), "loss_mask": MASK}
    theirs = anchors.areal_functional.reward_overlong_penalty(data, 3, 0.5, 6)["rewards"]
    ours = shaping.overlong_penalty(SCORES, MASK.sum(-1), overlong)
    assert_close(ours, theirs)
    assert_close(ours[0], SCORES[0] - 0.5)


@pytest.mark.parametrize("estimator", list(regularizers.KL_ESTIMATORS))
def test_kl_in_reward_matches_verl_apply_kl_penalty(anchors: anchor_imports.Anchors, estimator: str) -> None:
    """verl apply_kl_penalty (verl/trainer/ppo/ray_trainer.py, which needs a DataProto: its lines are
    spelled out here with core_algos.kl_penalty and torch_functional.masked_mean): kld = kl_penalty * mask,
    rewards - beta kld, current_kl = mean over samples of masked_mean(kld, axis=-1); and, for k1, verl
    compute_rewards(token_level_scores, old_log_prob, ref_log_prob, kl_ratio) on the trained tokens."""
    logprobs, ref, _ = _policy_tensors(12, extreme=False)
    scores = _outcome_rewards()
    ours, current = shaping.kl_in_reward(scores, logprobs, ref, MASK, 0.05, estimator)
    kld = anchors.core_algos.kl_penalty(logprobs, ref, VERL_KL[estimator]) * MASK
    assert_close(ours, scores - 0.05 * kld)
    expected_kl = anchors.verl_functional.masked_mean(kld, mask=MASK, axis=-1).mean()
    assert current == pytest.approx(float(expected_kl), rel=1e-6)
    if estimator == "k1":
        theirs = anchors.core_algos.compute_rewards(scores, logprobs, ref, 0.05)
        assert_close(ours * MASK, theirs * MASK)


def test_adaptive_kl_matches_verl_adaptive_kl_controller(anchors: anchor_imports.Anchors) -> None:
    """verl AdaptiveKLController over updates below, near and above the target (error clipped at +-0.2);
    a target of None is verl's FixedKLController."""
    ours = shaping.AdaptiveKL(0.1, 0.02, 1000)
    theirs = anchors.core_algos.AdaptiveKLController(0.1, 0.02, 1000)
    fixed, verl_fixed = shaping.AdaptiveKL(0.1, None, 1000), anchors.core_algos.FixedKLController(0.1)
    for current, n in ((0.001, 64), (0.019, 64), (0.05, 128), (0.021, 32), (0.5, 256)):
        ours.update(current, n)
        theirs.update(current, n)
        fixed.update(current, n)
        verl_fixed.update(current, n)
        assert ours.value == pytest.approx(float(theirs.value), rel=1e-12)
        assert fixed.value == verl_fixed.value == 0.1


# --- correction -------------------------------------------------------------------------------------

BOUNDS = {"ratio": (1.3, 0.8), "k1": (0.3, -0.1), "k2": (0.06, 0.004), "k3": (0.06, 0.004)}  # upper, lower
AREAL_METRIC = {"ratio": "ratio", "k1": "kl_k1", "k2": "kl_k2", "k3": "kl_k3"}
CASES = [
    (level, action, metric, agg, lower)
    for level, action, metric, lower in itertools.product(
        ("token", "sequence"), ("mask", "clamp"), ("ratio", "k1", "k2", "k3"), (False, True)
    )
    for agg in (("mean", "sum", "max") if level == "sequence" else ("mean",))
]


def _areal_rejection(anchors: anchor_imports.Anchors, rejection: correction.Rejection) -> object:
    """AReaL RejectionSamplingConfig with the same fields. AReaL's __post_init__ refuses clamp with a KL
    metric (as our Rejection does at the API level); the function itself is compared there too, so that
    config is built with metric ratio and its fields set afterwards."""
    cls = anchors.areal_cli_args.RejectionSamplingConfig
    fields = {"level": rejection.level, "action": rejection.action, "agg": rejection.agg}
    if rejection.action == "mask" or rejection.metric == "ratio":
        metric = AREAL_METRIC[rejection.metric]
        return cls(**fields, metric=metric, upper=rejection.upper, lower=rejection.lower)
    config = cls(**fields, metric="ratio", upper=2.0)
    config.metric, config.upper, config.lower = (
        AREAL_METRIC[rejection.metric],
        rejection.upper,
        rejection.lower,
    )
    return config


def _behaviour() -> tuple[torch.Tensor, torch.Tensor]:
    """proximal, behaviour logprobs (B, T): each row drifted by its own spread, so sequences differ."""
    gen = _rng(13)
    behaviour = -3.0 * torch.rand(MASK.shape, generator=gen)
    spread = torch.tensor([0.05, 0.6, 0.1, 0.4, 0.2, 0.8, 0.3, 0.5])[:, None]  # (B, 1)
    return behaviour + spread * torch.randn(MASK.shape, generator=gen) + 0.1, behaviour


@pytest.mark.parametrize(("level", "action", "metric", "agg", "lower"), CASES)
def test_correction_matches_areal_apply_rejection_sampling(
    anchors: anchor_imports.Anchors, level: str, action: str, metric: str, agg: str, lower: bool
) -> None:
    """AReaL apply_rejection_sampling: the weight (behave_imp_weight), the mask and filtered_fraction, for
    every level, action, metric (AReaL's kl_k1/kl_k2/kl_k3 are our k1/k2/k3), sequence aggregation and
    with or without a lower bound."""
    proximal, behaviour = _behaviour()
    upper, low = BOUNDS[metric]
    rejection = correction.Rejection(level, action, metric, agg, upper, low if lower else None)
    ours = correction.apply(proximal, behaviour, MASK, rejection)
    theirs = anchors.areal_functional.apply_rejection_sampling(
        proximal, behaviour, MASK, None, _areal_rejection(anchors, rejection)
    )
    assert_close(ours.weight, theirs.behave_imp_weight)
    assert_close(ours.mask, theirs.loss_mask)
    assert ours.filtered_fraction == pytest.approx(theirs.filtered_fraction)


def test_correction_cases_filter_something_and_keep_something() -> None:
    """The bounds above make the comparison decide: almost every mask case keeps some tokens and drops
    others (only sum over a sequence drops everything with a lower bound)."""
    proximal, behaviour = _behaviour()
    fractions = []
    for level, action, metric, agg, lower in CASES:
        upper, low = BOUNDS[metric]
        rejection = correction.Rejection(level, action, metric, agg, upper, low if lower else None)
        if action == "mask":
            fractions.append(correction.apply(proximal, behaviour, MASK, rejection).filtered_fraction)
    assert sum(0.0 < f < 1.0 for f in fractions) >= len(fractions) - 2


# --- the objective end to end -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "rejection",
    [
        correction.Rejection("token", "mask", "ratio", "mean", 1.3, 0.8),
        correction.Rejection("sequence", "clamp", "ratio", "mean", 1.1, None),
        correction.Rejection("sequence", "mask", "k3", "max", 0.06, None),
    ],
)
def test_policy_objective_matches_areal_decoupled_ppo_with_rejection(
    anchors: anchor_imports.Anchors, rejection: correction.Rejection
) -> None:
    """loss.policy_objective (ppo, token-mean, correction decoupled + rejection) against AReaL
    ppo_actor_loss_fn(rejection_sampling=...): the same loss and gradient (the denominator is the trained
    tokens before the filter in both)."""
    proximal, behaviour = _behaviour()
    logprobs = proximal + 0.2 * torch.randn(MASK.shape, generator=_rng(14))
    adv = torch.randn(MASK.shape, generator=_rng(15)) * MASK
    objective = loss.Objective(
        policy_loss="ppo",
        loss=policy_loss.LossSettings(clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0),
        aggregation="token-mean",
        correction="decoupled",
        rejection=rejection,
    )

    def ours(lp: torch.Tensor) -> torch.Tensor:
        inputs = loss.LossInputs(lp, proximal, behaviour, adv, MASK, _batch_info())
        return loss.policy_objective(inputs, objective)[0]

    def theirs(lp: torch.Tensor) -> torch.Tensor:
        config = _areal_rejection(anchors, rejection)
        value, _ = anchors.areal_functional.ppo_actor_loss_fn(
            lp, proximal, behaviour, adv, 0.2, MASK.bool(), 0.28, 3.0, rejection_sampling=config
        )
        return value  # type: ignore[no-any-return]

    mine = _value_and_grad(ours, logprobs)
    assert_close(mine, _value_and_grad(theirs, logprobs))
    assert float(mine[1].abs().sum()) > 0.0


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95)])
def test_gae_matches_verl(anchors: anchor_imports.Anchors, gamma: float, lam: float) -> None:
    """verl compute_gae_advantage_return: per-token rewards, the critic's values, tool output carrying the
    next value and advantage through; the advantages whitened over the trained tokens, the returns not."""
    rewards = torch.zeros_like(MASK)
    for row, col, r in ((0, 5, 1.0), (1, 5, -1.0), (1, 2, 0.3), (2, 2, 0.5), (3, 3, 0.7), (4, 4, 0.7),
                            (5, 1, 0.9), (6, 3, -1.0)):  # fmt: skip
        rewards[row, col] = r
    values = torch.randn(MASK.shape, generator=_rng(11)) * 0.5
    ours_adv, ours_ret = value.gae(rewards, values, MASK, gamma, lam)
    theirs_adv, theirs_ret = anchors.core_algos.compute_gae_advantage_return(
        rewards.clone(), values.clone(), MASK, gamma, lam
    )
    assert_close(ours_adv, theirs_adv)
    assert_close(ours_ret, theirs_ret)


@pytest.mark.parametrize("mode", MODES)
def test_clipped_value_loss_matches_verl(anchors: anchor_imports.Anchors, mode: str) -> None:
    """verl compute_value_loss (0.5 * agg(max((V - R)^2, (clip(V, V_old +- c) - R)^2))) and its clip
    fraction, for every aggregation mode, in value and gradient."""
    predicted = (torch.randn(MASK.shape, generator=_rng(12)) * 0.8).requires_grad_(True)
    returns = torch.randn(MASK.shape, generator=_rng(13))
    old = predicted.detach() + torch.randn(MASK.shape, generator=_rng(14)) * 0.6
    info = aggregation.BatchInfo(
        tokens=float(MASK.sum()), sequences=float((MASK.sum(-1) > 0).sum()), scale=SCALE
    )
    per_token, clipped = value.value_loss(predicted, returns, old, 0.5)
    ours = aggregation.AGGREGATIONS[mode](per_token, MASK, info)
    (ours_grad,) = torch.autograd.grad(ours, predicted)
    theirs_pred = predicted.detach().clone().requires_grad_(True)
    theirs, fraction = anchors.core_algos.compute_value_loss(
        theirs_pred, returns, old, MASK, 0.5, loss_agg_mode=mode, loss_scale_factor=SCALE
    )
    (theirs_grad,) = torch.autograd.grad(theirs, theirs_pred)
    assert_close(ours, theirs)
    assert_close(ours_grad, theirs_grad)
    assert float((clipped * MASK).sum() / MASK.sum()) == pytest.approx(float(fraction), abs=1e-6)
