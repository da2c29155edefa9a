"""Staleness filter, group batcher and the consumed-id ledger: the trainer's bookkeeping, no servers."""

from __future__ import annotations

import pytest
from asyncrl_workloads.bus import trajectory
from asyncrl_workloads.trainer import batcher, checkpoint, staleness


def make(group="g0", index=0, size=2, versions=(5,)):
    n = len(versions)
    return trajectory.Trajectory(
        id=f"{group}:s{index}",
        job="j",
        replica=0,
        group_id=group,
        group_size=size,
        sample_index=index,
        prompt_ids=[1],
        response_ids=[7] * n,
        behaviour_logprobs=[-1.0] * n,
        versions=list(versions),
        mask=[1] * n,
        reward=1.0,
        created_at=0.0,
    )


def test_staleness_is_trainer_version_minus_oldest_token_version():
    filt = staleness.StalenessFilter(max_staleness=2)
    assert filt.judge(5, make(versions=(3, 4, 5))) == (staleness.Verdict.KEEP, 2)
    assert filt.judge(5, make(versions=(2, 5))) == (staleness.Verdict.STALE, 3)
    assert filt.judge(5, make(versions=(6,))) == (staleness.Verdict.FUTURE, -1)
    assert (filt.dropped_stale, filt.dropped_future, filt.kept) == (1, 1, 0)


def test_a_sample_beyond_the_bound_can_never_be_consumed():
    filt = staleness.StalenessFilter(max_staleness=0)
    filt.consume(0)
    with pytest.raises(ValueError, match="outside"):
        filt.consume(1)
    assert (filt.kept, filt.max_kept) == (1, 0)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_batcher_releases_only_complete_groups_oldest_first():
    b = batcher.GroupBatcher(prompts_per_step=1, group_timeout_s=30, clock=Clock())
    b.add(make("g0", 0), "m0")
    b.add(make("g1", 0), "m1")
    assert b.take_batch() is None
    b.add(make("g1", 1), "m2")
    assert [[h for _, h in g] for g in b.take_batch()] == [["m1", "m2"]]
    b.add(make("g0", 1), "m3")
    assert [[h for _, h in g] for g in b.take_batch()] == [["m0", "m3"]]
    assert b.held() == 0


def test_batcher_serves_the_group_with_the_oldest_version_first_then_arrival_order():
    b = batcher.GroupBatcher(prompts_per_step=2, group_timeout_s=30, clock=Clock())
    for group, version in (("new-a", 7), ("new-b", 7), ("old", 5), ("new-c", 7)):
        b.add(make(group, 0, size=1, versions=(version,)), group)
    b.add(make("mixed", 0, size=1, versions=(6, 7)), "mixed")  # judged by its oldest token
    assert b.has_batch()
    assert [[h for _, h in g] for g in b.take_batch()] == [["old"], ["mixed"]]
    assert [[h for _, h in g] for g in b.take_batch()] == [["new-a"], ["new-b"]]
    assert not b.has_batch()


def test_a_stale_member_completes_its_group_and_a_redelivery_is_not_held_twice():
    b = batcher.GroupBatcher(prompts_per_step=1, group_timeout_s=30, clock=Clock())
    assert b.add(make("g0", 0), "m0")
    assert not b.add(make("g0", 0), "m0-again")
    b.note_dropped(make("g0", 1))
    assert [[h for _, h in g] for g in b.take_batch()] == [["m0"]]


def test_a_group_missing_discarded_samples_is_released_after_the_timeout():
    clock = Clock()
    b = batcher.GroupBatcher(prompts_per_step=1, group_timeout_s=30, clock=clock)
    b.add(make("g0", 0, size=4), "m0")
    clock.now = 29.0
    assert b.take_batch() is None
    clock.now = 31.0
    assert [[h for _, h in g] for g in b.take_batch()] == [["m0"]]


