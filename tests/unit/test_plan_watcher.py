"""The rollout's plan watcher (rollout/planwatch.py ``PlanWatcher``) against a real TCPStore, hosted as
the trainer hosts it, through a real ``ReplicaLink``: what the control loop is woken for."""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch.distributed as dist
from asyncrl_api import config
from asyncrl_testing import jobs, netfaults
from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.local import process
from asyncrl_workloads.rewards import scorer as scorer_mod
from asyncrl_workloads.rollout import main as rollout_main
from asyncrl_workloads.rollout import planwatch, worker
from asyncrl_workloads.weightsync import base, rendezvous, replica


def announce(store: dist.TCPStore, seq: int, version: int) -> base.Plan:
    """What the trainer's sender writes for a round (weightsync/sender.py)."""
    plan = base.Plan(
        seq=seq, version=version, candidates=(base.Member(0, "someone-else", 1),), tensors=(),
        buckets=(), timeout_seconds=5.0, trainer="t", bucket_bytes=1 << 20, registered=1,
    )  # fmt: skip
    store.set(rendezvous.plan_key(seq), base.encode(plan))
    store.set(rendezvous.PLAN_SEQ, str(seq))
    return plan


@pytest.fixture
def store() -> dist.TCPStore:
    trainer_store = rendezvous.host_store(0, 10)
    trainer_store.set(rendezvous.TRAINER, "trainer-1")
    return trainer_store


def test_wakes_for_the_connection_then_only_for_new_plans(store: dist.TCPStore) -> None:
    link = replica.ReplicaLink("127.0.0.1", store.port, replica=0)
    watcher = planwatch.PlanWatcher(link, period_s=0.01)

    async def scenario() -> None:
        assert await asyncio.wait_for(watcher.next(0), 10) is None  # connected: epoch moved
        assert link.epoch == 1
        assert rendezvous.peek_int(store, rendezvous.HELLO_SEQ) == 1  # and said hello
        waiting = asyncio.ensure_future(watcher.next(link.epoch))
        await asyncio.sleep(0.3)  # ~30 polls with nothing new: the loop is not woken
        assert not waiting.done()
        plan = announce(store, 1, version=1)
        assert await asyncio.wait_for(waiting, 10) == plan

    try:
        asyncio.run(scenario())
    finally:
        watcher.close()


def test_a_plan_that_arrives_while_no_one_waits_is_kept(store: dist.TCPStore) -> None:
    link = replica.ReplicaLink("127.0.0.1", store.port, replica=0)
    watcher = planwatch.PlanWatcher(link, period_s=0.01)

    async def scenario() -> None:
        await asyncio.wait_for(watcher.next(0), 10)
        with pytest.raises(TimeoutError):  # the control loop gave up waiting (cancelled)
            await asyncio.wait_for(watcher.next(link.epoch), 0.2)
        plan = announce(store, 1, version=3)
        await asyncio.sleep(0.3)  # the watcher finds it while no one waits
        assert await asyncio.wait_for(watcher.next(link.epoch), 10) == plan
        later = announce(store, 2, version=4)  # and goes on peeking afterwards
        assert await asyncio.wait_for(watcher.next(link.epoch), 10) == later

    try:
        asyncio.run(scenario())
    finally:
        watcher.close()


def test_an_unreachable_trainer_is_handed_to_the_control_loop() -> None:
    port = process.free_port()  # nobody listens on it
    link = replica.ReplicaLink("127.0.0.1", port, replica=0, connect_timeout=0.5)
    watcher = planwatch.PlanWatcher(link, period_s=0.01)
    try:
        with pytest.raises(replica.TrainerUnreachable, match=f"127.0.0.1:{port}") as raised:
            asyncio.run(asyncio.wait_for(watcher.next(0), 30))
        assert raised.value.refused  # nothing listens: retried every second
    finally:
        watcher.close()


