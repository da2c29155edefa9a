"""Groups trajectories by prompt and releases whole groups as training batches.

Called by trainer/loop.py (rank 0 only). GRPO normalises rewards within a prompt's group, so the
batcher holds samples until their group is complete: every one of `group_size` samples has either
arrived or been dropped by the staleness filter. Samples the queue discarded (dropOldest) never
arrive, so a group that has waited `group_timeout_s` since its first sample is released with what it
has. A step takes `prompts_per_step` groups (spec.trainer.batch.prompts * spec.async.requireBatches).

Ready groups are served earliest deadline first: by the oldest policy version among their samples,
then by arrival. A group's deadline is that version + maxStaleness (after it, the staleness filter
drops it), and a long-tailed group started early finishes after groups started later; served in
arrival order it would miss its deadline behind them and its generation would be wasted.

`take_screened` first removes the ready groups the caller does not want in the step (trainer/inbox.py's
dynamic sampling: groups whose rewards are all equal), among those the batch would reach, so the
batch is filled with the groups after them.

`H` is the caller's handle for acknowledging a sample (a NATS message); the batcher never acks.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from asyncrl_workloads.bus import trajectory as trajectory_mod

H = TypeVar("H")
_Members = list[tuple[trajectory_mod.Trajectory, H]]
"""A group's held samples with their handles, in arrival order."""


@dataclasses.dataclass
class _Group(Generic[H]):
    size: int
    first_seen: float
    members: list[tuple[trajectory_mod.Trajectory, H]] = dataclasses.field(default_factory=list)
    sample_indices: set[int] = dataclasses.field(default_factory=set)
    dropped: int = 0

    def complete(self) -> bool:
        return len(self.members) + self.dropped >= self.size


class GroupBatcher(Generic[H]):
    def __init__(
        self, prompts_per_step: int, group_timeout_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.prompts_per_step = prompts_per_step
        self.group_timeout_s = group_timeout_s
        self._clock = clock
        self._groups: dict[str, _Group[H]] = {}

    def _group(self, traj: trajectory_mod.Trajectory) -> _Group[H]:
        group = self._groups.get(traj.group_id)
        if group is None:
            group = _Group(size=traj.group_size, first_seen=self._clock())
            self._groups[traj.group_id] = group
        return group

    def add(self, traj: trajectory_mod.Trajectory, handle: H) -> bool:
        """Hold a kept sample. False if this sample index of the group is already held (a redelivery)."""
        group = self._group(traj)
        if traj.sample_index in group.sample_indices:
            return False
        group.sample_indices.add(traj.sample_index)
        group.members.append((traj, handle))
        return True

    def handle_of(self, traj: trajectory_mod.Trajectory) -> H | None:
        """The handle held for this sample of its group, if any."""
        group = self._groups.get(traj.group_id)
        members = group.members if group is not None else []
        return next((h for t, h in members if t.sample_index == traj.sample_index), None)

    def replace(self, traj: trajectory_mod.Trajectory, handle: H) -> None:
        """Hold this copy of an already held sample instead of the one held (its handle is the one to
        ack now)."""
        group = self._groups[traj.group_id]
        group.members = [
            (traj, handle) if t.sample_index == traj.sample_index else (t, h) for t, h in group.members
        ]

    def note_dropped(self, traj: trajectory_mod.Trajectory) -> None:
        """A member of the group was dropped (stale): the group need not wait for it."""
        group = self._group(traj)
        if traj.sample_index not in group.sample_indices:
            group.sample_indices.add(traj.sample_index)
            group.dropped += 1
        if not group.members and group.complete():
            del self._groups[traj.group_id]

    def held(self) -> int:
        return sum(len(g.members) for g in self._groups.values())

    def handles(self) -> list[H]:
        """Handles of every held sample (the trainer's unacked messages)."""
        return [h for g in self._groups.values() for _, h in g.members]

    def _ready_ids(self) -> list[str]:
        now = self._clock()
        for gid in [
            gid
            for gid, g in self._groups.items()
            if not g.members and now - g.first_seen >= self.group_timeout_s
        ]:
            del self._groups[gid]  # every sample that arrived was stale; the rest were discarded
        ready = [
            gid
            for gid, g in self._groups.items()
            if g.members and (g.complete() or now - g.first_seen >= self.group_timeout_s)
        ]
        ready.sort(key=lambda gid: min(t.oldest_version for t, _ in self._groups[gid].members))
        return ready  # stable sort: equal versions stay in arrival order (the dict's order)

    def has_batch(self) -> bool:
        """Whether `take_batch` would return a batch now."""
        return len(self._ready_ids()) >= self.prompts_per_step

    def take_batch(self) -> list[_Members[H]] | None:
        """`prompts_per_step` ready groups (earliest deadline first), removed from the batcher; None if
        too few."""
        return self.take_screened(lambda members: False, 0)[1]

    def take_screened(
        self, unwanted: Callable[[_Members[H]], bool], limit: int
    ) -> tuple[list[_Members[H]], list[_Members[H]] | None]:
        """(removed, batch): walking the ready groups in serving order, remove at most `limit` that
        `unwanted` picks, until `prompts_per_step` others are passed (once `limit` are removed, every
        group is one of those); then take those others as `take_batch` does (None, left held, if too
        few). Groups past the batch are not looked at: they belong to a later step and its limit."""
        removed: list[_Members[H]] = []
        chosen: list[str] = []
        for gid in self._ready_ids():
            if len(chosen) >= self.prompts_per_step:
                break
            if len(removed) < limit and unwanted(self._groups[gid].members):
                removed.append(self._groups.pop(gid).members)
            else:
                chosen.append(gid)
        if len(chosen) < self.prompts_per_step:
            return removed, None
        return removed, [self._groups.pop(gid).members for gid in chosen]
