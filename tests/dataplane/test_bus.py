"""The trajectory bus against a real nats-server: queue limits, backpressure, dedup, ack-after-step.

Uses the `nats_server` fixture (tests/dataplane/conftest.py). Each test drives the same classes the
rollout (Publisher) and the trainer (Consumer, Inbox, Ledger) use in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time

import nats
import pytest
from asyncrl_api import status as api_status
from asyncrl_testing import netfaults
from asyncrl_workloads import metrics
from asyncrl_workloads.bus import codec, jetstream, trajectory
from asyncrl_workloads.local import natsserver
from asyncrl_workloads.trainer import batcher, checkpoint, inbox, progress, staleness, steplog

pytestmark = pytest.mark.dataplane


def make(
    prompt: int, sample: int = 0, group_size: int = 1, version: int = 0, reward: float | None = None
) -> trajectory.Trajectory:
    return trajectory.Trajectory(
        id=trajectory.trajectory_id("bus", 0, str(prompt), sample),
        job="bus",
        replica=0,
        group_id=f"bus:p{prompt}",
        group_size=group_size,
        sample_index=sample,
        prompt_ids=[1, 2],
        response_ids=[3, 4],
        behaviour_logprobs=[-0.5, -0.25],
        versions=[version, version],
        mask=[1, 1],
        reward=float(prompt) if reward is None else reward,
        created_at=time.time(),
    )


def bound(job: str) -> metrics.Bound:
    return metrics.bind(metrics.Identity("test", job, "rollout", "0"))


async def _connect(url, settings=None):
    """A connection and its JetStream context; with ``settings``, that job's stream created first."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    if settings is not None:
        await jetstream.ensure_stream(js, settings)
    return nc, js


def test_drop_oldest_keeps_the_newest_and_counts_the_rest(nats_server):
    async def scenario():
        settings = jetstream.StreamSettings("test", "dropoldest", max_size=5, when_full="dropOldest")
        nc, js = await _connect(nats_server.url, settings)
        pub = jetstream.Publisher(js, settings, bound("dropoldest"))
        for i in range(10):
            assert await pub.publish(make(i))
        consumer = jetstream.Consumer(js, settings)
        await consumer.open()
        state = await consumer.state()
        got = await consumer.fetch(10, 1.0)
        await nc.close()
        return state, [r.trajectory.id for r in got]

    state, ids = asyncio.run(scenario())
    assert (state.messages, state.first_seq, state.last_seq) == (5, 6, 10)
    assert jetstream.queue_full_drops(state, acked_total=0) == 5
    assert ids == [trajectory.trajectory_id("bus", 0, str(i), 0) for i in range(5, 10)]


def test_block_backs_off_until_the_trainer_acks_and_loses_nothing(nats_server):
    async def scenario():
        settings = jetstream.StreamSettings("test", "block", max_size=3, when_full="block")
        nc, js = await _connect(nats_server.url, settings)
        pub = jetstream.Publisher(js, settings, bound("block"), max_backoff_s=0.05)
        for i in range(3):
            await pub.publish(make(i))
        fourth = asyncio.create_task(pub.publish(make(3)))
        await asyncio.sleep(0.5)
        blocked_while_full = not fourth.done()
        backoffs_while_full = pub.backoffs
        consumer = jetstream.Consumer(js, settings)
        await consumer.open()
        first = await consumer.fetch(1, 1.0)
        await first[0].msg.ack()
        await asyncio.wait_for(fourth, 5.0)
        state = await consumer.state()
        rest = await consumer.fetch(10, 1.0)
        await nc.close()
        return (
            blocked_while_full,
            backoffs_while_full,
            pub.blocked_seconds,
            state,
            [r.trajectory.id for r in first + rest],
        )

    blocked, backoffs, blocked_s, state, ids = asyncio.run(scenario())
    assert blocked and backoffs >= 3 and blocked_s > 0
    assert (state.last_seq, state.messages) == (4, 3)
    assert jetstream.queue_full_drops(state, acked_total=1) == 0
    assert sorted(ids) == sorted(trajectory.trajectory_id("bus", 0, str(i), 0) for i in range(4))


def test_a_republished_trajectory_is_stored_once(nats_server):
    async def scenario():
        settings = jetstream.StreamSettings("test", "dedup", max_size=10)
        nc, js = await _connect(nats_server.url, settings)
        pub = jetstream.Publisher(js, settings)
        results = [await pub.publish(make(1)), await pub.publish(make(1)), await pub.publish(make(2))]
        info = await js.stream_info(settings.stream)
        await nc.close()
        return results, info.state.messages

    results, stored = asyncio.run(scenario())
    assert results == [True, False, True]
    assert stored == 2


