"""Trainer checkpoints (sharded model + optimizer, every N steps) and the consumed-trajectory ledger.

Called by trainer/loop.py. Two files with two cadences, so that after a crash no trajectory id is
trained twice:

- The **ledger** (`<path>/ledger.json`, rank 0, every step, and when the bus counters change between
  steps) records the ids used by recent steps and the bus counters (acked, consumed, dropped). The
  loop writes it after the optimizer step and *before* acking, so a crash between step and ack
  leaves ids that the restarted trainer recognises when the server redelivers them: it acks them
  without training.
- The **checkpoint** (`<path>/step-00000042/`, all ranks, every `everySteps`) is written with
  torch.distributed.checkpoint into `step-….tmp` and renamed into place by rank 0 once complete, with
  `meta.json` last; `latest()` only sees renamed directories, so a half-written one is never loaded.

Resuming restores the model from the latest checkpoint and the counters from the ledger. Steps after
the checkpoint are lost for the model but their samples stay consumed (never re-trained): losing a
few samples is preferred over training any twice. For several nodes `path` must be a shared volume.
Both files are written atomically (write to a temp name, fsync, rename).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import time
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from asyncrl_workloads.trainer import backend as backend_mod
from asyncrl_workloads.trainer import fsdp

LEDGER = "ledger.json"
_COUNTERS = ("step", "param_version", "acked_total", "consumed_total", "dropped_stale", "dropped_invalid")
_STREAM_COUNTERS = (
    "lost_with_store",
    "stream_acked_base",
    "stream_owed",
    "queue_full_current",
    "queue_full_earlier",
    "stream_held_old",
    "dropped_reward_error",
    "dropped_zero_variance",
    "zero_variance_kept",
)
_PREFIX = "step-"
_STREAMS_LEFT_KEPT = 8


def write_atomic(path: pathlib.Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


@dataclasses.dataclass
class Ledger:
    """What the bus has delivered and the trainer has done with it (rank 0)."""

    path: pathlib.Path | None
    step: int = 0
    param_version: int = 0
    acked_total: int = 0
    """Every message the trainer acked (or is about to): consumed + dropped (stale, invalid, reward_error,
    zero_variance)."""
    consumed_total: int = 0
    dropped_stale: int = 0
    dropped_invalid: int = 0
    dropped_reward_error: int = 0
    """Samples the teacher gave no logprobs for (trainer/teacher.py): never trained with a made-up value."""
    dropped_zero_variance: int = 0
    """Samples of prompt groups whose rewards were all equal, dropped by dynamic sampling (inbox.py)."""
    zero_variance_kept: int = 0
    """Samples of equal-reward groups trained anyway: their step had dropped maxDropsPerStep groups
    already. Counted when the batch is taken and saved with its step (a crash before it re-counts the
    redelivered batch, which is taken again)."""
    lost_with_store: int = 0
    """Samples lost with the bus's store (NATS came back without it), counted when the trainer finds
    the stream created again: at least what the old stream held at the trainer's last look."""
    stream_created: str = ""
    """Creation time of the bus stream the counters below refer to ("" until the trainer first looks)."""
    stream_acked_base: int = 0
    """`acked_total` when the trainer found that stream, plus the messages of earlier streams recorded
    since (`record_step`/`record_drops` ``elsewhere``): acks up to this went to a stream that is gone."""
    stream_held_old: int = 0
    """Messages of earlier streams the trainer held when it found this one and has not recorded yet. A
    trainer that dies holding them never acks them (their store is gone, nobody delivers them again):
    the next `load` counts them lost with the store (`lost_at_load`)."""
    stream_owed: int = 0
    """`acked_total` the trainer would reach by acking everything that stream held at its last look."""
    queue_full_current: int = 0
    """Messages the current stream discarded (dropOldest) before the trainer saw them."""
    queue_full_earlier: int = 0
    """The same, summed over the streams lost before it."""
    streams_left: list[str] = dataclasses.field(default_factory=list)
    """Creation times of the last streams left behind: a message of one of them, still buffered in
    the client when the trainer already counts the new stream, must not switch it back."""
    recent: list[tuple[int, float, list[str]]] = dataclasses.field(default_factory=list)
    """(step, unix time, ids trained or dropped), newest last; entries of the last `keep_steps` steps or
    younger than `keep_seconds` are kept. Only unacked messages come back, and the loop flushes its
    acks (a server round trip) right after each step, so ids older than a few steps cannot be
    redelivered; the window keeps the file small at high sample rates."""
    keep_steps: int = 16
    keep_seconds: float = 120.0
    _seen: set[str] = dataclasses.field(default_factory=set, repr=False)
    lost_at_load: int = dataclasses.field(default=0, repr=False)
    """Held messages of a lost stream that the last process died with, counted lost by `load` (not
    persisted: the caller reports them once)."""

    @classmethod
    def load(cls, path: pathlib.Path | None, keep_seconds: float = 120.0) -> Ledger:
        """The ledger as a starting trainer takes it over: messages of a lost stream that the last
        process still held are counted lost here (`lost_at_load`; the trainer reports and saves it),
        so a ledger read while its trainer runs shows those as lost already."""
        ledger = cls(path=path, keep_seconds=keep_seconds)
        if path is None or not path.exists():
            return ledger
        body = json.loads(path.read_text())
        for name in _COUNTERS:
            setattr(ledger, name, int(body[name]))
        for name in _STREAM_COUNTERS:  # absent from ledgers written before they were kept
            setattr(ledger, name, int(body.get(name, 0)))
        ledger.stream_created = str(body.get("stream_created", ""))
        ledger.streams_left = [str(c) for c in body.get("streams_left", [])]
        ledger.recent = [(int(s), float(t), list(ids)) for s, t, ids in body["recent"]]
        ledger._seen = {i for _, _, ids in ledger.recent for i in ids}
        if ledger.stream_held_old:  # pulled from a store that is gone, never trained: lost with it
            ledger.lost_at_load, ledger.stream_held_old = ledger.stream_held_old, 0
            ledger.lost_with_store += ledger.lost_at_load
            # no longer owed by the current stream's predecessors: a next switch must not count them again
            ledger.stream_owed = max(ledger.stream_owed - ledger.lost_at_load, ledger.acked_total)
        return ledger

    def seen(self, trajectory_id: str) -> bool:
        return trajectory_id in self._seen

    def record_step(self, step: int, param_version: int, ids: list[str], elsewhere: int = 0) -> None:
        """The optimizer step `step` used `ids`, `elsewhere` of them pulled from an earlier stream than
        `stream_created` (see `follow_stream`). Persisted before the loop acks them."""
        self.step, self.param_version = step, param_version
        self.consumed_total += len(ids)
        self._from_old_stream(elsewhere)
        self._remember(step, ids)

    def record_drops(
        self,
        stale_ids: list[str],
        invalid_ids: list[str],
        undecodable: int = 0,
        elsewhere: int = 0,
        reward_error_ids: list[str] | None = None,
        zero_variance_ids: list[str] | None = None,
    ) -> None:
        """Samples about to be acked without training (`undecodable` ones have no id), `elsewhere` of
        them pulled from an earlier stream. Persisted first."""
        reward_error_ids = reward_error_ids or []
        zero_variance_ids = zero_variance_ids or []
        self.dropped_stale += len(stale_ids)
        self.dropped_invalid += len(invalid_ids) + undecodable
        self.dropped_reward_error += len(reward_error_ids)
        self.dropped_zero_variance += len(zero_variance_ids)
        self._from_old_stream(elsewhere)
        self._remember(self.step, stale_ids + invalid_ids + reward_error_ids + zero_variance_ids)

    def old_copy_replaced(self) -> None:
        """A held message of an earlier stream was replaced by its copy in the current one (the rollout
        published it again): the old copy will not be recorded, and is not lost (trainer/inbox.py)."""
        self.stream_held_old = max(self.stream_held_old - 1, 0)
        self.stream_owed = max(self.stream_owed - 1, self.acked_total)  # owed once, by the new copy

    def _from_old_stream(self, count: int) -> None:
        """`count` messages of an earlier stream recorded: their acks are not the current stream's."""
        self.stream_acked_base += count
        self.stream_held_old = max(self.stream_held_old - count, 0)

    def follow_stream(self, created: str, queued: int | None, held_elsewhere: int) -> int | None:
        """The trainer pulled from, or looked at, the bus stream created at `created`, holding `queued`
        messages (unacked ones included; None: not looked at, only pulled from), while it holds
        `held_elsewhere` unacked messages pulled from an earlier stream (trained or dropped later and
        counted in `acked_total`, but their acks are not sent: `Consumer.ack`). Returns None if it is
        the stream of the last look (or the first look of this job, or of a ledger older than this
        bookkeeping), else the samples lost with the old stream.

        A stream other than the last one means NATS came back without its store: what the old one
        held at the last look and was not acked since is lost (the messages stored after that look
        are lost too, unseen: so this is a lower bound). Acks counted from here on are the new
        stream's, from `stream_acked_base` (see `acked_in_stream`), and its queue_full drops start
        from 0 (`queue_full_current`). The caller must tell the switch before any message of the new
        stream is recorded or acked (trainer/inbox.py does, at the fetch, and saves the ledger at
        once). Messages of the lost stream still held then are counted neither lost nor in the new
        stream: their records add to `stream_acked_base` (``elsewhere``), a copy published again into
        the new stream replaces one (`old_copy_replaced`), and those a trainer process still holds
        when it ends (killed or stopped) are counted lost by the next `load`. Approximate in two
        corners: a publish stored in both streams (in flight at the loss) whose first copy was
        trained before the loss is skipped as a redelivery in the new stream and also counted as one
        queue_full drop there; and a message of the old stream still buffered in the client when the
        switch is seen at a queue refresh, pulled after it, may be counted both lost (it was queued
        at the last look) and consumed."""
        lost = None
        if created in self.streams_left:
            return None
        if created and created != self.stream_created:  # "": a server that does not say (taken as the same)
            if self.stream_created:
                self.streams_left = [*self.streams_left, self.stream_created][-_STREAMS_LEFT_KEPT:]
                lost = max(self.stream_owed - self.acked_total - held_elsewhere, 0)
                self.lost_with_store += lost
                self.stream_acked_base = self.acked_total
                self.stream_held_old = held_elsewhere
                self.queue_full_earlier += self.queue_full_current
                self.queue_full_current = 0
            self.stream_created = created
            self.stream_owed = self.acked_total + held_elsewhere + (queued or 0)
        elif queued is not None:
            self.stream_owed = self.acked_total + held_elsewhere + queued
        return lost

    def acked_in_stream(self) -> int:
        """Acks that went to the current bus stream (`queue_full_drops` compares them with its sequence)."""
        return self.acked_total - self.stream_acked_base

    def _remember(self, step: int, ids: list[str]) -> None:
        now = time.time()
        self.recent.append((step, now, list(ids)))
        steps = sorted({s for s, _, _ in self.recent})
        horizon = steps[-self.keep_steps] if len(steps) > self.keep_steps else steps[0]
        self.recent = [r for r in self.recent if r[0] >= horizon or now - r[1] <= self.keep_seconds]
        self._seen = {i for _, _, r in self.recent for i in r}
        self.acked_total = (
            self.consumed_total
            + self.dropped_stale
            + self.dropped_invalid
            + self.dropped_reward_error
            + self.dropped_zero_variance
        )
        self.save()

    def save(self) -> None:
        if self.path is None:
            return
        body: dict[str, Any] = {name: getattr(self, name) for name in _COUNTERS + _STREAM_COUNTERS}
        body["stream_created"] = self.stream_created
        body["streams_left"] = self.streams_left
        body["recent"] = self.recent
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(body))