def test_ledger_survives_a_restart_and_recognises_trained_and_dropped_ids(tmp_path):
    path = tmp_path / checkpoint.LEDGER
    ledger = checkpoint.Ledger.load(path)
    ledger.record_step(1, 0, ["a", "b"])
    ledger.record_drops(["stale-1"], ["bad-1"], undecodable=2)
    again = checkpoint.Ledger.load(path)
    assert all(again.seen(i) for i in ("a", "b", "stale-1", "bad-1"))
    assert not again.seen("c")
    assert (again.consumed_total, again.dropped_stale, again.dropped_invalid, again.acked_total) == (
        2,
        1,
        3,
        6,
    )
    assert not list(tmp_path.glob(".*.tmp"))


def test_ledger_counts_samples_the_teacher_gave_no_logprobs_for_as_acked_and_seen(tmp_path):
    path = tmp_path / checkpoint.LEDGER
    ledger = checkpoint.Ledger.load(path)
    ledger.record_step(1, 0, ["a"])
    ledger.record_drops([], [], reward_error_ids=["t-1", "t-2"])
    again = checkpoint.Ledger.load(path)
    assert again.seen("t-1") and again.seen("t-2")  # a redelivery is acked, never trained
    assert (again.consumed_total, again.dropped_reward_error, again.acked_total) == (1, 2, 3)


def test_ledger_forgets_old_steps_only_after_the_time_window(tmp_path):
    ledger = checkpoint.Ledger.load(tmp_path / checkpoint.LEDGER, keep_seconds=0.0)
    ledger.keep_steps = 2
    for step in range(1, 5):
        ledger.record_step(step, 0, [f"id{step}"])
    assert [ledger.seen(f"id{s}") for s in range(1, 5)] == [False, False, True, True]
    assert ledger.consumed_total == 4


def test_ledger_counts_a_stream_created_again_from_its_start_and_what_the_old_one_held_as_lost(tmp_path):
    """NATS came back without its store: the trainer finds another stream. Its acks before went to the
    old stream; what that one held at the last look and was not acked since is lost. It survives a
    trainer restart (persisted), and a ledger written before this bookkeeping loads with zeros."""
    path = tmp_path / checkpoint.LEDGER
    ledger = checkpoint.Ledger.load(path)
    assert ledger.follow_stream("t1", queued=0, held_elsewhere=0) is None  # the job's first look
    ledger.record_step(1, 0, ["a", "b", "c"])
    assert ledger.follow_stream("t1", queued=6, held_elsewhere=0) is None  # 6 in it (1 of them held)
    assert ledger.acked_in_stream() == 3
    ledger.record_step(2, 1, ["d"])  # one of the 6 acked since the last look
    again = checkpoint.Ledger.load(path)  # the trainer restarts
    assert (again.stream_created, again.stream_owed) == ("t1", 9)
    # The new process holds nothing of the old stream: 9 owed - 4 acked = 5 lost. It finds the new
    # stream at a fetch (queued unknown); the old stream's queue_full drops are kept apart.
    again.queue_full_current = 7
    assert again.follow_stream("t2", queued=None, held_elsewhere=0) == 5
    assert (again.lost_with_store, again.acked_in_stream()) == (5, 0)
    assert (again.queue_full_earlier, again.queue_full_current) == (7, 0)
    assert again.follow_stream("t2", queued=None, held_elsewhere=0) is None
    # A message of the left stream, still buffered in the client, does not switch back.
    assert again.follow_stream("t1", queued=None, held_elsewhere=0) is None
    assert (again.stream_created, again.lost_with_store, again.queue_full_earlier) == ("t2", 5, 7)
    again.record_step(3, 2, ["f"])
    assert (
        checkpoint.Ledger.load(path).queue_full_earlier,
        checkpoint.Ledger.load(path).lost_with_store,
    ) == (7, 5)
    # The same, in a process still holding 2 messages of the old stream (their acks are not sent).
    ledger.stream_created, ledger.stream_owed = "t1", 9
    assert ledger.follow_stream("t2", queued=2, held_elsewhere=2) == 3
    assert (ledger.acked_in_stream(), ledger.stream_held_old) == (0, 2)
    ledger.record_step(3, 2, ["e", "n1"], elsewhere=1)  # one held old message and one of the new stream
    assert (ledger.acked_in_stream(), ledger.stream_held_old) == (1, 1)
    assert ledger.follow_stream("t2", queued=1, held_elsewhere=1) is None
    # The trainer dies still holding the other one: nobody delivers it again, its store is gone.
    restarted = checkpoint.Ledger.load(path)
    assert (restarted.lost_at_load, restarted.lost_with_store, restarted.stream_held_old) == (1, 4, 0)
    assert restarted.acked_in_stream() == 1  # the new stream's count goes on unchanged
    restarted.record_step(4, 2, ["n2"])
    assert checkpoint.Ledger.load(path).lost_at_load == 0  # counted once