def test_a_publish_stored_by_another_stream_is_an_error_and_carries_only_the_dedup_header(nats_server):
    """The publisher checks the stream named in the ack (it sends no Nats-Expected-Stream header)."""

    async def scenario():
        settings = jetstream.StreamSettings("test", "foreign", max_size=10)
        nc, js = await _connect(nats_server.url)
        await js.add_stream(name="SOMEONE_ELSE", subjects=[settings.subject])
        pub = jetstream.Publisher(js, settings)
        with pytest.raises(jetstream.WrongStream, match="SOMEONE_ELSE") as caught:
            await pub.publish(make(1))
        await js.delete_stream("SOMEONE_ELSE")
        ours = jetstream.StreamSettings("test", "headers", max_size=10)
        await jetstream.ensure_stream(js, ours)
        assert await jetstream.Publisher(js, ours).publish(make(2))
        stored = await js.get_msg(ours.stream, seq=1)
        await nc.close()
        return str(caught.value), stored.headers

    message, headers = asyncio.run(scenario())
    assert jetstream.StreamSettings("test", "foreign", max_size=10).stream in message
    assert headers == {"Nats-Msg-Id": trajectory.trajectory_id("bus", 0, "2", 0)}


def test_a_straggler_published_while_a_batch_waits_goes_into_that_batch_oldest_first(nats_server, tmp_path):
    """Four groups of version 3 are pulled; a step takes two and two stay held (a full batch). Then a
    group that was started at version 1 finishes. The next step takes it (the short sweep pulls it, the
    batcher serves the oldest version first) instead of leaving it behind the newer groups, where at
    version 4 it would be dropped as stale (maxStaleness 2) and its generation wasted."""

    async def scenario():
        settings = jetstream.StreamSettings("test", "edf", max_size=100)
        nc, js = await _connect(nats_server.url, settings)
        pub = jetstream.Publisher(js, settings)
        for p in range(4):
            await pub.publish(make(p, version=3))
        consumer, intake = _intake(js, settings, checkpoint.Ledger.load(tmp_path / "ledger"), max_staleness=2)
        await consumer.open()
        stop = asyncio.Event()
        first = await intake.next_batch(3, stop, wait_s=5.0)
        held = intake.batcher.held()
        await pub.publish(make(9, version=1))
        second = await intake.next_batch(3, stop, wait_s=5.0)
        await nc.close()
        return first, held, second

    first, held, second = asyncio.run(scenario())
    assert [t.trajectory.group_id for t in first] == ["bus:p0", "bus:p1"]
    assert held == 2
    assert [(t.trajectory.group_id, t.staleness) for t in second] == [("bus:p9", 2), ("bus:p2", 0)]


async def record_and_ack(intake, step, taken, version=0):
    """What trainer/loop.py does after an optimizer step on `taken`: record the step in the ledger
    (saying how many samples came from a stream left behind), then ack each sample."""
    ids = [t.trajectory.id for t in taken]
    intake.ledger.record_step(step, version, ids, intake.elsewhere(t.received for t in taken))
    for t in taken:
        await intake.consumer.ack(t.received)


async def settled(consumer, messages, timeout_s=10.0):
    """The queue state once it holds `messages` (after `timeout_s` whatever it holds: the test then
    fails on it). JetStream applies acks asynchronously: a state read right after `flush()` can still
    count messages whose acks the server has received (seen under CI load: 3 instead of 0)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = await consumer.state()
        if state.messages == messages or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.05)


def _intake(js, settings, ledger, max_staleness=1, prompts_per_step=2, max_zero_variance_drops=None):
    consumer = jetstream.Consumer(js, settings)
    return consumer, inbox.Inbox(
        consumer,
        staleness.StalenessFilter(max_staleness),
        batcher.GroupBatcher(prompts_per_step, 30.0),
        ledger,
        metrics.bind(metrics.Identity("test", settings.job, "trainer", "0")),
        fetch_timeout_s=0.2,
        max_zero_variance_drops=max_zero_variance_drops,
    )


def test_unacked_samples_come_back_after_a_crash_and_are_never_trained_twice(nats_server, tmp_path):
    """Trainer 1 takes a batch, records the step in its ledger and dies before acking. Trainer 2 gets the
    same messages at once (the consumer is re-created), recognises them, acks without training, and
    trains only the samples it has not seen. Stale and invalid samples are dropped and counted."""
    ledger_path = tmp_path / checkpoint.LEDGER

    async def scenario():
        settings = jetstream.StreamSettings("test", "crash", max_size=100)
        nc, js = await _connect(nats_server.url, settings)
        pub = jetstream.Publisher(js, settings)
        for p in range(4):
            for s in range(2):
                await pub.publish(make(p, s, group_size=2, version=3))
        await pub.publish(make(9, 0, version=0))  # staleness 3 > 1 at trainer version 3
        await js.publish(settings.subject, b"not a trajectory")

        consumer, intake = _intake(js, settings, checkpoint.Ledger.load(ledger_path))
        await consumer.open()
        stop = asyncio.Event()
        first = await intake.next_batch(3, stop, wait_s=5.0)
        wasted = intake.dropped_stale_tokens  # the stale sample was pulled and dropped by trainer 1
        intake.ledger.record_step(1, 3, [t.trajectory.id for t in first])  # the step happened ...
        await nc.close()  # ... and the trainer died before acking

        nc, js = await _connect(nats_server.url)
        consumer, intake = _intake(js, settings, checkpoint.Ledger.load(ledger_path))
        await consumer.open()
        second = await intake.next_batch(3, stop, wait_s=5.0)
        for t in second:
            await t.received.msg.ack()
        await nc.flush()
        intake.ledger.record_step(2, 3, [t.trajectory.id for t in second])
        left = await intake.next_batch(3, stop, wait_s=1.0)
        state = await settled(consumer, 0)
        await nc.close()
        return first, second, left, intake, state, wasted

    first, second, left, intake, state, wasted = asyncio.run(scenario())
    first_ids = {t.trajectory.id for t in first}
    second_ids = {t.trajectory.id for t in second}
    assert len(first_ids) == 4 and len(second_ids) == 4
    assert not first_ids & second_ids
    assert left == []
    assert intake.redeliveries_skipped == 4
    assert (intake.ledger.dropped_stale, intake.ledger.dropped_invalid) == (1, 1)
    assert wasted == len(make(9, 0, version=0).response_ids)  # the generation that was wasted
    assert state.messages == 0
    assert intake.ledger.acked_total == state.last_seq  # 8 trained + 1 stale + 1 invalid: all accounted


async def publish_groups(pub, rewards: dict[int, tuple[float, ...]]) -> None:
    """Prompt p's group: one sample per reward (version 0)."""
    for p, group in rewards.items():
        for s, reward in enumerate(group):
            await pub.publish(make(p, s, group_size=len(group), reward=reward))


