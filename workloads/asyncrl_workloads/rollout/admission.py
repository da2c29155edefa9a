"""The rollout worker's admission rule: how many prompt groups a replica may have started so far.

Called by ``rollout/worker.py``: its generation loop asks ``may_start`` before each group, calls
``started`` when it starts one and ``stalled`` while it waits with nothing in flight; its control
loop hands over each plan (``joined`` when the plan includes this replica, ``left_out`` when not),
reports each loaded version (``version_loaded``) and closes admission while a ``partialRollout:
false`` update lets in-flight groups finish (``close``/``reopen``). Pure bookkeeping: no clock, no
I/O, no asyncio (the caller passes the time), so unit tests drive it directly.

One admission rule serves all three modes (so async and sync runs compare like with like): a
replica may have started at most ``(versions loaded + maxStaleness + 1) x per-replica batch`` groups
since it started (AReaL's bound). In ``sync`` (maxStaleness 0) that means: generate one batch,
then wait for the next version; ``one-step-off`` (1) runs one batch ahead, ``async`` (k) k ahead.
The per-replica batch is this replica's share of the groups the trainer consumes per version,
``ceil(groupsPerVersion / replicas)``; replicas is the count the latest plan that includes this
replica says are registered (a catch-up plan names only the late replicas as candidates but
registers all of them), and ``replicas`` from the settings until a plan arrives. When the share
changes, the bound is recounted at the new share but never below the groups already started.

If no new version arrives for ``stall_release_s`` while admission is closed and nothing is in
flight, one more batch is admitted (the trainer may be short of samples because a replica died;
samples of the current version are never stale).

A replica left out of a plan that would leave it more than maxStaleness versions behind pauses
(its samples would only be dropped as stale) until it loads a version.
"""

from __future__ import annotations

import math

from asyncrl_workloads.weightsync import base


class Admission:
    """One replica's admission state; every count is since the worker started."""

    def __init__(
        self, max_staleness: int, groups_per_version: int, replicas: int, stall_release_s: float
    ) -> None:
        self.max_staleness = max_staleness
        self.groups_per_version = groups_per_version
        self.stall_release_s = stall_release_s
        self.members = replicas
        """Replicas that share each version's groups (from the latest plan that includes this one)."""
        self.loaded = 0
        """Versions loaded (weight updates applied)."""
        self.extra_batches = 0
        """Batches admitted by stall releases."""
        self.groups_started = 0
        self._floor = 0
        """Groups added to the bound when the share shrank (``joined``): never below what was started."""
        self.open = True
        """False while a ``partialRollout: false`` update waits for in-flight groups to finish."""
        self.behind = False
        """A plan without this replica left it more than maxStaleness versions behind."""
        self._blocked_since: float | None = None
        self._blocked_version = -1

    def per_replica(self) -> int:
        """This replica's share of the groups the trainer consumes per version."""
        return max(1, math.ceil(self.groups_per_version / max(1, self.members)))

    def allowed(self) -> int:
        """Groups this replica may have started so far (AReaL's bound plus stall releases)."""
        versions = self.loaded + self.max_staleness + 1 + self.extra_batches
        return self._floor + versions * self.per_replica()

    def may_start(self) -> bool:
        return self.open and not self.behind and self.groups_started < self.allowed()

    def started(self) -> None:
        """A group was started: count it; the stall clock starts again next time admission closes."""
        self.groups_started += 1
        self._blocked_since = None

    def stalled(self, version: int, now: float) -> bool:
        """Called while nothing is in flight and no group starts. Admission closed by the bound (not
        by a drain) at the same engine ``version`` for more than ``stall_release_s``: admit one more
        batch and return True (once per release; the clock then starts again)."""
        if not self.open or self.may_start():
            return False
        if self._blocked_since is None or self._blocked_version != version:
            self._blocked_since, self._blocked_version = now, version
            return False
        if now - self._blocked_since > self.stall_release_s:
            self.extra_batches += 1
            self._blocked_since = None
            return True
        return False

    def joined(self, plan: base.Plan) -> None:
        """A plan includes this replica: take the share it implies. The bound is recounted at the new
        share but never below the groups already started: a share that shrank (a second replica
        registered after this one ran ahead under a trainer that ate its backlog) must not strand
        this replica until stall releases repay the difference; from here each version adds the new
        share."""
        self.members = plan.registered or len(plan.candidates)
        self._floor = 0
        self._floor = max(0, self.groups_started - self.allowed())

    def left_out(self, plan: base.Plan, version: int) -> bool:
        """A plan leaves this replica out while it holds ``version``: pause generation if the plan's
        version is more than maxStaleness ahead. Returns whether generation is paused."""
        self.behind = plan.version - version > self.max_staleness
        return self.behind

    def version_loaded(self) -> None:
        """A weight update was applied: one more version's batch may start; a pause for being
        behind ends."""
        self.behind = False
        self.loaded += 1

    def close(self) -> None:
        self.open = False

    def reopen(self) -> None:
        self.open = True
