"""The rollout admission rule (rollout/admission.py): how many groups a replica may have started.

Pure bookkeeping driven directly: no engine, no clock (the tests pass the time). The worker's
loops around it run on real vLLM in tests/dataplane/test_partial_rollout.py and the e2e tests.
"""

from __future__ import annotations

import pytest
from asyncrl_workloads.rollout import admission as admission_mod
from asyncrl_workloads.weightsync import base


def start_all(admission: admission_mod.Admission) -> int:
    """Start groups until admission closes; return how many started."""
    count = 0
    while admission.may_start():
        admission.started()
        count += 1
        assert count < 10_000, "admission never closed"
    return count


def plan(version: int, candidates: list[int], registered: int = 0) -> base.Plan:
    members = tuple(base.Member(replica=r, incarnation=f"i{r}", ranks=1) for r in candidates)
    return base.Plan(
        seq=version, version=version, candidates=members, tensors=(), buckets=(),
        timeout_seconds=1.0, trainer="t", registered=registered,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "max_staleness", "first", "after_one_version"),
    [("sync", 0, 4, 8), ("one-step-off", 1, 8, 12), ("async", 2, 12, 16)],
)
def test_a_replica_starts_at_most_versions_loaded_plus_staleness_plus_one_batches(
    mode: str, max_staleness: int, first: int, after_one_version: int
) -> None:
    # 8 groups per version shared by 2 replicas: a batch of 4 per replica.
    admission = admission_mod.Admission(max_staleness, 8, replicas=2, stall_release_s=20.0)
    assert start_all(admission) == first, mode
    admission.version_loaded()
    assert start_all(admission) == after_one_version - first, mode
    assert admission.groups_started == after_one_version


def test_a_stall_admits_one_more_batch_after_stall_release_s_at_the_same_version() -> None:
    admission = admission_mod.Admission(0, 4, replicas=1, stall_release_s=20.0)
    assert start_all(admission) == 4
    assert not admission.stalled(version=0, now=100.0)  # the stall clock starts
    assert not admission.stalled(version=0, now=120.0)  # not more than stall_release_s yet
    assert admission.stalled(version=0, now=120.5)
    assert start_all(admission) == 4  # one batch, not more
    assert not admission.stalled(version=0, now=121.0)  # the clock starts again
    assert not admission.stalled(version=0, now=140.0)
    assert admission.stalled(version=0, now=141.5)
    assert start_all(admission) == 4


def test_a_new_version_restarts_the_stall_clock() -> None:
    admission = admission_mod.Admission(0, 4, replicas=1, stall_release_s=20.0)
    start_all(admission)
    assert not admission.stalled(version=0, now=0.0)
    assert not admission.stalled(version=1, now=19.0)  # the engine moved on: start again
    assert not admission.stalled(version=1, now=30.0)
    assert admission.stalled(version=1, now=39.5)


def test_no_stall_release_while_admission_is_open_or_closed_for_a_drain() -> None:
    admission = admission_mod.Admission(0, 4, replicas=1, stall_release_s=20.0)
    assert not admission.stalled(version=0, now=0.0)  # groups may still start
    assert not admission.stalled(version=0, now=100.0)
    assert admission.extra_batches == 0
    admission.close()  # partialRollout false: in-flight groups finish under the old weights
    assert not admission.may_start()
    assert not admission.stalled(version=0, now=200.0)
    assert not admission.stalled(version=0, now=300.0)
    admission.reopen()
    assert start_all(admission) == 4 and admission.extra_batches == 0


def test_each_replica_starts_its_share_rounded_up() -> None:
    admission = admission_mod.Admission(0, 8, replicas=3, stall_release_s=20.0)
    assert admission.per_replica() == 3  # ceil(8 / 3) until a plan says who is registered
    assert start_all(admission) == 3
    admission.joined(plan(1, [0, 1, 2, 3]))  # registered unknown (0): the candidates count
    assert admission.per_replica() == 2
    admission.joined(plan(2, [0, 1], registered=3))
    assert admission.per_replica() == 3
    admission.version_loaded()  # the bound now counts batches of the new share: 2 versions x 3
    assert start_all(admission) == 2 * 3 - 3


def test_a_share_that_shrinks_after_running_ahead_does_not_strand_the_replica() -> None:
    # Alone, a replica ran 10 versions ahead of a trainer that then ate its backlog (8 groups each);
    # a second replica registers: the share halves. Recounting all history at 4 per version would
    # put the bound (10 + 3) x 4 = 52 far below the 104 started, and only stall releases (one batch
    # per stall_release_s) would let it start again: minutes with nothing generating.
    admission = admission_mod.Admission(2, 8, replicas=1, stall_release_s=20.0)
    assert start_all(admission) == 24
    for _ in range(10):
        admission.version_loaded()
    assert start_all(admission) == 80
    admission.joined(plan(11, [0, 1], registered=2))
    assert admission.per_replica() == 4
    assert not admission.may_start()  # nothing beyond what it had started
    admission.version_loaded()
    assert start_all(admission) == 4  # each version now adds the new share, at once
    admission.joined(plan(12, [0, 1], registered=2))  # the same share again changes nothing
    admission.version_loaded()
    assert start_all(admission) == 4


def test_a_catch_up_plan_naming_only_late_replicas_keeps_the_share_of_all_registered() -> None:
    admission = admission_mod.Admission(0, 8, replicas=1, stall_release_s=20.0)
    admission.joined(plan(3, [2], registered=4))  # only replica 2 is late; 4 are registered
    assert admission.per_replica() == 2  # not 8: the other three replicas generate too
    admission.version_loaded()
    assert start_all(admission) == 2 * 2


def test_a_replica_left_out_too_far_behind_pauses_until_it_loads_a_version() -> None:
    admission = admission_mod.Admission(1, 4, replicas=1, stall_release_s=20.0)
    assert not admission.left_out(plan(1, [1]), version=0)  # one behind: its samples still count
    assert admission.may_start()
    assert admission.left_out(plan(2, [1]), version=0)  # two behind with maxStaleness 1
    assert not admission.may_start()
    assert start_all(admission) == 0
    admission.version_loaded()
    assert start_all(admission) == (1 + 1 + 1) * 4