def groups_of(taken) -> list[str]:
    return list(dict.fromkeys(t.trajectory.group_id for t in taken))


class Captured:
    """A progress sink that keeps the last report (what the trainer would apply to status.progress)."""

    def __init__(self):
        self.progress = None

    def write(self, progress_body, extras):
        self.progress = progress_body


def test_equal_reward_groups_are_acked_and_counted_and_the_step_is_filled_from_later_groups(
    nats_server, tmp_path
):
    """Dynamic sampling at 2 groups per step, at most 2 dropped per step. Step 1: of u0, v1, u2 (u: all
    rewards equal) u0 and u2 are dropped and v1 waits for a second group, which the bus brings later:
    u3 is equal too, but the step has used its bound, so it trains. Step 2 (a new bound) drops u5 and
    takes v4 and v6. Every message ends acked and counted once: trained, or dropped{zero_variance}
    (the ledger, the metric, the step log and status.progress agree); a copy of a dropped sample that
    comes again is acked as seen, never counted again."""
    log_path = tmp_path / "steps.jsonl"

    async def scenario():
        settings = jetstream.StreamSettings("test", "zerovar", max_size=100)
        nc, js = await _connect(nats_server.url, settings)
        pub = jetstream.Publisher(js, settings)
        consumer, intake = _intake(
            js, settings, checkpoint.Ledger.load(tmp_path / "ledger"), max_zero_variance_drops=2
        )
        await consumer.open()
        sink = Captured()
        steps = steplog.StepLog(log_path, intake, intake.metrics, progress.Reporter(sink, 1.0))
        counted = intake.metrics.dropped["zero_variance"]
        before = counted._value.get()
        stop = asyncio.Event()
        await publish_groups(pub, {0: (1.0, 1.0), 1: (0.0, 1.0), 2: (0.0, 0.0)})
        waiting = await intake.next_batch(0, stop, wait_s=0.5)  # one group short of a step
        await publish_groups(pub, {3: (1.0, 1.0), 4: (1.0, 0.0)})
        first = await intake.next_batch(0, stop, wait_s=5.0)
        first_counts = intake.step_zero_variance
        await record_and_ack(intake, 1, first)
        steps.write(1, 0, {}, first, None)
        await publish_groups(pub, {5: (0.5, 0.5), 6: (0.0, 0.5)})
        second = await intake.next_batch(0, stop, wait_s=5.0)
        second_counts = intake.step_zero_variance
        await record_and_ack(intake, 2, second)
        steps.write(2, 0, {}, second, None)
        await js.publish(settings.subject, codec.encode_trajectory(make(0, 1, group_size=2, reward=1.0)))
        again = await intake.next_batch(0, stop, wait_s=0.5)  # the copy, without a dedup header
        await nc.flush()
        state = await settled(consumer, 0)
        steps.report(2, 0, None, None, {}, force=True)
        await nc.close()
        return (
            waiting,
            first,
            first_counts,
            second,
            second_counts,
            again,
            intake,
            state,
            counted._value.get() - before,
            sink,
        )

    waiting, first, first_counts, second, second_counts, again, intake, state, metric, sink = asyncio.run(
        scenario()
    )
    assert waiting == []
    assert (groups_of(first), first_counts) == (["bus:p1", "bus:p3"], (2, 1))
    assert (groups_of(second), second_counts) == (["bus:p4", "bus:p6"], (1, 0))
    assert (intake.ledger.dropped_zero_variance, metric) == (6, 6)  # u0, u2, u5: samples
    assert intake.ledger.zero_variance_kept == 2  # u3's samples, trained at the bound
    assert again == [] and intake.redeliveries_skipped == 1
    assert state.messages == 0 and intake.ledger.acked_total == state.last_seq - 1  # the copy: seen
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [(r["zero_variance_dropped_groups"], r["zero_variance_kept_groups"]) for r in lines] == [
        (2, 1),
        (1, 0),
    ]
    reported = api_status.Progress.model_validate(sink.progress)  # what status.progress accepts
    assert reported.dropped is not None
    assert (reported.dropped.zero_variance, reported.dropped.stale, reported.zero_variance_kept) == (6, 0, 2)