def test_a_held_old_copy_replaced_by_its_copy_in_the_new_stream_is_neither_lost_nor_acked_twice(tmp_path):
    """A sample held when NATS lost its store and published again by its rollout: the new stream's
    copy is trained instead (trainer/inbox.py), counted once, in the new stream."""
    ledger = checkpoint.Ledger.load(tmp_path / checkpoint.LEDGER)
    ledger.follow_stream("t1", queued=0, held_elsewhere=0)
    ledger.record_step(1, 0, ["a"])
    ledger.follow_stream("t1", queued=1, held_elsewhere=0)  # "b" queued, then pulled and held
    assert ledger.follow_stream("t2", queued=None, held_elsewhere=1) == 0
    ledger.follow_stream("t2", queued=1, held_elsewhere=1)  # the new copy stored, the old one held
    ledger.old_copy_replaced()
    ledger.record_step(2, 0, ["b"])  # the new stream's copy
    assert (ledger.acked_in_stream(), ledger.stream_held_old, ledger.lost_with_store) == (1, 0, 0)
    assert checkpoint.Ledger.load(ledger.path).lost_at_load == 0
    assert ledger.follow_stream("t3", queued=None, held_elsewhere=0) == 0  # "b" was owed once


def test_a_ledger_written_before_the_stream_bookkeeping_loads_with_zeros(tmp_path):
    path = tmp_path / checkpoint.LEDGER
    path.write_text(
        '{"step": 4, "param_version": 4, "acked_total": 7, "consumed_total": 6, "dropped_stale": 1, '
        '"dropped_invalid": 0, "recent": [[4, 0.0, ["x"]]]}'
    )
    ledger = checkpoint.Ledger.load(path)
    assert (ledger.lost_with_store, ledger.stream_created, ledger.acked_in_stream()) == (0, "", 7)
    assert ledger.follow_stream("t1", queued=0, held_elsewhere=0) is None  # adopted: same stream as before
    assert (ledger.acked_in_stream(), ledger.lost_at_load) == (7, 0)


def test_samples_counted_lost_at_a_restart_are_not_counted_again_at_the_next_store_loss(tmp_path):
    """The trainer ends holding 2 samples of a lost stream (counted lost when the next one starts);
    NATS then loses its store once more before the new trainer looks at the stream in between."""
    ledger = checkpoint.Ledger.load(tmp_path / checkpoint.LEDGER)
    ledger.follow_stream("t1", queued=0, held_elsewhere=0)
    ledger.record_step(1, 0, ["a1"])
    ledger.follow_stream("t1", queued=2, held_elsewhere=0)  # a2, a3: pulled, held (half groups)
    assert ledger.follow_stream("t2", queued=None, held_elsewhere=2) == 0
    ledger.record_step(2, 1, ["b1"])
    ledger.follow_stream("t2", queued=3, held_elsewhere=2)
    ledger.record_step(3, 1, ["b2"])  # 2 left queued in t2
    restarted = checkpoint.Ledger.load(ledger.path)
    assert (restarted.lost_at_load, restarted.lost_with_store) == (2, 2)  # a2, a3
    assert restarted.follow_stream("t3", queued=None, held_elsewhere=0) == 2  # t2's 2, not a2, a3 again
    assert restarted.lost_with_store == 4
