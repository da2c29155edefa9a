"""The rollout's view of the trainer between weight updates: ``PlanWatcher`` (new plans, reconnections
and failures, polled from a thread of its own) and ``retry_after_s`` (the back-off after a failed try at
the trainer's store).

Used by the rollout worker's control loop (``rollout/worker.py``) and by ``rollout/main.py`` (the
back-off's ceiling from the weight-sync deadline). Kept apart from the worker, which generates.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from asyncrl_workloads.weightsync import base, replica

RETRY_S = 1.0
"""Wait before asking an unreachable trainer's store again."""
RETRY_MAX_S = 16.0
"""Longest wait while the store keeps failing other than by refusing (``TrainerUnreachable.refused``)."""


def retry_after_s(last_s: float | None, refused: bool, max_s: float = RETRY_MAX_S) -> float:
    """The wait before the next try at the trainer's store, after a failed one (``last_s``: the wait
    before that try, None after a success). A refused connection (the trainer restarting) is retried
    every second: it costs a millisecond. Other failures (a frozen trainer's store accepts and does
    not answer; a partitioned one does not even accept) cost the link's timeout per try, and a frozen
    store makes c10d log two ~20-line C++ stack traces per try (torch 2.13; no switch turns them off),
    so those waits double, up to ``max_s``: one try per ~20 s instead of one per ~6 s. A trainer
    replaced meanwhile is found at the next try (a new process answers, or refuses until it listens).
    The rollout sets ``max_s`` to half the weight-sync deadline at most, so a thawed trainer's first
    round still finds it."""
    if refused or last_s is None:
        return RETRY_S
    return min(2 * last_s, max_s)


class PlanWatcher:
    """Polls the trainer's rendezvous every ``period_s`` from a thread of its own and hands the control
    loop only what it must act on: a new plan, a (re)connection (``link.epoch`` differs from the
    epoch the engine workers are connected at), or a failure (``TrainerUnreachable`` included).

    Why a thread of its own: polling through ``asyncio.to_thread`` every 20 ms woke the event loop
    (which also runs vLLM's front end) twice per poll and cost ~2.5% of the rollout's core
    (``tools/asyncrl_testing/bench_poll.py``). The link is used by one thread at a time: the
    watcher peeks only while the control loop waits in ``next``; the update round's own store calls
    run between two ``next``. A result that reaches a ``next`` which was cancelled meanwhile is
    kept for the following ``next``: a plan is never lost.
    """

    def __init__(self, link: replica.ReplicaLink, period_s: float) -> None:
        self._link, self._period_s = link, period_s
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._closed = threading.Event()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[base.Plan | None]] | None = None
        self._engine_epoch = 0
        self._kept: tuple[base.Plan | None, BaseException | None] | None = None
        self._thread = threading.Thread(target=self._run, name="asyncrl-plan-watcher", daemon=False)

    async def next(self, engine_epoch: int) -> base.Plan | None:
        """The next plan not seen yet; None when only the connection changed (see the class)."""
        if self._closed.is_set():
            raise RuntimeError("plan watcher closed")
        if self._kept is not None:
            (plan, exc), self._kept = self._kept, None
            if exc is not None:
                raise exc
            return plan
        loop = asyncio.get_running_loop()
        future: asyncio.Future[base.Plan | None] = loop.create_future()
        with self._lock:
            self._waiter, self._engine_epoch = (loop, future), engine_epoch
            self._wanted.set()
        if not self._thread.is_alive():
            self._thread.start()
        return await future

    def close(self) -> None:
        """Stop peeking. Does not wait: the thread may be inside a store call (seconds). It is not a
        daemon, so the interpreter waits for it at exit (meanwhile the engine shuts down): a thread
        still inside torch's TCPStore (C++) when the interpreter finalises aborts the process
        ("terminate called without an active exception"). A store call against a trainer that is
        gone fails at once (``rendezvous.connect_store``'s probe); against a frozen or partitioned
        one (it accepts, or its kernel acks, and nothing answers) it fails within the link's
        timeout (``connect_store``'s socket timeouts), so the rollout's exit waits at most that."""
        self._closed.set()
        self._wanted.set()

    def _run(self) -> None:
        while not self._closed.is_set():  # checked after every hand-over: that clears ``_wanted``
            self._wanted.wait()
            if self._closed.is_set():
                return
            with self._lock:
                engine_epoch = self._engine_epoch
            result: tuple[base.Plan | None, BaseException | None]
            try:
                plan = self._link.poll()
            except BaseException as exc:  # handed to the control loop, which decides
                result = (None, exc)
            else:
                if plan is None and self._link.epoch == engine_epoch:
                    self._closed.wait(self._period_s)
                    continue
                result = (plan, None)
            with self._lock:  # to whoever waits now; the loop asks again only after delivery
                self._wanted.clear()
                assert self._waiter is not None
                loop, future = self._waiter
            with contextlib.suppress(RuntimeError):  # the event loop closed meanwhile
                loop.call_soon_threadsafe(self._deliver, future, result)

    def _deliver(
        self, future: asyncio.Future[base.Plan | None], result: tuple[base.Plan | None, BaseException | None]
    ) -> None:
        if future.done():  # that ``next`` was cancelled: keep the result for the following one
            self._kept = result
        elif result[1] is not None:
            future.set_exception(result[1])
        else:
            future.set_result(result[0])