def test_an_equal_reward_group_dropped_before_a_crash_is_not_counted_again(nats_server, tmp_path):
    """Trainer 1 drops an equal-reward group (ledger first) and dies before its acks leave; trainer 2
    gets those messages again, recognises them from the ledger and acks them without counting them."""
    ledger_path = tmp_path / checkpoint.LEDGER

    async def scenario():
        settings = jetstream.StreamSettings("test", "zerovarcrash", max_size=100)
        nc, js = await _connect(nats_server.url, settings)
        pub = jetstream.Publisher(js, settings)
        await publish_groups(pub, {0: (1.0, 1.0), 1: (0.0, 1.0), 2: (1.0, 0.0)})
        consumer, intake = _intake(
            js, settings, checkpoint.Ledger.load(ledger_path), max_zero_variance_drops=8
        )
        await consumer.open()

        async def dies_before_acking(received):
            pass

        consumer.ack = dies_before_acking
        stop = asyncio.Event()
        first = await intake.next_batch(0, stop, wait_s=5.0)  # u0 dropped and recorded, not acked
        await nc.close()

        nc, js = await _connect(nats_server.url)
        consumer, intake = _intake(
            js, settings, checkpoint.Ledger.load(ledger_path), max_zero_variance_drops=8
        )
        await consumer.open()
        counted = intake.metrics.dropped["zero_variance"]
        before = counted._value.get()
        second = await intake.next_batch(0, stop, wait_s=5.0)
        await record_and_ack(intake, 1, second)
        await nc.flush()
        state = await settled(consumer, 0)
        await nc.close()
        return first, second, intake, state, counted._value.get() - before

    first, second, intake, state, metric = asyncio.run(scenario())
    assert groups_of(first) == groups_of(second) == ["bus:p1", "bus:p2"]  # the step never happened
    assert (intake.redeliveries_skipped, intake.ledger.dropped_zero_variance, metric) == (2, 2, 0)
    assert state.messages == 0 and intake.ledger.acked_total == state.last_seq


async def _full_stream_of_three(url: str, job: str):
    """A 3-message dropOldest stream holding 3 samples, and the trainer's consumer opened on it."""
    settings = jetstream.StreamSettings("test", job, max_size=3, when_full="dropOldest")
    nc, js = await _connect(url, settings)
    pub = jetstream.Publisher(js, settings)
    for i in range(3):
        await pub.publish(make(i))
    consumer = jetstream.Consumer(js, settings)
    await consumer.open()
    return nc, pub, consumer


def test_a_held_sample_discarded_by_the_server_is_not_counted_as_dropped(nats_server):
    """The trainer pulled 3 samples (unacked); 3 more publishes push the first 3 out of a 3-message stream.
    Those are not lost - the trainer trains and acks them - so only later, never-seen discards count."""

    async def scenario():
        nc, pub, consumer = await _full_stream_of_three(nats_server.url, "held")
        held = await consumer.fetch(3, 1.0)
        for i in range(3, 6):
            await pub.publish(make(i))
        seqs = [r.stream_seq for r in held]
        while_held = await consumer.state()
        for r in held:  # trained, then acked (the server has discarded them already)
            await r.msg.ack()
        await nc.flush()
        for i in range(6, 8):  # 2 more: discards seqs 4 and 5, which the trainer never saw
            await pub.publish(make(i))
        after = await consumer.state()
        await nc.close()
        return seqs, while_held, after

    seqs, while_held, after = asyncio.run(scenario())
    assert seqs == [1, 2, 3]
    assert (while_held.first_seq, while_held.last_seq, while_held.messages) == (4, 6, 3)
    assert jetstream.queue_full_drops(while_held, acked_total=0) == 3  # naive: would count the held ones
    assert jetstream.queue_full_drops(while_held, acked_total=0, held_seqs=seqs) == 0
    assert jetstream.queue_full_drops(after, acked_total=3) == 2


def test_a_sample_buffered_in_the_client_and_discarded_by_the_server_is_not_counted_as_dropped(nats_server):
    """The trainer's pull was answered after its timeout, so the server delivered 3 samples that wait in
    the client's buffer for the next fetch; 3 more publishes push them out of a 3-message stream. They are
    not lost (the next fetch returns them), yet neither the batcher nor the loop holds them: counted as
    queue_full, the trainer's counter (which keeps its highest value) overcounted for good (issue 35: 59
    counted, 0 lost). ``Consumer.buffered_seqs`` tells them."""

    async def scenario():
        nc, pub, consumer = await _full_stream_of_three(nats_server.url, "buffered")
        psub = consumer._sub  # a pull request no fetch waits for: what a timed-out fetch leaves behind
        await nc.publish(psub._nms, json.dumps({"batch": 3}).encode(), psub._deliver)
        for _ in range(100):
            if len(consumer.buffered_seqs()) == 3:
                break
            await asyncio.sleep(0.02)
        buffered = consumer.buffered_seqs()
        for i in range(3, 6):
            await pub.publish(make(i))
        state = await consumer.state()
        fetched = await consumer.fetch(3, 1.0)
        await nc.close()
        return buffered, state, fetched

    buffered, state, fetched = asyncio.run(scenario())
    assert buffered == [1, 2, 3]
    assert (state.first_seq, state.last_seq, state.messages) == (4, 6, 3)
    assert jetstream.queue_full_drops(state, acked_total=0) == 3  # without the buffer: an overcount
    assert jetstream.queue_full_drops(state, acked_total=0, held_seqs=buffered) == 0
    assert [r.stream_seq for r in fetched][:3] == [1, 2, 3]  # the next fetch returns them: not lost


