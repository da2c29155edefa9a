"""Loss and advantage math against numbers worked out by hand (see each test's comment): the algorithms
(trainer/algorithms/) as trainer/loss.py composes them, and the teacher's distillation term. The same
functions are compared with verl's and AReaL's own code in test_algorithms_golden.py."""

from __future__ import annotations

import math

import pytest
import torch
from asyncrl_workloads.trainer import loss
from asyncrl_workloads.trainer.algorithms import advantages, aggregation, correction, policy_loss

CLIP = policy_loss.LossSettings(clip_low=0.2, clip_high=0.28)
PLAIN = loss.Objective(loss=CLIP, correction="none")
DECOUPLED = loss.Objective(loss=CLIP, correction="decoupled", rejection=correction.Rejection(upper=2.0))
TIS = loss.Objective(loss=CLIP, correction="tis", rejection=correction.Rejection(action="clamp", upper=2.0))


def _inputs(logp_minus_prox, prox_minus_behav, adv, mask=(1.0, 1.0, 1.0), num_tokens=3.0):
    behaviour = torch.tensor([[-1.0, -2.0, -3.0]])
    prox = behaviour + torch.log(torch.tensor([prox_minus_behav]))
    logprobs = (prox + torch.log(torch.tensor([logp_minus_prox]))).requires_grad_(True)
    return loss.LossInputs(
        logprobs=logprobs,
        proximal_logprobs=prox,
        behaviour_logprobs=behaviour,
        advantages=torch.full((1, 3), adv),
        mask=torch.tensor([mask]),
        batch=aggregation.BatchInfo(tokens=num_tokens, sequences=1.0),
    )


