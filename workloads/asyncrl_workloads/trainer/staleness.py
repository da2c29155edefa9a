"""Bounded staleness: which consumed trajectories may still be trained on.

Called by trainer/loop.py for every trajectory it pulls, before batching. Staleness of a sample is
(docs/weight-sync.md, "The data flow around it"; prime-rl's definition):

    staleness = trainer version at consumption - oldest policy version that produced any of its tokens

A partial rollout whose tokens span versions [v_old, v_new] is judged by v_old. Samples with
staleness > max_staleness are dropped and counted (reason "stale"), never silently used. A sample
from a *future* version (staleness < 0) means a trainer restarted without its ledger or a rollout
announced a version it never received; it is dropped as "invalid".
"""

from __future__ import annotations

import dataclasses
import enum

from asyncrl_workloads.bus import trajectory as trajectory_mod


class Verdict(enum.Enum):
    KEEP = "keep"
    STALE = "stale"
    FUTURE = "invalid"


def staleness(trainer_version: int, traj: trajectory_mod.Trajectory) -> int:
    return trainer_version - traj.oldest_version


@dataclasses.dataclass
class StalenessFilter:
    """Judges samples against the bound and keeps the counts the metrics and the ledger report."""

    max_staleness: int
    kept: int = 0
    """Samples consumed by a step."""
    dropped_stale: int = 0
    dropped_future: int = 0
    max_kept: int = 0
    """Largest staleness ever kept (must never exceed max_staleness)."""

    def judge(self, trainer_version: int, traj: trajectory_mod.Trajectory) -> tuple[Verdict, int]:
        """Verdict for `traj` now; drops are counted here, keeps only when consumed (`consume`)."""
        verdict, lag = self.verdict(trainer_version, traj)
        if verdict is Verdict.FUTURE:
            self.dropped_future += 1
        elif verdict is Verdict.STALE:
            self.dropped_stale += 1
        return verdict, lag

    def verdict(self, trainer_version: int, traj: trajectory_mod.Trajectory) -> tuple[Verdict, int]:
        """`judge`'s verdict without counting it (a look ahead: trainer/inbox.py's dynamic sampling)."""
        lag = staleness(trainer_version, traj)
        if lag < 0:
            return Verdict.FUTURE, lag
        if lag > self.max_staleness:
            return Verdict.STALE, lag
        return Verdict.KEEP, lag

    def consume(self, lag: int) -> None:
        """A kept sample went into a step with this staleness."""
        if not 0 <= lag <= self.max_staleness:
            raise ValueError(f"staleness {lag} outside [0, {self.max_staleness}] reached a step")
        self.kept += 1
        self.max_kept = max(self.max_kept, lag)