class RestartableNats:
    """A nats-server that a test SIGKILLs and starts again on the same port (`crash`), with the rollout's
    and the trainer's connections made by the `jetstream.connect` their processes use (`clients`)."""

    def __init__(self, tmp_path):
        self.tmp, self.log, self.store = tmp_path, tmp_path / "nats-server.log", tmp_path / "store-1"
        self.servers = [natsserver.start(store_dir=self.store, log_path=self.log)]
        self.url = self.servers[0].url

    async def clients(self, settings):
        """(rollout, trainer) connections, the job's stream created."""
        rollout_nc, trainer_nc = [await jetstream.connect(self.url) for _ in range(2)]
        await jetstream.ensure_stream(rollout_nc.jetstream(), settings)
        return rollout_nc, trainer_nc

    async def crash(self, outage_s: float, keep_store: bool = True) -> None:
        """SIGKILL the server and start it again ``outage_s`` later on its port, with its JetStream store
        (a pod restarted) or an empty one (an emptyDir pod replaced)."""
        if not keep_store:
            self.store = self.tmp / f"store-{len(self.servers) + 1}"
        crash = functools.partial(netfaults.crash_nats, self.servers[-1], outage_s, self.store, self.log)
        self.servers.append(await asyncio.to_thread(crash))  # the clients' event loop runs meanwhile

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture
def restartable_nats(tmp_path):
    bus = RestartableNats(tmp_path)
    try:
        yield bus
    finally:
        bus.stop()


def test_publisher_and_consumer_ride_through_a_nats_crash_and_nothing_is_stored_or_trained_twice(
    restartable_nats, tmp_path
):
    """The bus's nats-server is SIGKILLed mid-stream and started again 7 s later on the same port and
    store (a NATS pod restarted by the kubelet): longer than a JetStream request's 5 s timeout, so a
    publish goes unanswered, its message is sent again after the reconnect, and the attempt nats-py
    buffered meanwhile arrives too. Rollout and trainer hold their own connections, made by the
    `jetstream.connect` their processes use; the trainer side is the trainer loop's intake (Inbox, ledger,
    ack after the step is recorded).

    A SIGKILLed server can also forget the last ack it got: the ack's removal of the message from the
    work-queue stream, like the consumer's state, reaches the store asynchronously. That message,
    stored once, is delivered again after the restart (seen in CI: stream seq 20 delivered at the kill
    and again 8 s later, both times as delivery 1; about 1 run in 7 here). The ledger recognises it
    and acks it without training it (a redelivery happens in some runs only;
    `test_unacked_samples_come_back_after_a_crash_and_are_never_trained_twice` proves it each run)."""
    count = 60
    settings = jetstream.StreamSettings("test", "outage", max_size=1000)
    metric = bound("outage")

    async def scenario():
        rollout_nc, trainer_nc = await restartable_nats.clients(settings)
        ledger = checkpoint.Ledger.load(tmp_path / "ledger")
        consumer, intake = _intake(trainer_nc.jetstream(), settings, ledger, prompts_per_step=1)
        await consumer.open()
        pub = jetstream.Publisher(rollout_nc.jetstream(), settings, metric)
        created = consumer.stream_created
        trained: list[str] = []
        stop = asyncio.Event()

        async def produce():
            results = []
            for i in range(count):
                results.append(await pub.publish(make(i)))
                await asyncio.sleep(0.05)
            return results

        async def train():  # trainer/loop.py's order: record the step, then ack, then flush
            while len(trained) < count:
                taken = await intake.next_batch(0, stop, wait_s=0.5)
                if not taken:
                    continue
                await record_and_ack(intake, len(trained) + 1, taken)
                trained.extend(t.trajectory.id for t in taken)
                with contextlib.suppress(*jetstream.NO_ANSWER):
                    await trainer_nc.flush()

        async def crash_and_restart():
            await asyncio.sleep(1.0)
            await restartable_nats.crash(outage_s=7.0)

        outage = asyncio.create_task(crash_and_restart())
        results, _ = await asyncio.wait_for(asyncio.gather(produce(), train()), 120)
        await outage
        left = await intake.next_batch(0, stop, wait_s=1.0)  # no copy stored beyond the 60
        await trainer_nc.flush()
        state = await settled(consumer, 0)
        await rollout_nc.close()
        await trainer_nc.close()
        return results, trained, left, state, pub.retries, created, intake.redeliveries_skipped

    results, trained, left, state, retries, created, skipped = asyncio.run(scenario())
    assert retries >= 1  # the outage was felt by the publisher
    assert results == [True] * count  # every sample counted produced exactly once
    expected = sorted(make(i).id for i in range(count))
    assert sorted(trained) == expected, f"redeliveries skipped: {skipped}"  # each trained once, none lost
    assert left == []
    assert state.last_seq == count  # stored once each, though some were sent twice
    assert state.messages == 0  # every ack made it, the ones sent during the outage too
    assert state.created == created != ""  # the same stream: the trainer counts on (no store_lost)
    labels = {"namespace": "test", "job": "outage", "role": "rollout", "replica": "0"}
    sample = metrics.REGISTRY.get_sample_value
    assert sample("asyncrl_trajectories_produced_total", labels) == count
    assert sample("asyncrl_bus_publish_retries_total", labels) == retries


