"""Trainer rank 0's side of weight sync on the gloo path: membership, rounds, deadlines.

Called by the trainer (``asyncrl_workloads.trainer``) every ``async.syncEverySteps`` steps:

    sender = sender.GlooWeightSender(port=cfg.endpoints.weight_sync_port,
                                     timeout_seconds=spec.weight_sync.timeout_seconds,
                                     bucket_mb=spec.weight_sync.bucket_mb)
    report = sender.sync(version, model.state_dict().items())   # full (unsharded) HF-named tensors

The group is a dedicated gloo group built from the TCPStore this class hosts on the weight-sync
port (never the trainer's default process group): rank 0 is this process, ranks
``1 + sum(ranks of the replicas before it) ...`` are the rollout engine workers. The protocol and
its store keys are described in ``weightsync/base.py``. Rollout replicas that fail to be ready,
to join, or to ack before the deadline are dropped and named in ``SyncReport.dropped``; they
come back by saying hello again and join at the next version with a new group generation.

Late joiners: a replica that says hello while the trainer waits for samples would otherwise wait
for a next version that needs samples it cannot make (its version may already be too stale to
train on: rollouts that started before the trainer, a trainer that ate a backlog). While it waits,
the trainer asks ``behind(version)`` and brings those replicas up with ``sync(version, ...,
only=...)``, a round of the current version for them alone.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Callable, Collection, Iterable
from typing import Any

import torch

from asyncrl_workloads.weightsync import base, checksum, rendezvous

log = logging.getLogger(__name__)


class GlooWeightSender(base.WeightSender):
    """Hosts the rendezvous store and broadcasts each version to the current members."""

    def __init__(
        self, port: int, timeout_seconds: float, bucket_mb: int, adapter: base.Adapter | None = None
    ) -> None:
        self.adapter = adapter
        """A LoRA job's payload kind (every plan carries it); None: full weights."""
        self.timeout = float(timeout_seconds)
        self.bucket_bytes = int(bucket_mb) << 20
        self.incarnation = uuid.uuid4().hex[:12]
        self.store = rendezvous.host_store(port, self.timeout)
        self.store.set(rendezvous.TRAINER, self.incarnation)
        self._hello_cursor = 0
        self._bye_cursor = 0
        self._gone: set[tuple[int, str]] = set()
        """(replica, incarnation) of processes that said bye: their hellos are ignored."""
        self._registry: dict[int, base.Hello] = {}
        self._seq = 0
        self._generation = 0
        self._group: Any = None
        self._group_members: tuple[base.Member, ...] = ()
        self._acked: dict[int, tuple[str, int]] = {}
        """Replica -> (incarnation, version) of its last ack."""
        self._hello_n: dict[int, int] = {}
        """Replica -> number of its latest hello."""
        self._offered: dict[int, tuple[int, int]] = {}
        """Replica -> (hello number, version) of the last catch-up round offered to it: offered again
        only after a new hello (a replica that failed the round rejoins; one that ignored it does not)."""
        log.info("weight sync: store on port %d (trainer incarnation %s)", port, self.incarnation)

    # ---- membership ------------------------------------------------------------------------
    def _read_since(
        self, seq_key: str, key_of: Callable[[int], str], cursor: int
    ) -> tuple[int, list[tuple[int, base.Hello]]]:
        """The counter ``seq_key`` and the Hellos written under ``key_of(n)`` for n after ``cursor`` up
        to it, numbered (an unreadable one is logged and skipped)."""
        out = []
        last = rendezvous.read_int(self.store, seq_key)
        for n in range(cursor + 1, last + 1):
            try:
                data = rendezvous.get_by(self.store, key_of(n), time.monotonic() + 1.0)
                out.append((n, base.decode(data, base.Hello)))
            except (base.ProtocolError, rendezvous.DeadlineExceeded) as exc:
                log.warning("weight sync: ignoring %s: %s", key_of(n), exc)
        return last, out

    def _read_hellos(self) -> None:
        last, hellos = self._read_since(rendezvous.HELLO_SEQ, rendezvous.hello_key, self._hello_cursor)
        for n, hello in hellos:
            if (hello.replica, hello.incarnation) in self._gone:
                continue
            if self._registry.get(hello.replica) != hello:
                log.info(
                    "weight sync: replica %d (incarnation %s) asks to join", hello.replica, hello.incarnation
                )
            self._registry[hello.replica] = hello
            self._hello_n[hello.replica] = n
        self._hello_cursor = last
        self._read_byes()

    def _read_byes(self) -> set[int]:
        """Unregister the replicas that said bye (ReplicaLink.leave); returns those that left now."""
        left: set[int] = set()
        self._bye_cursor, byes = self._read_since(rendezvous.BYE_SEQ, rendezvous.bye_key, self._bye_cursor)
        for _, bye in byes:
            self._gone.add((bye.replica, bye.incarnation))
            registered = self._registry.get(bye.replica)
            if registered is not None and registered.incarnation == bye.incarnation:
                del self._registry[bye.replica]
                left.add(bye.replica)
                log.info("weight sync: replica %d (incarnation %s) left", bye.replica, bye.incarnation)
        return left

    def members(self) -> list[int]:
        """Replicas currently registered (they take part in the next round)."""
        self._read_hellos()
        return sorted(self._registry)

    def behind(self, version: int) -> list[int]:
        """Registered replicas that hold an older version than ``version`` and were not offered a
        catch-up round of it since their latest hello. A replica that never acked holds the model's
        initial weights, version 0."""
        self._read_hellos()
        late = []
        for replica, hello in sorted(self._registry.items()):
            incarnation, acked = self._acked.get(replica, (hello.incarnation, 0))
            held = acked if incarnation == hello.incarnation else 0
            if held < version and self._offered.get(replica) != (self._hello_n[replica], version):
                late.append(replica)
        return late

    def _drop(self, report: base.SyncReport, replica: int, reason: str) -> None:
        report.dropped[replica] = reason
        self._registry.pop(replica, None)
        log.warning("weight sync v%d: dropped replica %d: %s", report.version, replica, reason)

    # ---- one round -------------------------------------------------------------------------
    def sync(
        self,
        version: int,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        only: Collection[int] | None = None,
    ) -> base.SyncReport:
        start = time.monotonic()
        report = base.SyncReport(version=version)
        self._read_hellos()
        candidates = tuple(
            base.Member(h.replica, h.incarnation, h.ranks)
            for _, h in sorted(self._registry.items())
            if only is None or h.replica in only
        )
        if only is not None:
            self._offered.update((m.replica, (self._hello_n[m.replica], version)) for m in candidates)
        if not candidates:
            report.total_seconds = time.monotonic() - start
            return report
        tensors: Iterable[tuple[str, torch.Tensor]]
        if isinstance(named_tensors, base.Stream):  # made while sent, one bucket at a time
            tensors, metas = named_tensors, named_tensors.metas
        else:
            tensors = [(name, t.detach()) for name, t in named_tensors]
            metas = tuple(base.TensorMeta.of(name, t.dtype, t.shape) for name, t in tensors)
        self._seq += 1
        plan = base.Plan(
            seq=self._seq,
            version=version,
            candidates=candidates,
            tensors=metas,
            buckets=base.plan_buckets(metas, self.bucket_bytes),
            timeout_seconds=self.timeout,
            trainer=self.incarnation,
            bucket_bytes=self.bucket_bytes,
            registered=len(self._registry),
            adapter=self.adapter,
        )
        self.store.set(rendezvous.plan_key(plan.seq), base.encode(plan))
        self.store.set(rendezvous.PLAN_SEQ, str(plan.seq))

        # Phase 1: who is ready (paused, or drained when partialRollout is off)?
        deadline = time.monotonic() + self.timeout
        ready_keys = {m.replica: rendezvous.ready_key(plan.seq, m.replica) for m in candidates}
        present, left = self._wait_ready(ready_keys, deadline)
        ready: list[base.Member] = []
        offset = 1
        for m in candidates:
            if m.replica in left and ready_keys[m.replica] not in present:
                continue  # said bye after the plan went out: not a failure, nothing to wait for
            if ready_keys[m.replica] not in present:
                self._drop(report, m.replica, "not ready before the deadline")
            elif bytes(self.store.get(ready_keys[m.replica])).decode() != m.incarnation:
                self._drop(report, m.replica, "restarted during the round")
            else:
                ready.append(base.Member(m.replica, m.incarnation, m.ranks, rank_offset=offset))
                offset += m.ranks
        members = tuple(ready)
        if self._group is None or members != self._group_members:
            self._close_group()
            self._generation += 1
        roster = base.Roster(seq=plan.seq, generation=self._generation, world_size=offset, members=members)
        self.store.set(rendezvous.roster_key(plan.seq), base.encode(roster))
        report.generation = roster.generation
        if not members:
            report.total_seconds = time.monotonic() - start
            return report

        # Phase 2: form (or reuse) the group and broadcast every bucket, all before one deadline.
        deadline = time.monotonic() + self.timeout
        if not self._form(roster, deadline, report):
            report.total_seconds = time.monotonic() - start
            return report
        t0 = time.monotonic()
        try:
            self._transfer(plan, tensors, deadline, report)
        except RuntimeError as exc:  # gloo: timeout or a peer gone
            log.warning("weight sync v%d: broadcast failed: %s", version, str(exc).splitlines()[0][:200])
            self._close_group()
        report.transfer_seconds = time.monotonic() - t0

        # Phase 3: acks (each member loaded the weights); missing ones are dropped, except from members
        # that said bye during the round (a rollout stopping mid-broadcast): no wait for them either.
        ack_keys = {m.replica: rendezvous.ack_key(plan.seq, m.replica) for m in members}
        present, left = self._wait_ready(ack_keys, max(deadline, time.monotonic() + 1.0), left)
        for m in members:
            if ack_keys[m.replica] not in present:
                if m.replica not in left:
                    self._drop(report, m.replica, "no ack before the deadline")
                self._close_group()
                continue
            ack = base.decode(bytes(self.store.get(ack_keys[m.replica])), base.Ack)
            report.members.append(m.replica)
            report.checksums[m.replica] = ack.checksum
            self._acked[m.replica] = (m.incarnation, version)
        report.total_seconds = time.monotonic() - start
        return report

    def _wait_ready(
        self, keys: dict[int, str], deadline: float, left_before: Collection[int] = ()
    ) -> tuple[set[str], set[int]]:
        """Wait for the replicas' keys (ready or ack) until ``deadline``, no longer for those that said
        bye meanwhile or earlier in the round (``left_before``): (keys present, replicas that left)."""
        present: set[str] = set()
        left: set[int] = set(left_before)
        while True:
            pending = [key for replica, key in keys.items() if key not in present and replica not in left]
            present |= rendezvous.wait_keys(self.store, pending, min(deadline, time.monotonic() + 0.5))
            left |= self._read_byes()
            if all(key in present or replica in left for replica, key in keys.items()):
                return present, left
            if time.monotonic() >= deadline:
                return present, left

    def _form(self, roster: base.Roster, deadline: float, report: base.SyncReport) -> bool:
        if self._group is not None:
            return True
        try:
            self._group = self._open_group(roster, deadline)
            self._group_members = roster.members
            return True
        except RuntimeError as exc:
            log.warning("weight sync: group generation %d failed: %s", roster.generation, str(exc)[:200])
        for m in roster.members:
            keys = [rendezvous.joined_key(roster.generation, m.rank_offset + i) for i in range(m.ranks)]
            if not all(self.store.check([k]) for k in keys):
                self._drop(report, m.replica, f"did not join group generation {roster.generation}")
            else:
                self._drop(report, m.replica, f"group generation {roster.generation} failed")
        return False

    # ---- the transport (the NCCL sender overrides these three) ------------------------------
    def _open_group(self, roster: base.Roster, deadline: float) -> Any:
        """Form generation ``roster.generation``'s group as rank 0 (raises RuntimeError on failure)."""
        return rendezvous.form_group(
            self.store, roster.generation, 0, roster.world_size, deadline - time.monotonic()
        )

    def _transfer(
        self,
        plan: base.Plan,
        tensors: Iterable[tuple[str, torch.Tensor]],
        deadline: float,
        report: base.SyncReport,
    ) -> None:
        """Broadcast every bucket of ``plan`` before ``deadline`` (raises RuntimeError on failure);
        ``tensors`` in the plan's order, taken one bucket at a time."""
        produced = iter(tensors)
        for a, b in plan.buckets:
            buffer = rendezvous.pack([t for _, t in itertools.islice(produced, b - a)])
            rendezvous.broadcast(self._group, buffer, deadline - time.monotonic())
            report.nbytes += buffer.numel()

    def _close_group(self) -> None:
        self._group = None  # gloo closes its sockets when the last reference goes
        self._group_members = ()

    def close(self) -> None:
        self._close_group()
        del self.store


def expected_checksum(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """What a member's ack should say after loading these tensors (tests compare the two)."""
    return checksum.of(named_tensors)
