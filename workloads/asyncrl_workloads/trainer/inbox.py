"""Trainer rank 0's intake: pull from the bus, drop what may not be trained, hand out whole batches.

Called by trainer/loop.py once per step (`next_batch`), for the samples of a chosen batch the teacher
gave no logprobs for (`drop_reward_errors`), and after each step (`ack`). For every pulled message, in
order:

1. undecodable or malformed -> acked, counted dropped{reason=invalid};
2. id already in the ledger (a redelivery of a sample trained or dropped before a crash) -> acked,
   not counted again, never trained;
3. staleness > maxStaleness -> acked, counted dropped{reason=stale}; from a future version -> invalid;
4. otherwise held in the group batcher (unacked) until its group is complete.

When the held groups already make a batch, one short pull (`sweep_timeout_s`) first takes in what was
published since, so the batcher can serve the oldest groups first (trainer/batcher.py): a straggler
of an old version gets into this step instead of going stale behind newer groups.

Staleness is judged again when a batch is taken, because versions advance while a group waits; so no
sample older than maxStaleness versions ever reaches a step. Drops are written to the ledger before
they are acked (a crash in between cannot count them twice).

Dynamic sampling (DAPO, Yu et al. 2025, arXiv 2503.14476; verl's algorithm.filter_groups; on with
spec.trainer.algorithm.dynamicSampling): a ready group whose samples within the staleness bound all
have exactly the same reward (`zero_variance`) carries no group-relative signal. As a batch is taken,
the equal-reward groups it would reach are removed instead (`GroupBatcher.take_screened`), recorded,
acked and counted dropped{reason=zero_variance} (a member past the bound as stale), and the batch is
filled with the ready groups after them, or waits for more from the bus. At most
`max_zero_variance_drops` groups are dropped per step; once reached, further equal-reward groups train
(with zero group advantage) and are counted as kept (`step_zero_variance`, the ledger's
`zero_variance_kept`), so a task the model always solves or always fails cannot stall training. A
redelivered dropped sample is acked as seen (step 2), like a trained one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterable, Sequence

from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.bus import jetstream
from asyncrl_workloads.bus import trajectory as trajectory_mod
from asyncrl_workloads.trainer import batcher as batcher_mod
from asyncrl_workloads.trainer import checkpoint, staleness

log = logging.getLogger(__name__)
_Members = list[tuple[trajectory_mod.Trajectory, jetstream.Received]]


@dataclasses.dataclass(frozen=True)
class Taken:
    trajectory: trajectory_mod.Trajectory
    received: jetstream.Received
    staleness: int


class Inbox:
    def __init__(
        self,
        consumer: jetstream.Consumer,
        stale_filter: staleness.StalenessFilter,
        batcher: batcher_mod.GroupBatcher[jetstream.Received],
        ledger: checkpoint.Ledger,
        metrics: metrics_mod.Bound,
        fetch_batch: int = 256,
        fetch_timeout_s: float = 0.5,
        sweep_timeout_s: float = 0.01,
        max_zero_variance_drops: int | None = None,
    ) -> None:
        self.consumer = consumer
        self.filter = stale_filter
        self.batcher = batcher
        self.ledger = ledger
        self.metrics = metrics
        self.fetch_batch = fetch_batch
        self.fetch_timeout_s = fetch_timeout_s
        self.sweep_timeout_s = sweep_timeout_s
        self.redeliveries_skipped = 0
        self.dropped_stale_tokens = 0
        """Response tokens of the samples dropped as stale by this process (generation wasted)."""
        self.max_zero_variance_drops = max_zero_variance_drops
        """spec.trainer.algorithm.dynamicSampling.maxDropsPerStep; None: dynamic sampling off."""
        self.zero_variance_dropped = 0
        """Equal-reward groups dropped for the batch being gathered (reset when it is handed out)."""
        self.step_zero_variance = (0, 0)
        """(groups dropped, equal-reward groups kept at the bound) of the batch handed out last."""
        if ledger.lost_at_load:
            log.warning(
                "bus: the last trainer process ended holding %d samples of a stream that is gone "
                "(NATS came back without its store): counted lost with it",
                ledger.lost_at_load,
            )
            self.metrics.dropped["store_lost"].inc(ledger.lost_at_load)
            ledger.lost_at_load = 0
            ledger.save()  # counted once: a second restart must not find them again

    def elsewhere(self, received: Iterable[jetstream.Received]) -> int:
        """How many of `received` came from a bus stream the ledger has left (NATS lost its store)."""
        return sum(1 for r in received if r.stream in self.ledger.streams_left)

    async def next_batch(self, version: int, stop: asyncio.Event, wait_s: float) -> list[Taken] | None:
        """The next step's samples (all within the staleness bound); [] if none within `wait_s`; None
        once `stop` is set. Never cancelled mid-fetch: a cancelled pull could strand delivered messages
        until the server's ack_wait."""
        deadline = time.monotonic() + wait_s
        swept = False
        while not stop.is_set():
            if time.monotonic() > deadline:
                return []
            if not swept and self.batcher.has_batch():
                swept = True  # costs at most sweep_timeout_s, and only when the bus is empty
                await self._sort(await self.consumer.fetch(self.fetch_batch, self.sweep_timeout_s), version)
            equal, groups = self.batcher.take_screened(
                lambda group: self._zero_variance(version, group), self._drops_left()
            )
            await self._drop_zero_variance(version, equal)
            if groups is not None:
                kept_at_bound = [g for g in groups if self._zero_variance(version, g)]
                kept: list[Taken] = []
                stale: list[jetstream.Received] = []
                future: list[jetstream.Received] = []
                for group in groups:
                    for traj, received in group:
                        verdict, lag = self.filter.judge(version, traj)
                        if verdict is staleness.Verdict.KEEP:
                            kept.append(Taken(traj, received, lag))
                        else:
                            (stale if verdict is staleness.Verdict.STALE else future).append(received)
                await self._drop(stale, future)
                if kept:
                    self._handed_out(version, kept_at_bound)
                    return kept
                continue
            await self._sort(await self.consumer.fetch(self.fetch_batch, self.fetch_timeout_s), version)
        return None

    def follow_stream(self, created: str, queued: int | None = None) -> None:
        """Tell the ledger which bus stream the trainer pulls from or looked at (`Ledger.follow_stream`);
        a stream created again (NATS came back without its store) is logged, and what the old one
        held is counted dropped{reason=store_lost}."""
        if queued is None and created == self.ledger.stream_created:
            return  # the fetch path's common case: nothing to count
        held_elsewhere = sum(1 for r in self.batcher.handles() if r.stream != created)
        lost = self.ledger.follow_stream(created, queued, held_elsewhere)
        if lost is not None:
            log.warning(
                "bus: the trajectory stream was created again (NATS came back without its store): "
                "%d queued samples lost with it, at least",
                lost,
            )
            self.metrics.dropped["store_lost"].inc(lost)
            self.ledger.save()  # at once: a restart before the next step must not count them again

    async def _sort(self, received: list[jetstream.Received], version: int) -> None:
        if received:  # before any of them is recorded or acked
            self.follow_stream(self.consumer.stream_created)
        stale: list[jetstream.Received] = []
        invalid: list[jetstream.Received] = []
        for rec in received:
            traj = rec.trajectory
            if traj is None:
                invalid.append(rec)
                continue
            if self.ledger.seen(traj.id):
                self.redeliveries_skipped += 1
                await self.consumer.ack(rec)
                continue
            verdict, _ = self.filter.judge(version, traj)
            if verdict is staleness.Verdict.KEEP:
                if not self.batcher.add(traj, rec):
                    self._redelivered_while_held(traj, rec)
            else:
                self.batcher.note_dropped(traj)
                (stale if verdict is staleness.Verdict.STALE else invalid).append(rec)
        await self._drop(stale, invalid)

    def _redelivered_while_held(self, traj: trajectory_mod.Trajectory, rec: jetstream.Received) -> None:
        """Another copy of a held sample: normally the same message delivered again, acked later through
        the held one. If the held copy came from a stream that is gone (NATS lost its store) and this
        one from the current stream (the rollout published it again, unanswered at the loss), the held
        copy can no longer be acked, so this one is held instead: left unacked it would come back after
        ack_wait, when the ledger may have forgotten the id, and be trained twice."""
        held = self.batcher.handle_of(traj)
        if held is not None and held.stream != rec.stream == self.consumer.stream_created:
            self.batcher.replace(traj, rec)
            self.ledger.old_copy_replaced()

    async def drop_reward_errors(self, received: list[jetstream.Received]) -> None:
        """Samples of a chosen batch the teacher gave no logprobs for: recorded, acked, counted
        dropped{reason=reward_error} (trainer/teacher.py); their group trains without them."""
        self.ledger.record_drops(
            [],
            [],
            elsewhere=self.elsewhere(received),
            reward_error_ids=[r.trajectory.id for r in received if r.trajectory is not None],
        )
        for rec in received:
            await self.consumer.ack(rec)
        self.metrics.dropped["reward_error"].inc(len(received))

    def _zero_variance(self, version: int, group: _Members) -> bool:
        """Dynamic sampling is on and the samples of `group` a step would train now (those within the
        staleness bound) all have the same reward."""
        if self.max_zero_variance_drops is None:
            return False
        keep = staleness.Verdict.KEEP
        return zero_variance([t for t, _ in group if self.filter.verdict(version, t)[0] is keep])

    def _drops_left(self) -> int:
        """Equal-reward groups the batch being gathered may still drop (0 with dynamic sampling off)."""
        if self.max_zero_variance_drops is None:
            return 0
        return self.max_zero_variance_drops - self.zero_variance_dropped

    async def _drop_zero_variance(self, version: int, groups: list[_Members]) -> None:
        """Record, ack and count the equal-reward groups the batcher removed for this step."""
        if not groups:
            return
        self.zero_variance_dropped += len(groups)
        equal: list[jetstream.Received] = []
        stale: list[jetstream.Received] = []
        future: list[jetstream.Received] = []
        for group in groups:  # a member past the bound is dropped as stale, as at `take_batch`
            for traj, received in group:
                verdict, _ = self.filter.judge(version, traj)
                if verdict is staleness.Verdict.KEEP:
                    equal.append(received)
                else:
                    (stale if verdict is staleness.Verdict.STALE else future).append(received)
        await self._drop(stale, future, equal)

    def _handed_out(self, version: int, kept_at_bound: list[_Members]) -> None:
        """A batch leaves the inbox: note its dynamic-sampling counts and start the next step's bound.
        The ledger's kept count is saved with the step (`Ledger.record_step`)."""
        self.step_zero_variance = (self.zero_variance_dropped, len(kept_at_bound))
        self.zero_variance_dropped = 0
        keep = staleness.Verdict.KEEP
        self.ledger.zero_variance_kept += sum(
            1 for g in kept_at_bound for t, _ in g if self.filter.verdict(version, t)[0] is keep
        )

    async def _drop(
        self,
        stale: list[jetstream.Received],
        invalid: list[jetstream.Received],
        zero_variance: Sequence[jetstream.Received] = (),
    ) -> None:
        if not stale and not invalid and not zero_variance:
            return
        self.ledger.record_drops(
            [r.trajectory.id for r in stale if r.trajectory is not None],
            [r.trajectory.id for r in invalid if r.trajectory is not None],
            undecodable=sum(1 for r in invalid if r.trajectory is None),
            elsewhere=self.elsewhere([*stale, *invalid, *zero_variance]),
            zero_variance_ids=[r.trajectory.id for r in zero_variance if r.trajectory is not None],
        )
        for rec in [*stale, *invalid, *zero_variance]:
            await self.consumer.ack(rec)
        self.metrics.dropped["stale"].inc(len(stale))
        self.metrics.dropped["invalid"].inc(len(invalid))
        self.metrics.dropped["zero_variance"].inc(len(zero_variance))
        stale_tokens = _response_tokens(stale)
        self.dropped_stale_tokens += stale_tokens
        self.metrics.tokens_dropped["stale"].inc(stale_tokens)
        self.metrics.tokens_dropped["invalid"].inc(_response_tokens(invalid))


def zero_variance(group: Sequence[trajectory_mod.Trajectory]) -> bool:
    """Whether the samples of one prompt group (at least one) all have exactly the same reward: every
    group-relative advantage (grpo, rloo, reinforce++-baseline) is then 0 and the group adds nothing to
    the policy gradient."""
    return bool(group) and all(t.reward == group[0].reward for t in group)


def _response_tokens(received: list[jetstream.Received]) -> int:
    return sum(len(r.trajectory.response_ids) for r in received if r.trajectory is not None)
