"""One rollout replica's side of a weight-update round: load the policy version a plan announces.

Called by ``rollout/worker.py``: its control loop hands each plan that includes this replica to
``Updater.apply`` (after ``Admission.joined``) and keeps the returned record in ``Stats.updates``.
Generation goes on in the worker meanwhile; the updater sees the worker's in-flight groups only to
wait for them (``partialRollout: false``) and to count those that continue under the new weights.

The round, gloo with overlap (``engine.overlapped``): ready -> roster -> prefetch (the engine
workers receive the weights while the engine keeps generating) -> wait until received -> ack ->
[``partialRollout: false``: drain] -> pause -> apply what was received and stamp the version (one
engine round trip) -> resume. Only the reload happens inside the pause.

NCCL, or gloo without overlap: [``partialRollout: false``: drain] -> pause -> ready -> roster ->
update (receive, load, stamp the version) -> resume -> [gloo: wait for the checksum the workers
compute after the load] -> ack. The whole transfer happens inside the pause; hashing does not.

Before the drain (and so before any pause) the round waits for a validation run in progress
(``hold``, rollout/validation.py), so that run's answers all come from one version.

Drain: admission closes and the round waits until the in-flight groups have finished under the old
weights. With ``partialRollout: true`` there is no drain: in-flight requests are frozen by the pause
and continue under the new weights (their tokens then carry several versions).

On failure the engine is always resumed (before the failure is handled: a rejoin is a store round
trip the pause need not include) and admission reopened:

- ``base.EngineUnusable`` (the NCCL path failed mid-load: the weights are half-written) is raised
  to the caller; the worker stops and the replica restarts.
- any other failure (trainer unreachable, transfer failed, a deadline, a checksum mismatch, a
  broken group) keeps the old version and rejoins, so the replica takes part in the next round.
- left out of the roster (the trainer formed the group without this replica): rejoin, as above.

The pause record: ``pause_wait_s`` is how long ``engine.pause()`` itself took (vLLM finishes the
step in flight before it answers, so that time still produced tokens); ``pause_s`` is the time
from when ``engine.pause()`` returned to when ``engine.resume()`` returned, when the engine took no
step. ``asyncrl_rollout_pause_seconds`` observes ``pause_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection

from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.rollout import admission as admission_mod
from asyncrl_workloads.rollout import engine as engine_mod
from asyncrl_workloads.weightsync import base, replica

log = logging.getLogger(__name__)


class Updater:
    """Applies plans to one replica's engine, one round at a time."""

    def __init__(
        self,
        engine: engine_mod.RolloutEngine,
        link: replica.ReplicaLink,
        metrics: metrics_mod.Bound,
        admission: admission_mod.Admission,
        inflight: Collection[asyncio.Task[None]],
        *,
        partial_rollout: bool,
        poll_s: float,
        clock: Callable[[], float] = time.monotonic,
        hold: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.engine, self.link, self.m, self.admission = engine, link, metrics, admission
        self.inflight = inflight
        """The worker's in-flight groups (its live set, not a copy)."""
        self.partial_rollout, self.poll_s, self.clock = partial_rollout, poll_s, clock
        self.hold = hold
        """Awaited before the drain: the replica's validation run, which must end under the old weights."""

    async def apply(self, plan: base.Plan) -> dict[str, float] | None:
        """Run one round for ``plan``; returns its record (times in seconds) once the version is
        loaded, None when it was not (the old version is kept). Raises ``base.EngineUnusable``."""
        record: dict[str, float] = {"version": plan.version}
        try:
            run = self._overlapped if self.engine.overlapped else self._serial
            if not await run(plan, record, self.clock()):
                return None
            self.m.param_version.set(plan.version)
            self.m.weight_sync_seconds.observe(record["transfer_s"])
            self.admission.version_loaded()
            return record
        except base.EngineUnusable as exc:
            log.error("v%d: %s; stopping so the replica restarts", plan.version, exc)
            raise
        except Exception as exc:  # TrainerUnreachable, TransferFailed, a deadline, a broken group
            log.warning("v%d: weight update failed (%s); keeping v%d", plan.version, exc, self.engine.version)
            with contextlib.suppress(replica.TrainerUnreachable):
                await asyncio.to_thread(self.link.rejoin)
            return None
        finally:
            self.admission.reopen()

    async def _overlapped(self, plan: base.Plan, record: dict[str, float], t0: float) -> bool:
        link, clock = self.link, self.clock
        roster = await self._join(plan)
        if roster is None:
            return False
        t_roster = clock()
        await self.engine.prefetch(plan, roster)
        received = await asyncio.to_thread(link.wait_received, plan)
        t_received = clock()
        await asyncio.to_thread(link.ack, plan, received, t_received - t_roster)
        record.update(wait_roster_s=t_roster - t0, transfer_s=t_received - t_roster)
        await self._drain()
        async with self._paused(record):
            loaded = await self.engine.apply_prefetched(plan)
        if loaded != received:
            raise RuntimeError(f"loaded checksum {loaded} != received {received}")
        return True

    async def _join(self, plan: base.Plan) -> base.Roster | None:
        """Say ready for ``plan`` and read its roster; None when the roster left this replica out."""
        await asyncio.to_thread(self.link.ready, plan)
        roster = await asyncio.to_thread(self.link.roster, plan)
        return roster if await self._in(roster, plan) else None

    async def _serial(self, plan: base.Plan, record: dict[str, float], t0: float) -> bool:
        link, clock = self.link, self.clock
        await self._drain()
        async with self._paused(record):
            roster = await self._join(plan)
            if roster is None:
                return False
            t_roster = clock()
            await self.engine.update(plan, roster)
            record.update(wait_roster_s=t_roster - t0, transfer_s=clock() - t_roster)
        # Generating again: the workers hash what they loaded meanwhile (NCCL: no checksum).
        loaded = await asyncio.to_thread(link.wait_received, plan) if self.engine.posts_checksum else ""
        await asyncio.to_thread(link.ack, plan, loaded, record["transfer_s"])
        return True

    @contextlib.asynccontextmanager
    async def _paused(self, record: dict[str, float]) -> AsyncIterator[None]:
        """Generation paused for the block; resumed however it ends, before any error is handled.

        The pause call returns once the engine has finished the step it was running (vLLM answers
        utility calls between steps): that wait still produced tokens, so it is recorded apart
        (``pause_wait_s``); ``pause_s`` is the time the engine took no step."""
        clock = self.clock
        paused_at = clock()
        idle_from: float | None = None
        try:
            await self.engine.pause()
            idle_from = clock()
            self.m.preempted.inc(len(self.inflight))  # requests that continue under new weights
            yield
        finally:
            await self.engine.resume()
            resumed = clock()
            idle_from = resumed if idle_from is None else idle_from
            record.update(pause_s=resumed - idle_from, pause_wait_s=idle_from - paused_at)
            self.m.rollout_pause_seconds.observe(record["pause_s"])

    async def _in(self, roster: base.Roster, plan: base.Plan) -> bool:
        """Whether this replica is in the round's group; if not, rejoin for the next version."""
        if roster.member(self.link.replica, self.link.incarnation) is not None:
            return True
        log.warning("v%d: left out of the roster; joining at the next version", plan.version)
        await asyncio.to_thread(self.link.rejoin)
        return False

    async def _drain(self) -> None:
        """partialRollout false: stop admitting and let in-flight groups finish under the old weights
        (a validation run in progress ends first, whatever partialRollout says)."""
        if self.hold is not None:
            await self.hold()
        if self.partial_rollout:
            return
        self.admission.close()
        while self.inflight:
            await asyncio.sleep(self.poll_s / 4)