def test_retries_back_off_unless_the_store_refuses() -> None:
    waits, last = [], None
    for _ in range(7):  # a frozen trainer: every try costs the timeout
        last = planwatch.retry_after_s(last, refused=False)
        waits.append(last)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 16.0, 16.0]
    assert planwatch.retry_after_s(16.0, refused=True) == 1.0  # replaced: it refuses until it listens
    assert planwatch.retry_after_s(None, refused=False) == 1.0  # the first failure after a success
    assert planwatch.retry_after_s(4.0, refused=False, max_s=5.0) == 5.0  # below a short sync deadline


def test_close_ends_the_thread(store: dist.TCPStore) -> None:
    link = replica.ReplicaLink("127.0.0.1", store.port, replica=0)
    watcher = planwatch.PlanWatcher(link, period_s=0.01)
    asyncio.run(asyncio.wait_for(watcher.next(0), 10))
    watcher.close()
    watcher._thread.join(5)
    assert not watcher._thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(watcher.next(link.epoch))


def test_close_during_a_poll_ends_the_thread_once_the_poll_returns() -> None:
    """The control loop is cancelled (the rollout stops) while the watcher is inside a store connect
    that takes seconds to fail."""
    link = replica.ReplicaLink("127.0.0.1", netfaults.slamming_door(), replica=0, connect_timeout=1.0)
    watcher = planwatch.PlanWatcher(link, period_s=0.01)
    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(watcher.next(0), 0.1))
    watcher.close()  # the connect still has a few seconds to fail
    watcher._thread.join(30)
    assert not watcher._thread.is_alive()


def test_a_trainer_that_is_gone_is_reported_at_once_not_after_c10ds_retries() -> None:
    """Nothing listens: the probe is refused (an OSError) before c10d's client would retry for the
    whole timeout and again after a random back-off (9-13 s for 5 s)."""
    with pytest.raises(ConnectionRefusedError):
        rendezvous.connect_store("127.0.0.1", process.free_port(), timeout=30.0)


EXIT_DURING_A_CONNECT = """
import asyncio, atexit
from asyncrl_testing import netfaults
from asyncrl_workloads.rollout import planwatch
from asyncrl_workloads.weightsync import replica

link = replica.ReplicaLink("127.0.0.1", netfaults.slamming_door(), 0, connect_timeout=3.0)
watcher = planwatch.PlanWatcher(link, 0.01)
# atexit runs after the interpreter has joined its non-daemon threads, before it finalises
atexit.register(lambda: print("watcher alive at exit:", watcher._thread.is_alive()))

async def main() -> None:
    try:
        await asyncio.wait_for(watcher.next(0), 0.5)  # the watcher is now inside a 3 s store connect
    except TimeoutError:
        pass
    watcher.close()  # as the control loop does when cancelled; the thread is still connecting

asyncio.run(main())
"""


def test_a_rollout_that_stops_during_a_store_connect_exits_cleanly() -> None:
    """A watcher thread still inside torch's TCPStore connect when the interpreter finalises aborts
    the process ("terminate called without an active exception", seen in CI): the interpreter must
    wait for the thread to leave the call."""
    tools = str(pathlib.Path(netfaults.__file__).parents[1])  # asyncrl_testing is not installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tools, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", EXIT_DURING_A_CONNECT], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "watcher alive at exit: False" in done.stdout


# ---- a trainer that is there but does not answer (SIGSTOPped; a partitioned node looks the same) ----
FROZEN_AFTER = 1.0  # the link's timeout in these tests: every store call ends within it
BOUND = 15.0  # what "ends" means here; c10d alone would wait until the trainer thaws (forever)

TRAINER = """
import time
from asyncrl_workloads.weightsync import rendezvous
store = rendezvous.host_store(0, 10)
store.set(rendezvous.TRAINER, "trainer-1")
print(store.port, flush=True)
time.sleep(600)
"""


