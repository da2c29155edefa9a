"""A group's published samples agree on its size, even when some samples are skipped.

The trainer's batcher releases a group only when `group_size` distinct members arrived; a sample the
rollout skips (empty completion, reward function raising) must not be counted in `group_size`, or
the trainer waits for a member that never comes. The engine here is a stand-in returning fixed
completions: what is under test is the worker's grouping, not vLLM (the e2e tests run vLLM).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.bus import trajectory as trajectory_mod
from asyncrl_workloads.rollout import engine as engine_mod
from asyncrl_workloads.rollout import worker as worker_mod


class FixedEngine:
    def __init__(self, completions: list[engine_mod.Completion]) -> None:
        self.completions = completions

    def sampling(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def generate(self, prompt_ids: Sequence[int], params: Any) -> list[engine_mod.Completion]:
        return self.completions


def completion(text: str) -> engine_mod.Completion:
    ids = [ord(ch) for ch in text]
    return engine_mod.Completion(ids, [-0.5] * len(ids), [0] * len(ids), "stop", text)


def reward(record: Mapping[str, Any], response: str) -> float:
    if response == "boom":
        raise RuntimeError("reward function bug")
    return 1.0 if response == "a" else 0.0


def run_group(completions: list[engine_mod.Completion]) -> list[trajectory_mod.Trajectory]:
    published: list[trajectory_mod.Trajectory] = []

    async def publish(traj: trajectory_mod.Trajectory) -> bool:
        trajectory_mod.validate(traj)
        published.append(traj)
        return True

    settings = worker_mod.WorkerSettings(job="j", replica=0, n=len(completions), max_tokens=4)
    metrics = metrics_mod.bind(metrics_mod.Identity(namespace="ns", job="j", role="rollout", replica="0"))
    worker = worker_mod.RolloutWorker(
        settings, FixedEngine(completions), None, publish, reward, [{"prompt": "say a"}],  # type: ignore[arg-type]
        lambda text: [ord(ch) for ch in text], metrics,
    )  # fmt: skip
    asyncio.run(worker._group(0, {"prompt": "say a"}))
    assert worker.failure is None
    return published


def test_skipped_samples_are_not_counted_in_the_group_size() -> None:
    published = run_group([completion("a"), completion(""), completion("boom"), completion("b")])
    assert [t.group_size for t in published] == [2, 2]
    assert sorted(t.sample_index for t in published) == [0, 1]
    assert [t.reward for t in published] == [1.0, 0.0]


def test_trajectory_ids_stay_tied_to_the_engine_sample_index() -> None:
    first = run_group([completion("a"), completion(""), completion("b")])
    again = run_group([completion("a"), completion(""), completion("b")])
    assert [t.id for t in first] == [t.id for t in again]
    assert first[1].id.endswith(":s2:a0")  # the third engine sample, although it is the second kept one


def test_a_full_group_keeps_every_sample() -> None:
    published = run_group([completion("a"), completion("b"), completion("c")])
    assert [(t.sample_index, t.group_size) for t in published] == [(0, 3), (1, 3), (2, 3)]