def test_after_a_nats_restart_without_its_store_both_sides_create_stream_and_consumer_again(restartable_nats):
    """An emptyDir NATS pod replaced: the server comes back empty. What was queued is gone (the
    chart's `bus.nats.storage` keeps it); what is published after must still reach the trainer,
    without either process restarting."""
    settings = jetstream.StreamSettings("test", "storelost", max_size=1000)

    async def drain(consumer, want):
        got: list[str] = []
        while len(got) < want:
            for r in await consumer.fetch(16, 0.5):
                got.append(r.trajectory.id)
                await r.msg.ack()
        return got

    async def scenario():
        rollout_nc, trainer_nc = await restartable_nats.clients(settings)
        consumer = jetstream.Consumer(trainer_nc.jetstream(), settings)
        await consumer.open()
        pub = jetstream.Publisher(rollout_nc.jetstream(), settings)
        for i in range(5):
            await pub.publish(make(i))
        before = await drain(consumer, 5)
        await restartable_nats.crash(outage_s=0.0, keep_store=False)  # back with an empty store

        async def publish_after():
            return [await pub.publish(make(i)) for i in range(5, 10)]

        published = await asyncio.wait_for(publish_after(), 60)  # no stream: made again
        after = await asyncio.wait_for(drain(consumer, 5), 60)  # no consumer: made again
        await rollout_nc.close()
        await trainer_nc.close()
        return before, published, after, pub.retries

    before, published, after, retries = asyncio.run(scenario())
    assert sorted(before) == sorted(make(i).id for i in range(5))
    assert published == [True] * 5 and retries >= 1
    assert sorted(after) == sorted(make(i).id for i in range(5, 10))


@pytest.mark.parametrize("first", ["refresh", "fetch", "restart"])
def test_after_nats_lost_its_store_the_new_stream_is_counted_from_its_start(
    restartable_nats, tmp_path, first
):
    """The trainer's bookkeeping (Inbox, StepLog.refresh_queue, the ledger) across a NATS pod that came
    back empty: the samples queued in the old stream are counted dropped{reason=store_lost}, the held
    one of the old stream is not (the trainer still holds it), and the new stream's discards are counted
    queue_full, though its sequence starts again at 1 while the trainer's acks kept counting. The
    trainer may first see the new stream in its queue state (``refresh``) or, as it mostly does, train
    two steps on it before it looks (``fetch``): the counts are the same. If the trainer then dies
    still holding the old stream's message (``restart``), nobody delivers that one again: the
    restarted trainer counts it lost with the store, and not as a discard of the new stream."""
    settings = jetstream.StreamSettings("test", f"storecount-{first}", max_size=5, when_full="dropOldest")
    labels = {"namespace": "test", "job": settings.job, "role": "trainer", "replica": "0"}

    def dropped(reason):
        return metrics.REGISTRY.get_sample_value(
            "asyncrl_trajectories_dropped_total", {**labels, "reason": reason}
        )

    async def train(intake, step, version=0):  # as trainer/loop.py does: record, then ack
        batch = await intake.next_batch(version, asyncio.Event(), wait_s=30.0)
        await record_and_ack(intake, step, batch, version)

    async def scenario():
        rollout_nc, trainer_nc = await restartable_nats.clients(settings)
        pub = jetstream.Publisher(rollout_nc.jetstream(), settings)
        consumer, intake = _intake(
            trainer_nc.jetstream(), settings, checkpoint.Ledger.load(tmp_path / "ledger")
        )
        steps = steplog.StepLog(None, intake, intake.metrics, progress.Reporter(None, 1.0))
        await consumer.open()
        for i in range(4):
            await pub.publish(make(i))
        await pub.publish(make(10, 0, group_size=2))  # half a group: held, unacked
        await train(intake, 1)
        await train(intake, 2)
        for i in range(4, 8):  # queued, never pulled: lost with the store
            await pub.publish(make(i))
        await trainer_nc.flush()
        await settled(consumer, 5)
        await steps.refresh_queue()
        before = steps.counters()
        await restartable_nats.crash(outage_s=0.0, keep_store=False)
        for i in range(20, 28):  # 8 into a stream of 5: 3 discarded
            await pub.publish(make(i))
        if first == "refresh":
            await steps.refresh_queue()
        await train(intake, 3)  # the first fetch finds no consumer and makes it again
        await train(intake, 4)
        await trainer_nc.flush()
        await settled(consumer, 1)
        await steps.refresh_queue()
        if first == "restart":  # the trainer dies, still holding the old stream's half group
            await trainer_nc.close()
            trainer_nc = await jetstream.connect(restartable_nats.url)
            ledger = checkpoint.Ledger.load(tmp_path / "ledger")
            consumer, intake = _intake(trainer_nc.jetstream(), settings, ledger)
            steps = steplog.StepLog(None, intake, intake.metrics, progress.Reporter(None, 1.0))
            await consumer.open()
            await steps.refresh_queue()
        end = steps.counters()
        await rollout_nc.close()
        await trainer_nc.close()
        return before, end

    restarted = first == "restart"
    before, end = asyncio.run(scenario())
    assert (before["consumed"], before["queue_depth"], before["dropped_queue_full"]) == (4, 5, 0)
    assert (end["consumed"], end["stored"], end["queue_depth"]) == (8, 8, 1)  # 1 held, unacked
    assert (end["dropped_store_lost"], end["dropped_queue_full"]) == (5 if restarted else 4, 3)
    # One registry for both "processes" here: the restarted trainer added only what it found new.
    assert (dropped("store_lost"), dropped("queue_full")) == (5 if restarted else 4, 3)
    # A trainer started now counts the held message lost if nobody did yet, and only then.
    ledger = checkpoint.Ledger.load(tmp_path / "ledger")
    assert (ledger.lost_with_store, ledger.lost_at_load, ledger.queue_full_earlier) == (
        5,
        0 if restarted else 1,
        0,
    )