@pytest.fixture
def trainer() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A process hosting the rendezvous store as trainer rank 0 does (it can be frozen; this one can't)."""
    proc = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc, int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


def outcome_within(fn: Callable[[], object], bound: float) -> object:
    """``fn()``'s result or exception, from a thread; fails if it has neither after ``bound`` seconds."""
    box: list[object] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound)
    assert box, f"still blocked after {bound} s"
    return box[0]


def test_a_store_that_accepts_but_never_answers_is_given_up_after_the_timeout() -> None:
    """c10d's handshake waits for a reply with no timeout at all (measured: >60 s for a 1 s timeout)."""
    with netfaults.deaf_listener() as port:
        got = outcome_within(lambda: rendezvous.connect_store("127.0.0.1", port, FROZEN_AFTER), BOUND)
    assert isinstance(got, rendezvous.StoreNotAnswering), got
    assert f"127.0.0.1:{port}" in str(got) and "did not answer within 1 s" in str(got)


def test_calls_on_a_frozen_trainer_fail_and_the_link_reconnects_once_it_thaws(
    trainer: tuple[subprocess.Popen[str], int],
) -> None:
    proc, port = trainer
    link = replica.ReplicaLink("127.0.0.1", port, replica=0, connect_timeout=FROZEN_AFTER)
    assert link.poll() is None and link.epoch == 1  # connected, nothing announced
    with netfaults.frozen(proc.pid):
        got = outcome_within(link.poll, BOUND)  # on the connection made before the freeze
        assert isinstance(got, replica.TrainerUnreachable) and not got.refused, got
        got = outcome_within(link.poll, BOUND)  # a new connection: the handshake is not answered
        assert isinstance(got, replica.TrainerUnreachable) and "did not answer" in str(got), got
        assert not got.refused  # it cost the timeout: the control loop backs off (planwatch.retry_after_s)
    writer = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
    plan = announce(writer, 1, version=2)
    assert outcome_within(link.poll, BOUND) == plan  # connected again (the old stream is dropped)
    assert link.epoch == 2


def test_a_watcher_polling_a_frozen_trainer_ends_when_closed(
    trainer: tuple[subprocess.Popen[str], int],
) -> None:
    """The rollout stops while its trainer is frozen: the watcher thread, which the interpreter waits
    for at exit, leaves its store call within the link's timeout instead of when the trainer thaws."""
    proc, port = trainer
    link = replica.ReplicaLink("127.0.0.1", port, replica=0, connect_timeout=FROZEN_AFTER)
    watcher = planwatch.PlanWatcher(link, period_s=0.01)
    asyncio.run(asyncio.wait_for(watcher.next(0), 10))
    with netfaults.frozen(proc.pid):
        with pytest.raises(replica.TrainerUnreachable):  # the control loop is told, and retries
            asyncio.run(asyncio.wait_for(watcher.next(link.epoch), BOUND))
        with pytest.raises(TimeoutError):  # asks again: the watcher is inside a store call
            asyncio.run(asyncio.wait_for(watcher.next(link.epoch), 0.2))
        watcher.close()
        watcher._thread.join(BOUND)
        assert not watcher._thread.is_alive()


