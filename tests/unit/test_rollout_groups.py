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
from asyncrl_workloads.rewards import scorer as scorer_mod
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
        settings, FixedEngine(completions), None, publish, scorer_mod.Scorer(reward), [{"prompt": "say a"}],  # type: ignore[arg-type]
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


class GatedEngine:
    """Prompt "fast" completes at once; every other prompt generates until cancelled."""

    version = 0

    def __init__(self) -> None:
        self.cancelled = 0

    def sampling(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def generate(self, prompt_ids: Sequence[int], params: Any) -> list[engine_mod.Completion]:
        if bytes(prompt_ids) == b"fast":
            return [completion("a"), completion("b")]
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        raise AssertionError("unreachable")


def test_stop_aborts_generating_groups_but_a_group_being_published_goes_out_whole() -> None:
    published: list[trajectory_mod.Trajectory] = []
    publishing = asyncio.Event()
    release = asyncio.Event()

    async def publish(traj: trajectory_mod.Trajectory) -> bool:
        published.append(traj)
        publishing.set()
        await release.wait()  # the bus is slow: the stop arrives mid-group
        return True

    records = [{"prompt": "fast"}, {"prompt": "slow1"}, {"prompt": "slow2"}]
    settings = worker_mod.WorkerSettings(
        job="j", replica=0, n=2, max_tokens=4, max_inflight_prompts=3, poll_s=0.001
    )
    metrics = metrics_mod.bind(metrics_mod.Identity(namespace="ns", job="j", role="rollout", replica="0"))
    engine = GatedEngine()
    worker = worker_mod.RolloutWorker(
        settings, engine, None, publish, scorer_mod.Scorer(reward), records,  # type: ignore[arg-type]
        lambda text: list(text.encode()), metrics,
    )  # fmt: skip
    worker._next_record = iter(records).__next__  # type: ignore[method-assign]

    async def scenario() -> None:
        stop = asyncio.Event()
        run = asyncio.create_task(worker.run(stop))
        await asyncio.wait_for(publishing.wait(), 5)
        while len(worker._inflight) < 3:
            await asyncio.sleep(0.001)
        stop.set()
        await asyncio.sleep(0.05)
        assert not run.done()  # the half-published group holds the stop until it is whole
        release.set()
        await asyncio.wait_for(run, 5)

    asyncio.run(scenario())
    assert engine.cancelled == 2  # both generating groups were aborted, not finished
    assert [(t.group_size, t.sample_index) for t in published] == [(2, 0), (2, 1)]
    assert worker.stats.groups_started == 3 and worker.stats.groups_done == 1