def test_an_ack_for_a_message_of_the_lost_stream_is_not_sent(restartable_nats):
    """An ack names stream, consumer and sequence, and all three are the same in the stream created
    again: a held message of the lost stream, acked, would remove the new stream's message with its
    sequence (here both are sequence 1, the new one delivered and unacked)."""
    settings = jetstream.StreamSettings("test", "oldack", max_size=100)

    async def scenario():
        rollout_nc, trainer_nc = await restartable_nats.clients(settings)
        pub = jetstream.Publisher(rollout_nc.jetstream(), settings)
        consumer = jetstream.Consumer(trainer_nc.jetstream(), settings)
        await consumer.open()
        await pub.publish(make(1))
        (old,) = await consumer.fetch(8, 5.0)
        await restartable_nats.crash(outage_s=0.0, keep_store=False)
        await pub.publish(make(2))
        new = []
        while not new:
            new = await consumer.fetch(8, 1.0)
        await consumer.ack(old)
        await trainer_nc.flush()
        await asyncio.sleep(1.0)  # an ack, had it been sent, is applied by now (asynchronously)
        after_old_ack = (await consumer.state()).messages
        await consumer.ack(new[0])
        await trainer_nc.flush()
        after_new_ack = (await settled(consumer, 0)).messages
        await rollout_nc.close()
        await trainer_nc.close()
        return old, new, after_old_ack, after_new_ack

    old, new, after_old_ack, after_new_ack = asyncio.run(scenario())
    assert (old.stream_seq, new[0].stream_seq) == (1, 1) and old.stream != new[0].stream
    assert after_old_ack == 1  # the new stream's message is still there
    assert after_new_ack == 0


def test_a_consumer_whose_re_creation_failed_half_way_tries_again_at_the_next_fetch(restartable_nats):
    """NATS came back without its store and the first attempt to create the consumer again does not
    answer after the old subscription was dropped (the bus restarting once more): the next fetches
    must try again, not pull forever into a subscription that is gone."""
    settings = jetstream.StreamSettings("test", "halfopen", max_size=100)

    async def scenario():
        rollout_nc, trainer_nc = await restartable_nats.clients(settings)
        pub = jetstream.Publisher(rollout_nc.jetstream(), settings)
        js = trainer_nc.jetstream()
        consumer = jetstream.Consumer(js, settings)
        await consumer.open()
        await restartable_nats.crash(outage_s=0.0, keep_store=False)
        for i in range(3):
            await pub.publish(make(i))
        real, failures = js.pull_subscribe, []

        async def unanswered_once(*args, **kwargs):  # the one fault: this call gets no answer
            if not failures:
                failures.append(1)
                raise nats.errors.TimeoutError
            return await real(*args, **kwargs)

        js.pull_subscribe = unanswered_once
        got: list[str] = []
        for _ in range(20):
            got += [r.trajectory.id for r in await consumer.fetch(8, 0.5)]
            if len(got) == 3:
                break
        await rollout_nc.close()
        await trainer_nc.close()
        return failures, got

    failures, got = asyncio.run(scenario())
    assert failures == [1]
    assert sorted(got) == sorted(make(i).id for i in range(3))


def test_a_held_sample_published_again_into_the_new_stream_is_acked_through_that_copy(
    restartable_nats, tmp_path
):
    """A sample stored and held (half its group) when NATS lost its store; the rollout, unanswered,
    publishes it again into the new stream. That copy is the one the trainer must ack: the held one's
    stream is gone, and an unacked copy would come back after ack_wait to be trained twice."""
    settings = jetstream.StreamSettings("test", "twostreams", max_size=100)

    async def scenario():
        rollout_nc, trainer_nc = await restartable_nats.clients(settings)
        pub = jetstream.Publisher(rollout_nc.jetstream(), settings)
        consumer, intake = _intake(
            trainer_nc.jetstream(), settings, checkpoint.Ledger.load(tmp_path / "ledger")
        )
        await consumer.open()
        await pub.publish(make(1, 0, group_size=2))
        assert await intake.next_batch(0, asyncio.Event(), wait_s=1.0) == []  # held: half a group
        await restartable_nats.crash(outage_s=0.0, keep_store=False)
        await pub.publish(make(1, 0, group_size=2))  # the same sample again, into the new stream
        await pub.publish(make(1, 1, group_size=2))
        await pub.publish(make(2))
        batch = await intake.next_batch(0, asyncio.Event(), wait_s=30.0)
        await record_and_ack(intake, 1, batch)
        await trainer_nc.flush()
        state = await settled(consumer, 0)
        await rollout_nc.close()
        await trainer_nc.close()
        return batch, state

    batch, state = asyncio.run(scenario())
    assert sorted(t.trajectory.id for t in batch) == sorted(make(*a).id for a in ((1, 0, 2), (1, 1, 2), (2,)))
    assert (state.last_seq, state.messages) == (3, 0)  # all three of the new stream acked


