"""DAPO's dynamic sampling in the trainer's intake, no servers: the equal-reward decision, the batcher's
screened take (which groups a step drops, which fill it, the per-step bound) and the ledger's counts.
The intake on a real JetStream is in tests/dataplane/test_bus.py."""

from __future__ import annotations

from asyncrl_workloads.bus import trajectory
from asyncrl_workloads.trainer import batcher, checkpoint, inbox, staleness


def make(group: str, index: int = 0, reward: float = 1.0, size: int = 2, version: int = 5):
    return trajectory.Trajectory(
        id=f"{group}:s{index}",
        job="j",
        replica=0,
        group_id=group,
        group_size=size,
        sample_index=index,
        prompt_ids=[1],
        response_ids=[7],
        behaviour_logprobs=[-1.0],
        versions=[version],
        mask=[1],
        reward=reward,
        created_at=0.0,
    )


def held(groups: dict[str, tuple[float, ...]]) -> batcher.GroupBatcher[str]:
    """A batcher holding complete groups (in this order) with these rewards; handles are the ids."""
    b: batcher.GroupBatcher[str] = batcher.GroupBatcher(
        prompts_per_step=2, group_timeout_s=30, clock=lambda: 0.0
    )
    for group, rewards in groups.items():
        for i, reward in enumerate(rewards):
            traj = make(group, i, reward, size=len(rewards))
            b.add(traj, traj.id)
    return b


def equal(members: list[tuple[trajectory.Trajectory, str]]) -> bool:
    return inbox.zero_variance([t for t, _ in members])


def names(groups):
    return [g[0][0].group_id for g in groups] if groups is not None else None


def test_a_group_has_zero_variance_only_when_every_reward_is_exactly_equal():
    assert inbox.zero_variance([make("g", i, 1.0, size=3) for i in range(3)])
    assert inbox.zero_variance([make("g", 0, 0.0)])  # a lone survivor: its group advantage is 0 too
    assert not inbox.zero_variance([make("g", 0, 1.0), make("g", 1, 0.0)])
    assert not inbox.zero_variance([make("g", 0, 0.5), make("g", 1, 0.5 + 1e-12)])  # no tolerance
    assert not inbox.zero_variance([])  # nothing to train either way: not a zero_variance drop


def test_equal_reward_groups_are_removed_and_the_batch_is_filled_with_the_groups_after_them():
    b = held({"u0": (1.0, 1.0), "v1": (0.0, 1.0), "u2": (0.0, 0.0), "v3": (1.0, 0.0), "v4": (0.0, 1.0)})
    removed, batch = b.take_screened(equal, limit=64)
    assert (names(removed), names(batch)) == (["u0", "u2"], ["v1", "v3"])
    assert names(b.take_batch()) is None and b.held() == 2  # v4 stays for the next step


def test_groups_past_the_batch_are_left_for_a_later_step():
    b = held({"v0": (0.0, 1.0), "v1": (1.0, 0.0), "u2": (1.0, 1.0)})
    removed, batch = b.take_screened(equal, limit=64)
    assert (names(removed), names(batch)) == ([], ["v0", "v1"])
    assert b.held() == 2  # u2 not judged: the next step's bound decides


def test_once_the_step_has_dropped_its_limit_further_equal_reward_groups_go_into_the_batch():
    b = held({"u0": (1.0, 1.0), "u1": (0.0, 0.0), "u2": (1.0, 1.0), "v3": (0.0, 1.0)})
    removed, batch = b.take_screened(equal, limit=1)
    assert (names(removed), names(batch)) == (["u0"], ["u1", "u2"])
    assert b.held() == 2  # v3
    removed, batch = b.take_screened(equal, limit=0)  # a step that has used its bound drops nothing
    assert (removed, names(batch)) == ([], None)


def test_groups_removed_while_too_few_others_are_ready_stay_removed_and_the_others_stay_held():
    b = held({"u0": (1.0, 1.0), "v1": (0.0, 1.0)})
    b.add(make("late", 0, 1.0, size=2), "late:s0")  # incomplete: not ready, not judged
    removed, batch = b.take_screened(equal, limit=64)
    assert (names(removed), batch) == (["u0"], None)
    assert b.held() == 3  # v1 and late wait for more groups
    b.add(make("late", 1, 0.0, size=2), "late:s1")
    assert names(b.take_batch()) == ["v1", "late"]


def test_a_look_ahead_verdict_counts_nothing():
    filt = staleness.StalenessFilter(max_staleness=1)
    assert filt.verdict(8, make("g", version=5)) == (staleness.Verdict.STALE, 3)
    assert (filt.dropped_stale, filt.dropped_future) == (0, 0)
    assert filt.judge(8, make("g", version=5)) == (staleness.Verdict.STALE, 3)
    assert filt.dropped_stale == 1


def test_the_ledger_counts_zero_variance_drops_as_acked_and_remembers_them_across_a_restart(tmp_path):
    path = tmp_path / checkpoint.LEDGER
    ledger = checkpoint.Ledger.load(path)
    ledger.record_drops(["s"], [], zero_variance_ids=["u:s0", "u:s1"])  # saved before the acks
    ledger.zero_variance_kept += 2  # counted at the take, saved with the step
    ledger.record_step(1, 0, ["v:s0", "v:s1", "k:s0", "k:s1"])
    again = checkpoint.Ledger.load(path)
    assert again.seen("u:s0") and again.seen("u:s1")  # a redelivery is acked, never counted again
    assert (again.dropped_zero_variance, again.zero_variance_kept) == (2, 2)
    assert (again.consumed_total, again.dropped_stale, again.acked_total) == (4, 1, 7)