def step_dirs(root: pathlib.Path) -> list[pathlib.Path]:
    """The complete step directories under `root`, oldest first (also read by trainer/export.py)."""
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.name.startswith(_PREFIX) and not p.name.endswith(".tmp") and (p / "meta.json").exists()
    ]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX) :]))


class Checkpointer:
    def __init__(
        self,
        root: pathlib.Path,
        every_steps: int,
        keep: int,
        world: fsdp.World,
        model_path: str | None = None,
        lora: dict[str, Any] | None = None,
    ) -> None:
        self.root = root
        self.every_steps = every_steps
        self.keep = keep
        self.world = world
        self.model_path = model_path
        """Written into each step's meta.json: `asyncrl export` builds the HF model from it."""
        self.lora = lora
        """spec.trainer.lora (LoraSettings.meta), written into meta.json: the step holds adapters only."""

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0

    def _dirs(self) -> list[pathlib.Path]:
        return step_dirs(self.root)

    def latest(self) -> tuple[pathlib.Path, dict[str, Any]] | None:
        dirs = self._dirs()
        if not dirs:
            return None
        return dirs[-1], json.loads((dirs[-1] / "meta.json").read_text())

    def save(self, step: int, backend: backend_mod.TrainerBackend, meta: dict[str, Any]) -> pathlib.Path:
        """Collective: every rank calls it. Returns the final directory."""
        final = self.root / f"{_PREFIX}{step:08d}"
        tmp = self.root / f"{final.name}.tmp"
        if self.world.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        if self.world.size > 1:
            dist.barrier()
        dcp.save(backend.state(), checkpoint_id=str(tmp))  # type: ignore[attr-defined]
        if self.world.size > 1:
            dist.barrier()
        if self.world.is_main:
            extra: dict[str, Any] = {"model_path": self.model_path} if self.model_path is not None else {}
            if self.lora is not None:
                extra["lora"] = self.lora
            write_atomic(tmp / "meta.json", json.dumps({"step": step, **extra, **meta}))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            for old in self._dirs()[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        if self.world.size > 1:
            dist.barrier()
        return final

    def load(self, directory: pathlib.Path, backend: backend_mod.TrainerBackend) -> None:
        """Collective: restore model, optimizer and scheduler state from `directory`."""
        state = backend.state()
        dcp.load(state, checkpoint_id=str(directory))  # type: ignore[attr-defined]
        backend.load_state(state)