def test_a_group_completed_across_a_store_loss_counts_only_its_new_half_as_acked_in_the_new_stream(
    restartable_nats, tmp_path
):
    """Half a group held when NATS lost its store, its other half stored in the new stream: the step
    trains both, acks only the new one (the old stream is gone), and the new stream's discards are
    counted against the acks it got, as trainer/loop.py records them (``elsewhere``)."""
    settings = jetstream.StreamSettings("test", "acrossloss", max_size=3, when_full="dropOldest")

    async def scenario():
        rollout_nc, trainer_nc = await restartable_nats.clients(settings)
        pub = jetstream.Publisher(rollout_nc.jetstream(), settings)
        ledger = checkpoint.Ledger.load(tmp_path / "ledger")
        consumer, intake = _intake(trainer_nc.jetstream(), settings, ledger)
        steps = steplog.StepLog(None, intake, intake.metrics, progress.Reporter(None, 1.0))
        await consumer.open()
        await pub.publish(make(10, 0, group_size=2))
        assert await intake.next_batch(0, asyncio.Event(), wait_s=1.0) == []  # held: half a group
        await restartable_nats.crash(outage_s=0.0, keep_store=False)
        for args in ((10, 1, 2), (11,), (12,)):  # new stream: seqs 1, 2, 3
            await pub.publish(make(*args))
        batch = await intake.next_batch(0, asyncio.Event(), wait_s=30.0)  # groups 10 and 11
        await record_and_ack(intake, 1, batch)
        await trainer_nc.flush()
        await settled(consumer, 1)  # 12, pulled with the others and held (one group short of a step)
        for i in range(13, 17):  # seqs 4-7 into a stream of 3: seqs 3 and 4 (12, 13) discarded
            await pub.publish(make(i))
        await steps.refresh_queue()
        await rollout_nc.close()
        await trainer_nc.close()
        return batch, steps.counters()

    batch, counters = asyncio.run(scenario())
    assert len(batch) == 3
    assert (counters["consumed"], counters["stored"], counters["queue_depth"]) == (3, 7, 3)
    # 13 is lost to the full queue; 12 is not (the trainer holds it, and will train it)
    assert (counters["dropped_queue_full"], counters["dropped_store_lost"]) == (1, 0)


def test_a_restarted_trainer_counts_only_new_queue_full_drops_in_its_metric(restartable_nats, tmp_path):
    """The ledger keeps the job's queue_full count; a restarted trainer's counter must add only the
    drops it finds new (else Prometheus' increase() counts every earlier drop again at each restart)."""
    settings = jetstream.StreamSettings("test", "restartdrops", max_size=3, when_full="dropOldest")
    labels = {
        "namespace": "test",
        "job": settings.job,
        "role": "trainer",
        "replica": "0",
        "reason": "queue_full",
    }
    ledger_path = tmp_path / "ledger"

    def counted():
        return metrics.REGISTRY.get_sample_value("asyncrl_trajectories_dropped_total", labels) or 0.0

    async def trainer():
        nc = await jetstream.connect(restartable_nats.url)
        consumer, intake = _intake(nc.jetstream(), settings, checkpoint.Ledger.load(ledger_path))
        await consumer.open()
        return nc, intake, steplog.StepLog(None, intake, intake.metrics, progress.Reporter(None, 1.0))

    async def scenario():
        rollout_nc = await jetstream.connect(restartable_nats.url)
        await jetstream.ensure_stream(rollout_nc.jetstream(), settings)
        pub = jetstream.Publisher(rollout_nc.jetstream(), settings)
        for i in range(5):  # 2 discarded
            await pub.publish(make(i))
        nc, intake, steps = await trainer()
        await steps.refresh_queue()
        first = counted()
        batch = await intake.next_batch(0, asyncio.Event(), wait_s=10.0)  # 2 trained, 1 held
        await record_and_ack(intake, 1, batch)
        await nc.flush()
        await nc.close()  # the trainer dies holding one
        nc, intake, steps = await trainer()
        await settled(intake.consumer, 1)
        await steps.refresh_queue()
        after_restart = counted()
        for i in range(5, 8):  # the queue is full again: the oldest (the one held before) discarded
            await pub.publish(make(i))
        await steps.refresh_queue()
        later = counted()
        await nc.close()
        await rollout_nc.close()
        return first, after_restart, later, steps.counters()

    first, after_restart, later, counters = asyncio.run(scenario())
    assert (first, after_restart, later) == (2, 2, 3)
    assert counters["dropped_queue_full"] == 3
