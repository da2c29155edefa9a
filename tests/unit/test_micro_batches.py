"""The trainer's micro-batch split (trainer/backend.py ``micro_batches``): pure bookkeeping, no model.

That the split changes no gradient is proven on a real FSDP2 step, one and two ranks, in
tests/dataplane/test_trainer.py.
"""

from __future__ import annotations

import math
import random

import pytest
from asyncrl_workloads.bus import trajectory
from asyncrl_workloads.trainer import backend


def _traj(i: int, prompt: int, response: int) -> trajectory.Trajectory:
    return trajectory.Trajectory(
        id=f"t{i}", job="j", replica=0, group_id="g", group_size=1, sample_index=0,
        prompt_ids=[1] * prompt, response_ids=[5] * response, behaviour_logprobs=[-1.0] * response,
        versions=[0] * response, mask=[1] * response, reward=0.0, created_at=0.0,
    )  # fmt: skip


def _length(t: trajectory.Trajectory) -> int:
    return len(t.prompt_ids) + len(t.response_ids)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_micro_batches_are_length_sorted_full_within_budget_and_keep_every_sample(world):
    rng = random.Random(3)
    trajs = [_traj(i, 10, rng.choice([2, 5, 40, 90, 250])) for i in range(64)]
    micros = backend.micro_batches(trajs, 1024, world)
    assert sorted(t.id for m in micros for t in m) == sorted(t.id for t in trajs)
    lengths = [_length(t) for m in micros for t in m]
    assert lengths == sorted(lengths, reverse=True)
    for m in micros:  # rows per rank x the longest row (the first: sorted) fits the budget
        assert math.ceil(len(m) / world) * _length(m[0]) <= 1024
    for m in micros[:-1]:  # and a micro-batch closes only when one more row would not fit
        assert math.ceil((len(m) + 1) / world) * _length(m[0]) > 1024
    assert micros == backend.micro_batches(list(trajs), 1024, world)  # the same split on every rank


def test_sorted_micro_batches_pad_far_less_than_one_padded_batch():
    rng = random.Random(4)
    trajs = [_traj(i, 30, min(256, 1 + int(rng.expovariate(1 / 80)))) for i in range(64)]
    micros = backend.micro_batches(trajs, 1024, 1)
    padded = sum(len(m) * _length(m[0]) for m in micros)
    real = sum(_length(t) for t in trajs)
    # one padded batch: 64 x 286 = 18304 positions for 6533 real tokens; 8 sorted micro-batches: 7303
    assert len(micros) > 1
    assert padded < 1.2 * real < 0.5 * 64 * max(_length(t) for t in trajs)


def test_a_sequence_longer_than_the_budget_gets_a_micro_batch_of_its_own():
    long, short = _traj(0, 10, 2000), _traj(1, 10, 5)
    assert backend.micro_batches([short, long], 1024, 1) == [[long], [short]]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_packed_micro_batches_count_each_ranks_real_tokens(world):
    # spec.trainer.memory.packing: every rank's rows (rank::world) hold at most the budget in real tokens
    rng = random.Random(5)
    trajs = [_traj(i, 30, min(256, 1 + int(rng.expovariate(1 / 80)))) for i in range(64)]
    micros = backend.micro_batches(trajs, 1024, world, packed=True)
    assert sorted(t.id for m in micros for t in m) == sorted(t.id for t in trajs)

    def fullest(rows: list[trajectory.Trajectory]) -> int:
        return max(sum(_length(t) for t in rows[r::world]) for r in range(world))

    assert all(fullest(m) <= 1024 for m in micros)
    assert all(fullest([*m, nxt[0]]) > 1024 for m, nxt in zip(micros, micros[1:], strict=False))
    # never more forwards than padded micro-batches of the same budget (a rank's real tokens never
    # exceed its rows x the longest)
    assert len(micros) <= len(backend.micro_batches(trajs, 1024, world))
