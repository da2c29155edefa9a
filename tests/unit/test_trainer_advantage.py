"""trainer/advantage.py: a step's trajectories to per-token advantages (overlong shaping, the KL in the
reward, the estimator, batch normalisation), against numbers worked out by hand."""

from __future__ import annotations

import pytest
import torch
from asyncrl_workloads.bus import trajectory
from asyncrl_workloads.trainer import advantage
from asyncrl_workloads.trainer.algorithms import advantages, shaping


def traj(tid: str, group: str, reward: float, mask: list[int], logprobs: list[float] | None = None):
    n = len(mask)
    return trajectory.Trajectory(
        id=tid,
        job="j",
        replica=0,
        group_id=group,
        group_size=2,
        sample_index=0,
        prompt_ids=[1, 2],
        response_ids=list(range(3, 3 + n)),
        behaviour_logprobs=logprobs or [-1.0] * n,
        versions=[0] * n,
        mask=mask,
        reward=reward,
        created_at=0.0,
    )


def test_overlong_penalty_counts_generated_tokens_not_tool_output():
    # maxTokens 6, buffer 2: expected 4 tokens; "a" generated 5 of its 7 (2 tool tokens): -0.5 * 1.0;
    # "b" generated 3: no penalty. GRPO on [1 - 0.5, 1] -> [-0.7071, 0.7071] on each trained token.
    batch = [traj("a", "g", 1.0, [1, 1, 0, 0, 1, 1, 1]), traj("b", "g", 1.0, [1, 1, 1])]
    settings = advantage.AdvantageSettings(
        overlong=shaping.Overlong(buffer_tokens=2, penalty_factor=1.0, max_tokens=6)
    )
    out = advantage.compute(batch, settings)
    assert out.metrics["overlong_penalty_mean"] == pytest.approx(-0.25)
    assert out.per_sample["a"].tolist() == pytest.approx(
        [-0.70711, -0.70711, 0, 0, -0.70711, -0.70711, -0.70711], abs=1e-4
    )
    assert out.per_sample["b"].tolist() == pytest.approx([0.70711] * 3, abs=1e-4)


def test_kl_in_the_reward_lowers_the_score_of_the_sample_that_left_the_reference():
    # k1 per token = behaviour - reference: "a" 0.5 on each of 2 tokens, "b" 0; coef 0.2 -> scores
    # 1 - 0.2, 1; RLOO on a group of two: A = s_i - s_j -> [-0.2, 0.2]; reward_kl: mean of [0.5, 0]
    batch = [traj("a", "g", 1.0, [1, 1], [-1.0, -1.0]), traj("b", "g", 1.0, [1, 1], [-1.0, -1.0])]
    reference = {"a": torch.tensor([-1.5, -1.5]), "b": torch.tensor([-1.0, -1.0])}
    settings = advantage.AdvantageSettings(estimator="rloo", kl_in_reward=True, kl_estimator="k1")
    out = advantage.compute(batch, settings, reference, kl_coef=0.2)
    assert out.per_sample["a"].tolist() == pytest.approx([-0.2, -0.2])
    assert out.per_sample["b"].tolist() == pytest.approx([0.2, 0.2])
    assert (out.metrics["reward_kl"], out.metrics["kl_coef"]) == (pytest.approx(0.25), 0.2)


def test_batch_normalisation_follows_the_estimator_over_trained_tokens():
    # ppo (batch baseline): scores [2, 0] -> [1, -1] on 1 and 3 tokens; batch mean over the 4 tokens
    # -0.5, centred [1.5, -0.5 x 3], unbiased std sqrt((2.25 + 3 * 0.25) / 3) = 1
    batch = [traj("a", "g", 2.0, [1]), traj("b", "h", 0.0, [1, 1, 1])]
    norm = advantages.BatchNorm(std=True, eps=0.0)
    out = advantage.compute(batch, advantage.AdvantageSettings(estimator="ppo", batch_norm=norm))
    assert out.per_sample["a"].tolist() == pytest.approx([1.5], abs=1e-5)
    assert out.per_sample["b"].tolist() == pytest.approx([-0.5] * 3, abs=1e-5)


def test_gae_uses_the_critics_values_and_returns_its_targets():
    # one sample, 2 tokens, gamma 1, lam 1, reward 1 on the last token, values [0.25, 0.5]:
    # returns [1, 1]; advantages [0.75, 0.5], whitened -> [+0.7071, -0.7071]
    batch = [traj("a", "g", 1.0, [1, 1])]
    out = advantage.compute(
        batch, advantage.AdvantageSettings(estimator="gae"), values={"a": torch.tensor([0.25, 0.5])}
    )
    assert out.returns["a"].tolist() == pytest.approx([1.0, 1.0])
    assert out.per_sample["a"].tolist() == pytest.approx([0.70711, -0.70711], abs=1e-4)
    assert out.metrics["value_mean"] == pytest.approx(0.375)
