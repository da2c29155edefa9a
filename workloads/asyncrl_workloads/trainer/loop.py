"""The trainer's main loop: pull -> filter stale -> batch -> step -> ledger -> ack -> sync weights.

Called by trainer/main.py. Algorithm (fully asynchronous GRPO/PPO with bounded staleness, as in
verl's fully-async trainer and AReaL): rank 0 waits for `groupsPerStep` complete prompt groups whose
every sample lags the trainer by at most maxStaleness versions, broadcasts them to all ranks, and
every rank takes the step (trainer/backend.py); with spec.trainer.algorithm.dynamicSampling, groups
whose rewards are all equal are dropped before they reach a step (trainer/inbox.py). Then, in this order:

  1. ledger: the step's trajectory ids are recorded (rank 0, atomic file) - never trained twice;
  2. checkpoint every `everySteps` (all ranks);
  3. ack every sample of the step - only now may the bus forget them;
  4. every `syncEverySteps`: paramVersion += 1, announce on NATS, broadcast the full weights to the
     rollouts with the weight sender (bounded by its deadline; dropped rollouts are reported).

While rank 0 waits for samples it also brings rollouts that said hello late up to its current
version (a catch-up round for them alone): their samples may be too stale to train on otherwise, and
without samples no step - and no next version - would ever come.

Other ranks mirror rank 0: every decision after a step (checkpoint, sync) is a function of the step
number, so only the batch travels. While rank 0 waits for data it broadcasts a heartbeat so the other
ranks' collectives never hit the process-group timeout. Left out: validation runs, KL to a reference.

With spec.teacher, rank 0 asks the teacher for the logprobs of every chosen sample's response
(trainer/teacher.py) before broadcasting the batch, and the batch carries them to every rank (the
backend adds the reverse-KL term). A sample the teacher gave none for is dropped from the step, counted
dropped{reason="reward_error"} and acked like a stale one; a teacher that has failed for
giveUpAfterSeconds ends the trainer (teacher.GaveUp, checked after each call and while waiting for
samples) with its samples unacked, so they come back.

What rank 0 records about each step (counters, metrics, the JSON step log, the progress report)
lives in trainer/steplog.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import pathlib
import signal
import time
from typing import Any

import torch

from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.bus import codec, jetstream
from asyncrl_workloads.tracking import tracker as tracker_mod
from asyncrl_workloads.trainer import backend as backend_mod
from asyncrl_workloads.trainer import checkpoint, fsdp, inbox, progress, steplog
from asyncrl_workloads.trainer import teacher as teacher_mod
from asyncrl_workloads.trainer import validation as validation_mod
from asyncrl_workloads.weightsync import base as weightsync_base
from asyncrl_workloads.weightsync import checksum

log = logging.getLogger(__name__)
HEARTBEAT_S = 5.0
CHECKSUM_MAX_BYTES = 256 << 20
"""The trainer hashes the weights it sent (to compare with the rollouts' acks) only up to this size:
sha256 of a 100 GB model on every sync would cost minutes."""


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    max_steps: int | None
    sync_every_steps: int = 1
    step_log: pathlib.Path | None = None
    """JSON line per step (metrics, drops, sync report); the local runner and the e2e tests read it."""
    kill_before_ack_step: int | None = None
    """Fault injection for the crash tests (env ASYNCRL_FAULT_KILL_BEFORE_ACK_STEP): SIGKILL this process
    after the ledger and checkpoint of that step are written, before its samples are acked."""


@dataclasses.dataclass
class State:
    step: int = 0
    version: int = 0
    last_sync_time: float | None = None
    step_time: float | None = None


class Follower:
    """Ranks > 0: take the steps rank 0 hands out; mirror its checkpoints and weight gathers."""

    def __init__(
        self,
        settings: LoopSettings,
        world: fsdp.World,
        backend: backend_mod.TrainerBackend,
        checkpointer: checkpoint.Checkpointer | None,
        metrics: metrics_mod.Bound | None = None,
    ) -> None:
        self.settings, self.world, self.backend, self.checkpointer = settings, world, backend, checkpointer
        self.metrics = metrics

    def _join_gather(self) -> None:
        """Take part in rank 0's weight gather (a collective) without keeping what it gathers: a follower
        holds one full tensor at a time, not a copy of the model."""
        for _ in self.backend.full_tensors():
            pass

    def run(self, state: State) -> None:
        while True:
            message: tuple[str, Any] = fsdp.broadcast_object(None, self.world)  # type: ignore[assignment]
            kind, payload = message
            if kind == "stop":
                return
            if kind == "sync":  # an out-of-band sync (after resume)
                self._join_gather()
            elif kind == "checkpoint":
                assert self.checkpointer is not None
                self.checkpointer.save(state.step, self.backend, {})
            elif kind == "batch":
                trajs, teacher_logprobs = payload
                self.backend.step(trajs, teacher_logprobs)
                state.step += 1
                if self.metrics is not None:
                    self.metrics.trainer_step.set(state.step)
                    self.metrics.trainer_last_step_ts.set(time.time())
                if self.checkpointer is not None and self.checkpointer.due(state.step):
                    self.checkpointer.save(state.step, self.backend, {})
                if state.step % self.settings.sync_every_steps == 0:
                    self._join_gather()


class Leader:
    """Rank 0: owns the bus, the ledger, the weight sender, metrics and progress."""

    def __init__(
        self,
        settings: LoopSettings,
        world: fsdp.World,
        backend: backend_mod.TrainerBackend,
        checkpointer: checkpoint.Checkpointer | None,
        intake: inbox.Inbox,
        nc: Any,
        announce_subject: str,
        sender: Any,
        metrics: metrics_mod.Bound,
        reporter: progress.Reporter,
        teacher: teacher_mod.Teacher | None = None,
        validation: validation_mod.ValidationLog | None = None,
        tracker: tracker_mod.Tracker | None = None,
    ) -> None:
        self.settings, self.world, self.backend = settings, world, backend
        self.checkpointer, self.intake, self.nc = checkpointer, intake, nc
        self.announce_subject, self.sender = announce_subject, sender
        self.metrics = metrics
        self.teacher = teacher
        self.steplog = steplog.StepLog(settings.step_log, intake, metrics, reporter, validation, tracker)

    async def _bcast(self, message: tuple[str, Any]) -> None:
        if self.world.size > 1:
            await asyncio.to_thread(fsdp.broadcast_object, message, self.world)

    async def _wait_batch(self, state: State, stop: asyncio.Event) -> list[inbox.Taken] | None:
        while True:
            taken = await self.intake.next_batch(state.version, stop, HEARTBEAT_S)
            if taken is None or taken:
                return taken
            await self._bcast(("idle", None))
            await self._teacher_alive()
            await self._catch_up(state)
            await self.steplog.refresh_queue()
            self._report(state, {}, force=False)

    async def run(self, state: State, stop: asyncio.Event, sync_first: bool) -> None:
        if sync_first:
            await self._bcast(("sync", None))
            await self._sync(state)
        while not stop.is_set() and (self.settings.max_steps is None or state.step < self.settings.max_steps):
            t0 = time.monotonic()
            queued_at_ask = self.steplog.queue_depth  # read after the previous step (utilization)
            taken = await self._wait_batch(state, stop)
            if taken is None:
                break
            waited = time.monotonic() - t0
            teacher_logprobs = None
            if self.teacher is not None:
                taken, teacher_logprobs = await self._ask_teacher(self.teacher, taken)
                if not taken:
                    continue
            trajs = [t.trajectory for t in taken]
            await self._bcast(("batch", (trajs, teacher_logprobs)))
            step_metrics = await asyncio.to_thread(self.backend.step, trajs, teacher_logprobs)
            step_metrics.update(self._fresh_gap(taken, state.version))
            state.step += 1
            state.step_time = time.time()
            self.intake.ledger.record_step(
                state.step,
                state.version,
                [t.id for t in trajs],
                self.intake.elsewhere(t.received for t in taken),
            )
            if self.checkpointer is not None and self.checkpointer.due(state.step):
                await asyncio.to_thread(self._save, state)
            if self.settings.kill_before_ack_step == state.step:
                os.kill(os.getpid(), signal.SIGKILL)
            for t in taken:
                await self.intake.consumer.ack(t.received)
            try:
                await self.nc.flush()
            except jetstream.NO_ANSWER:  # the bus is down: the acks wait in the client's buffer
                log.warning("bus: acks of step %d not confirmed sent; they go out on reconnect", state.step)
            self.steplog.account(taken, waited, time.monotonic() - t0, queued_at_ask)
            sync_report = None
            if state.step % self.settings.sync_every_steps == 0:
                state.version += 1
                sync_report = await self._sync(state)
            await self.steplog.refresh_queue()
            self.steplog.write(state.step, state.version, step_metrics, taken, sync_report)
            self._report(state, step_metrics, force=False)
        if (
            self.checkpointer is not None
            and self.checkpointer.every_steps
            and state.step
            and not self.checkpointer.due(state.step)
        ):
            await self._bcast(("checkpoint", None))
            await asyncio.to_thread(self._save, state)
        await self._bcast(("stop", None))
        await self.steplog.refresh_queue()
        self._report(state, {}, force=True)

    async def _ask_teacher(
        self, teacher: teacher_mod.Teacher, taken: list[inbox.Taken]
    ) -> tuple[list[inbox.Taken], dict[str, list[float]]]:
        """The step's samples the teacher scored and their logprobs; the others are dropped (acked). While
        the calls run, the other ranks get heartbeats (retries may take minutes)."""
        fetching = asyncio.ensure_future(teacher.fetch([t.trajectory for t in taken]))
        while not fetching.done():
            await asyncio.wait({fetching}, timeout=HEARTBEAT_S)
            if not fetching.done():
                await self._bcast(("idle", None))
        fetched = fetching.result()
        failed = [t for t in taken if t.trajectory.id in fetched.failed]
        if failed:  # recorded and acked before a give-up: the batch that ran the clock out is accounted too
            log.warning(
                "teacher: %d of %d samples dropped (no logprobs): %s",
                len(failed), len(taken), fetched.failed[failed[0].trajectory.id],
            )  # fmt: skip
            await self.intake.drop_reward_errors([t.received for t in failed])
        await self._teacher_alive()
        return [t for t in taken if t.trajectory.id in fetched.logprobs], fetched.logprobs

    async def _teacher_alive(self) -> None:
        """Raise teacher.GaveUp (after stopping the other ranks) once every teacher call has failed for
        giveUpAfterSeconds. Checked while waiting for samples too: after a few dropped batches the rollouts
        may wait for a version that no step will bring, and the trainer must still end with the reason."""
        error = self.teacher.gave_up() if self.teacher is not None else None
        if error is not None:
            await self._bcast(("stop", None))
            raise teacher_mod.GaveUp(error)

    def _fresh_gap(self, taken: list[inbox.Taken], version: int) -> dict[str, float]:
        """Logprob gap between trainer and engine on samples generated entirely by the current version."""
        gaps = getattr(self.backend, "logprob_gap", {})
        fresh = [
            gaps[t.trajectory.id]
            for t in taken
            if t.trajectory.id in gaps and set(t.trajectory.versions) == {version}
        ]
        return {"fresh_logprob_gap": max(fresh), "fresh_samples": float(len(fresh))} if fresh else {}

    def _save(self, state: State) -> None:
        assert self.checkpointer is not None
        self.checkpointer.save(state.step, self.backend, {"param_version": state.version})

    async def _catch_up(self, state: State) -> None:
        """Waiting for samples: send the current version to rollouts that joined since its sync."""
        if self.sender is None:
            return
        late = await asyncio.to_thread(self.sender.behind, state.version)
        if not late:
            return
        log.info("weight sync v%d: catching up replicas %s while waiting for samples", state.version, late)
        await self._bcast(("sync", None))
        self.steplog.catch_up(await self._sync(state, only=late))

    async def _sync(self, state: State, only: list[int] | None = None) -> dict[str, Any]:
        if only is None:  # a catch-up repeats a version already announced
            await self.nc.publish(
                self.announce_subject, codec.encode_announcement(state.version, state.step, time.time())
            )
        metas = self.backend.sync_metas() if self.sender is not None else None
        payload: weightsync_base.Stream | list[tuple[str, torch.Tensor]]
        if metas is None:
            payload = await asyncio.to_thread(lambda: list(self.backend.full_tensors()))
        else:  # gathered bucket by bucket while it is sent
            plan = [weightsync_base.TensorMeta.of(*meta) for meta in metas]
            payload = weightsync_base.Stream(
                plan, self.backend.full_tensors(), keep=sum(m.nbytes for m in plan) <= CHECKSUM_MAX_BYTES
            )
        try:
            report = (
                await asyncio.to_thread(self.sender.sync, state.version, payload, only)
                if self.sender
                else None
            )
        finally:
            if isinstance(payload, weightsync_base.Stream):  # the followers gather to the end: so does rank 0
                await asyncio.to_thread(payload.drain)
        named = payload.kept if isinstance(payload, weightsync_base.Stream) else payload
        state.last_sync_time = time.time()
        self.metrics.param_version.set(state.version)
        out: dict[str, Any] = {"version": state.version}
        if report is not None:
            self.metrics.weight_sync_seconds.observe(report.transfer_seconds)
            out.update(
                members=report.members,
                dropped={str(k): v for k, v in report.dropped.items()},
                checksums={str(k): v for k, v in report.checksums.items()},
                generation=report.generation,
                transfer_seconds=report.transfer_seconds,
                total_seconds=report.total_seconds,
                nbytes=report.nbytes,
            )
            if report.checksums and report.nbytes <= CHECKSUM_MAX_BYTES:
                out["trainer_checksum"] = checksum.of(named)
            for replica, reason in report.dropped.items():
                log.warning("weight sync v%d: rollout replica %s dropped: %s", state.version, replica, reason)
            log.info(
                "weight sync v%d%s: members %s, dropped %s, %.1f MB in %.2f s (round %.2f s)",
                state.version, " (catch-up)" if only is not None else "", report.members,
                sorted(report.dropped), report.nbytes / 1e6, report.transfer_seconds, report.total_seconds,
            )  # fmt: skip
        return out

    def _report(self, state: State, step_metrics: dict[str, float], force: bool) -> None:
        self.steplog.report(
            state.step, state.version, state.step_time, state.last_sync_time, step_metrics, force
        )
