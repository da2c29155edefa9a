"""A rollout replica's link to the trainer's weight-sync rendezvous (the control half of a round).

Called by the rollout worker's control loop (``rollout/worker.py``) from a thread: all methods
block on the TCPStore for at most their deadline. The data half (joining the gloo group and
receiving buckets) runs inside the vLLM engine workers, ``weightsync/gloo.py``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

from asyncrl_workloads.weightsync import base, rendezvous

log = logging.getLogger(__name__)
T = TypeVar("T")


LEAVE_TIMEOUT_S = 3.0
"""The most a stopping rollout spends saying bye (ReplicaLink.leave)."""


class TrainerUnreachable(ConnectionError):
    """The trainer's rendezvous store cannot be reached (not up yet, restarting, frozen, partitioned).

    ``refused``: the connection was refused or the trainer's name does not resolve (nothing listens:
    the trainer is starting or restarting). That costs a millisecond and logs nothing, so it is
    retried every second. Any other failure (a store that accepts and does not answer: a frozen
    trainer; a probe that times out: a partition; a connection dropped) may have cost the link's
    timeout and made c10d log C++ stack traces, so the control loop backs off
    (``rollout.planwatch.retry_after_s``)."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class TransferFailed(RuntimeError):
    """The background receive of a round failed or ran past its deadline."""


class ReplicaLink:
    """Says hello, watches for plans, and reports ready / ack for one replica process."""

    def __init__(
        self, host: str, port: int, replica: int, ranks: int = 1, connect_timeout: float = 5.0
    ) -> None:
        self.host, self.port = host, port
        self.replica, self.ranks = replica, ranks
        self.incarnation = uuid.uuid4().hex[:12]
        self.connect_timeout = connect_timeout
        self._store: dist.TCPStore | None = None
        self._seen_seq = 0
        self._hello_for_seq = -1
        self._trainer = ""
        self.epoch = 0
        """Incremented on every (re)connection: the engine workers must reconnect too."""

    @property
    def hello(self) -> base.Hello:
        return base.Hello(self.replica, self.incarnation, self.ranks)

    def _connected(self) -> dist.TCPStore:
        if self._store is None:
            try:
                self._store = rendezvous.connect_store(self.host, self.port, self.connect_timeout)
            except (RuntimeError, OSError) as exc:
                raise TrainerUnreachable(
                    f"weight sync: trainer store {self.host}:{self.port}: {exc}",
                    refused=isinstance(exc, (ConnectionRefusedError, socket.gaierror)),
                ) from None
            trainer = rendezvous.read_str(self._store, rendezvous.TRAINER)
            if trainer != self._trainer:  # a new trainer process: its rounds count from 1 again
                self._trainer, self._seen_seq = trainer, 0
            self.epoch += 1
            self._announce()
        return self._store

    def _announce(self) -> None:
        assert self._store is not None
        n = self._store.add(rendezvous.HELLO_SEQ, 1)
        self._store.set(rendezvous.hello_key(n), base.encode(self.hello))
        log.info("weight sync: replica %d said hello (incarnation %s)", self.replica, self.incarnation)

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(self._connected(), *args)
        except (TransferFailed, rendezvous.DeadlineExceeded, TrainerUnreachable):
            raise  # a failed round, not a lost store; or the (re)connection failed: said once
        except (RuntimeError, OSError) as exc:  # the trainer went away: reconnect and say hello again
            self._store = None
            raise TrainerUnreachable(f"weight sync: lost the trainer store: {str(exc)[:120]}") from None

    def poll(self) -> base.Plan | None:
        """The newest plan not seen yet, or None. Says hello again when a plan leaves us out."""

        def _poll(store: dist.TCPStore) -> base.Plan | None:
            seq = rendezvous.peek_int(store, rendezvous.PLAN_SEQ)  # every poll_s: one round trip
            if seq <= self._seen_seq:
                return None
            self._seen_seq = seq
            plan: base.Plan = base.decode(bytes(store.get(rendezvous.plan_key(seq))), base.Plan)
            if not plan.includes(self.replica, self.incarnation) and self._hello_for_seq < seq:
                self._hello_for_seq = seq
                self._announce()
            return plan

        return self._call(_poll)

    def rejoin(self) -> None:
        """After a failed round: ask to be taken into the next one."""
        self._call(lambda store: self._announce())

    def ready(self, plan: base.Plan) -> None:
        self._call(lambda store: store.set(rendezvous.ready_key(plan.seq, self.replica), self.incarnation))

    def roster(self, plan: base.Plan) -> base.Roster:
        """Wait for the round's roster (the trainer writes it after the ready deadline at the latest)."""
        deadline = time.monotonic() + 2 * plan.timeout_seconds

        def _roster(store: dist.TCPStore) -> base.Roster:
            data = rendezvous.get_by(store, rendezvous.roster_key(plan.seq), deadline)
            return base.decode(data, base.Roster)  # type: ignore[no-any-return]

        return self._call(_roster)

    def wait_received(self, plan: base.Plan) -> str:
        """Wait until every engine worker of this replica has received ``plan`` in the background;
        their checksum, or TransferFailed naming the first error / the deadline."""

        def _wait(store: dist.TCPStore) -> str:
            deadline = time.monotonic() + plan.timeout_seconds
            keys = [rendezvous.received_key(plan.seq, self.replica, rank) for rank in range(self.ranks)]
            outcomes = {bytes(rendezvous.get_by(store, key, deadline)).decode() for key in keys}
            errors = sorted(o for o in outcomes if o.startswith("error:"))
            if errors or len(outcomes) != 1:
                raise TransferFailed(errors[0] if errors else f"workers disagree: {sorted(outcomes)}")
            return outcomes.pop()

        try:
            return self._call(_wait)
        except rendezvous.DeadlineExceeded as exc:
            raise TransferFailed(str(exc)) from None

    def leave(self, timeout: float = LEAVE_TIMEOUT_S) -> None:
        """Say bye: this process stops taking part (a stop, a scale-down), so the trainer's next plan
        leaves it out, and a round that already counts on it stops waiting for it, instead of waiting
        until the deadline. On a connection of its own (the plan watcher's thread may be inside a call
        on the link's), in a daemon thread given ``timeout`` seconds in all: a trainer that is gone,
        frozen, or answers slowly forever delays the stop by at most that, and one that misses the bye
        drops the replica at its deadline as before."""
        if not self._trainer:
            return  # never reached the trainer: nothing to leave
        bye = threading.Thread(
            target=self._say_bye, args=(timeout,), name="asyncrl-weight-sync-bye", daemon=True
        )
        bye.start()
        bye.join(timeout)
        if bye.is_alive():
            log.info(
                "weight sync: bye not said within %g s: the trainer drops this replica at its deadline",
                timeout,
            )

    def _say_bye(self, timeout: float) -> None:
        try:
            store = rendezvous.connect_store(self.host, self.port, timeout / 3)
            if rendezvous.read_str(store, rendezvous.TRAINER) == self._trainer:
                n = store.add(rendezvous.BYE_SEQ, 1)
                store.set(rendezvous.bye_key(n), base.encode(self.hello))
                log.info("weight sync: replica %d said bye (incarnation %s)", self.replica, self.incarnation)
        except (RuntimeError, OSError) as exc:
            log.info("weight sync: bye not said (%s): the trainer drops this replica at its deadline", exc)

    def ack(self, plan: base.Plan, checksum: str, apply_seconds: float) -> None:
        ack = base.Ack(self.replica, self.incarnation, checksum, apply_seconds)
        self._call(lambda store: store.set(rendezvous.ack_key(plan.seq, self.replica), base.encode(ack)))