def _outcome(scores: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """One-token responses: the score is the token reward; token_rewards (B, 1), mask (B, 1)."""
    return torch.tensor(scores)[:, None], torch.ones(len(scores), 1)


def test_grpo_advantages_normalise_within_each_group():
    # group a: [1, 0] mean .5, unbiased std sqrt(.5) -> +-0.70711; group b: equal rewards -> 0;
    # group c: [1, 0, 0] mean 1/3, std sqrt(1/3) -> [1.1547, -0.57735, -0.57735]; group d (size 1) -> 0
    rewards, mask = _outcome([1.0, 0.0, 0.5, 0.5, 1.0, 0.0, 0.0, 0.9])
    groups = ["a", "a", "b", "b", "c", "c", "c", "d"]
    adv = advantages.grpo(rewards, mask, groups, advantages.EstimatorSettings())
    expected = [0.70711, -0.70711, 0.0, 0.0, 1.15470, -0.57735, -0.57735, 0.0]
    assert adv[:, 0].tolist() == pytest.approx(expected, abs=1e-4)


def test_ppo_baseline_advantages_subtract_the_batch_mean():
    rewards, mask = _outcome([1.0, 0.0, 0.5])
    adv = advantages.batch_baseline(rewards, mask, ["a", "b", "c"], advantages.EstimatorSettings())
    assert adv[:, 0].tolist() == pytest.approx([0.5, -0.5, 0.0])


def test_ppo_clip_positive_advantage_clips_above_1_plus_clip_high():
    # ratios [1.5, 0.5, 1.0], A=+1: clip to [0.8, 1.28] -> min(rA, cA) = [1.28, 0.5, 1.0]
    # loss = -(1.28 + 0.5 + 1.0) / 3 = -0.926667; clipping active only on token 0
    inputs = _inputs([1.5, 0.5, 1.0], [1.0, 1.0, 1.0], 1.0)
    value, metrics = loss.policy_objective(inputs, PLAIN)
    assert float(value.detach()) == pytest.approx(-0.926667, abs=1e-5)
    assert metrics["clip_fraction"] == pytest.approx(1 / 3)
    value.backward()
    # d/dlogp of -r/3 = -r/3 where unclipped; 0 where the clipped branch is taken
    assert inputs.logprobs.grad.tolist()[0] == pytest.approx([0.0, -0.5 / 3, -1.0 / 3], abs=1e-6)


def test_ppo_clip_negative_advantage_clips_below_1_minus_clip_low():
    # A=-1: rA = [-1.5, -0.5, -1], cA = [-1.28, -0.8, -1] -> min = [-1.5, -0.8, -1]; loss = 3.3/3 = 1.1
    value, metrics = loss.policy_objective(_inputs([1.5, 0.5, 1.0], [1.0, 1.0, 1.0], -1.0), PLAIN)
    assert float(value.detach()) == pytest.approx(1.1, abs=1e-5)
    assert metrics["clip_fraction"] == pytest.approx(1 / 3)


def test_masked_tokens_do_not_count_and_the_global_token_count_normalises():
    # token 1 masked: -(1.28 + 1.0) / num_tokens; with num_tokens=4 (another rank holds 2 more) -> -0.57
    inputs = _inputs([1.5, 0.5, 1.0], [1.0, 1.0, 1.0], 1.0, mask=(1.0, 0.0, 1.0), num_tokens=4.0)
    value, _ = loss.policy_objective(inputs, PLAIN)
    assert float(value.detach()) == pytest.approx(-2.28 / 4, abs=1e-5)


def test_decoupled_ppo_weights_by_prox_over_behaviour_and_masks_above_the_cap():
    # w = [2, 3, 1] (3 > cap 2 -> masked); r = [1.1, 1.0, 0.7] -> min(r, clip r) = [1.1, 1.0, 0.7]
    # loss = -(2*1.1 + 0 + 1*0.7) / 3 = -0.966667 (the denominator counts the masked token: AReaL's);
    # the weight's mean over the kept tokens = (2 + 1) / 2
    value, metrics = loss.policy_objective(_inputs([1.1, 1.0, 0.7], [2.0, 3.0, 1.0], 1.0), DECOUPLED)
    assert float(value.detach()) == pytest.approx(-0.966667, abs=1e-5)
    assert metrics["is_filtered_fraction"] == pytest.approx(1 / 3)
    assert metrics["is_weight_mean"] == pytest.approx(1.5, abs=1e-5)


def test_tis_truncates_the_weight_at_the_cap():
    # w = min([2, 3, 1], 2) = [2, 2, 1]; loss = -(2*1.1 + 2*1.0 + 1*0.7) / 3 = -1.633333
    inputs = _inputs([1.1, 1.0, 0.7], [2.0, 3.0, 1.0], 1.0)
    value, metrics = loss.policy_objective(inputs, TIS)
    assert float(value.detach()) == pytest.approx(-1.633333, abs=1e-5)
    assert metrics["is_filtered_fraction"] == pytest.approx(1 / 3)
    value.backward()
    # gradient flows through r only (weights are detached): d/dlogp = -w * r / 3 where r is unclipped
    # token 2: r=0.7 < 0.8 but A>0 takes min -> unclipped 0.7 -> -1*0.7/3
    assert inputs.logprobs.grad.tolist()[0] == pytest.approx([-2 * 1.1 / 3, -2 * 1.0 / 3, -0.7 / 3], abs=1e-5)


def test_on_policy_corrections_agree_with_plain_ppo():
    # prox == behav (fresh samples): every variant is the same PPO-clip objective
    values = [
        float(loss.policy_objective(_inputs([1.5, 0.5, 1.0], [1.0, 1.0, 1.0], 1.0), objective)[0].detach())
        for objective in (PLAIN, DECOUPLED, TIS)
    ]
    assert values == pytest.approx([values[0]] * 3)
    assert math.isfinite(values[0])


def _teacher_inputs(num_tokens=5.0, theta_over_behav=((1.0, 1.0, 1.0), (1.0, 1.0, 1.0))):
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.5, -4.0]], requires_grad=True)
    teacher = torch.tensor([[-1.5, -1.0, -0.5], [-0.8, -3.5, 0.0]])  # row 1 token 2: padding
    inputs = loss.LossInputs(
        logprobs=logprobs,
        proximal_logprobs=logprobs.detach(),
        behaviour_logprobs=logprobs.detach() - torch.log(torch.tensor(theta_over_behav)),
        advantages=torch.zeros(2, 3),
        mask=torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]),
        batch=aggregation.BatchInfo(tokens=num_tokens, sequences=2.0),
    )
    return inputs, teacher