def test_a_partitioned_trainer_is_not_a_refusal() -> None:
    """A connect that is never accepted (SYNs dropped; here a listener whose accept queue is full)
    times out in the link's probe, before c10d, after the timeout: backed off from, not retried
    every second."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        fillers = []
        try:
            for _ in range(8):  # fill the accept queue; later SYNs are dropped
                filler = socket.socket()
                filler.setblocking(False)
                filler.connect_ex(("127.0.0.1", port))
                fillers.append(filler)
            link = replica.ReplicaLink("127.0.0.1", port, replica=0, connect_timeout=FROZEN_AFTER)
            got = outcome_within(link.poll, BOUND)
        finally:
            for filler in fillers:
                filler.close()
    assert isinstance(got, replica.TrainerUnreachable) and not got.refused, got
    assert "timed out" in str(got)


@pytest.mark.parametrize(("deadline", "longest"), [(120, 16.0), (10, 5.0), (1, 1.0)])
def test_the_back_off_stays_within_half_the_weight_sync_deadline(deadline: int, longest: float) -> None:
    """A thawed trainer's first round waits `timeoutSeconds` for hellos: a rollout backing off still
    tries at least twice within it."""
    spec = jobs.deep_merge(
        jobs.BASE_SPEC, {"model": {"path": "/m"}, "weightSync": {"timeoutSeconds": deadline}}
    )
    endpoints = config.Endpoints(nats_url="nats://127.0.0.1:4222", trainer_host="t", weight_sync_port=29600)
    cfg = config.JobConfig(name="j", namespace="ns", spec=spec, endpoints=endpoints)
    assert rollout_main.worker_settings(cfg, replica=0).retry_max_s == longest


def test_an_engine_that_cannot_reach_the_store_backs_off_says_so_once_and_stops_at_once(
    store: dist.TCPStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The link reached the trainer's store, but the engine workers' own connection to it fails
    (a trainer frozen in between): the control loop retries with the link's back-off, one warning
    per streak, and a stop does not wait out the back-off."""
    tries: list[float] = []

    class UnreachableEngine:
        version = 0

        async def init_weight_sync(self, *args: Any) -> None:
            tries.append(time.monotonic())
            raise RuntimeError("store connect timed out")

    async def publish(traj: Any) -> bool:
        raise AssertionError("nothing is generated here")

    link = replica.ReplicaLink("127.0.0.1", store.port, replica=0)
    settings = worker.WorkerSettings(job="j", replica=0, n=1, max_tokens=4, poll_s=0.01, retry_max_s=8.0)
    bound = metrics_mod.bind(metrics_mod.Identity(namespace="ns", job="j", role="rollout", replica="0"))
    rollout = worker.RolloutWorker(
        settings, UnreachableEngine(), link, publish, scorer_mod.Scorer(lambda r, s: 0.0), [],  # type: ignore[arg-type]
        lambda t: [1], bound,
    )  # fmt: skip

    async def scenario() -> float:
        stop = asyncio.Event()
        control = asyncio.create_task(rollout._control(stop))
        while len(tries) < 3:  # tries after 1 s and 2 s more; the next wait is 4 s
            await asyncio.sleep(0.01)
        stop.set()
        stopped_at = time.monotonic()
        await asyncio.wait_for(control, 10)
        return time.monotonic() - stopped_at

    with caplog.at_level(logging.DEBUG, logger=worker.__name__):
        took = asyncio.run(scenario())
    assert took < 2.0  # not the 4 s back-off
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "engine could not reach" in r.getMessage()]
    assert [m.rsplit(" ", 2)[-2] for _, m in said] == ["1", "2", "4"]
    assert [level for level, _ in said] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert tries[1] - tries[0] >= 1.0 and tries[2] - tries[1] >= 2.0


@pytest.mark.parametrize("trickle_s", [None, 0.3], ids=["never-answers", "answers-slowly-forever"])
def test_saying_bye_to_a_trainer_that_does_not_answer_is_bounded(trickle_s: float | None) -> None:
    """A stopping rollout's bye (ReplicaLink.leave) to a trainer store that accepts and then never answers,
    or dribbles a byte every 0.3 s forever (no per-read timeout fires), costs at most its timeout."""
    with netfaults.deaf_listener(trickle_s) as port:
        link = replica.ReplicaLink("127.0.0.1", port, replica=0, connect_timeout=1.0)
        link._trainer = "a-trainer-this-link-reached-before"  # as after a connection (leave needs one)
        t0 = time.monotonic()
        link.leave(timeout=1.5)
        assert time.monotonic() - t0 < 2.5