def test_teacher_kl_value_is_the_masked_mean_log_ratio_times_the_coefficient():
    # fresh samples (pi_behav = pi_theta, w = 1); delta = logp - teacher = [[.5, -1, 0], [.5, 2, (-4 masked)]]
    # value = klCoef 2 * 2.0 / 5 = 0.8; teacher_kl = 2.0 / 5 = 0.4
    inputs, teacher = _teacher_inputs()
    value, metrics = loss.teacher_kl_loss(inputs, teacher, 2.0, 2.0)
    assert float(value.detach()) == pytest.approx(0.8, abs=1e-6)
    assert metrics["teacher_kl"] == pytest.approx(0.4, abs=1e-6)


def test_teacher_kl_gradient_is_the_log_ratio_less_its_mean_times_the_score():
    # baseline b = mean delta = 0.4; d/dlogp_t = klCoef * mask_t * (delta_t - b) / num_tokens
    # = 2/5 * [[0.1, -1.4, -0.4], [0.1, 1.6, 0]]: tokens the policy likes more than the teacher (relative
    # to the batch) are pushed down, the others up; padding gets nothing
    inputs, teacher = _teacher_inputs()
    value, _ = loss.teacher_kl_loss(inputs, teacher, 2.0, 2.0)
    value.backward()
    assert inputs.logprobs.grad.tolist() == [
        pytest.approx([0.04, -0.56, -0.16], abs=1e-6),
        pytest.approx([0.04, 0.64, 0.0], abs=1e-6),
    ]


def test_teacher_kl_is_normalised_by_the_global_token_count():
    # another rank holds 5 more tokens: value 2 * 2.0 / 10 = 0.4; the metric stays this rank's mean 0.4
    inputs, teacher = _teacher_inputs(num_tokens=10.0)
    value, metrics = loss.teacher_kl_loss(inputs, teacher, 2.0, 2.0)
    assert float(value.detach()) == pytest.approx(0.4, abs=1e-6)
    assert metrics["teacher_kl"] == pytest.approx(0.4, abs=1e-6)


def test_teacher_kl_of_stale_samples_is_weighted_by_the_truncated_importance_ratio():
    # pi_theta / pi_behav = [[0.5, 3 -> cap 2, 1], [1, 1, 1]]; w * delta = [[0.25, -2.0, 0], [0.5, 2.0, -]]
    # value = 2 * 0.75 / 5 = 0.3; grad = 2/5 * w * (delta - 0.4) = 2/5 * [[0.05, -2.8, -0.4], [0.1, 1.6, -]];
    # the metric stays the unweighted mean delta 0.4
    inputs, teacher = _teacher_inputs(theta_over_behav=((0.5, 3.0, 1.0), (1.0, 1.0, 1.0)))
    value, metrics = loss.teacher_kl_loss(inputs, teacher, 2.0, 2.0)
    value.backward()
    assert float(value.detach()) == pytest.approx(0.3, abs=1e-6)
    assert inputs.logprobs.grad.tolist() == [
        pytest.approx([0.02, -1.12, -0.16], abs=1e-6),
        pytest.approx([0.04, 0.64, 0.0], abs=1e-6),
    ]
    assert metrics["teacher_kl"] == pytest.approx(0.4, abs=1e-6)
    assert metrics["teacher_is_weight_mean"] == pytest.approx(1.1, abs=1e-6)


def test_teacher_kl_is_zero_where_the_policy_matches_the_teacher():
    inputs, _ = _teacher_inputs()
    value, metrics = loss.teacher_kl_loss(inputs, inputs.logprobs.detach(), 2.0, 2.0)
    value.backward()
    assert float(value.detach()) == 0.0 and metrics["teacher_kl"] == 0.0
    assert inputs.logprobs.grad.abs().sum().item() == 0.0
