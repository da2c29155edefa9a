"""A rollout replica's weight-update round (rollout/update.py): its order, its pause record, its failures.

The engine and the trainer link here are stand-ins on a clock the test owns: ``pause()`` first
finishes the step in flight (``STEP_S``, as vLLM does), loading takes ``LOAD_S``, the gloo
transfer ``TRANSFER_S`` and the serial round's hashing ``HASH_S``, so the recorded times are exact.
What is under test is the round the updater runs around them; the real engine and link run it in
tests/dataplane/test_partial_rollout.py, tests/dataplane/test_weightsync.py and the e2e fault tests.

The last tests drive ``RolloutEngine``'s version stamping against a stand-in of vLLM's engine core
that runs utility calls one at a time in the order they were sent, as vLLM 0.32's does.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Callable
from typing import Any

import pytest
from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.rollout import admission as admission_mod
from asyncrl_workloads.rollout import engine as engine_mod
from asyncrl_workloads.rollout import update as update_mod
from asyncrl_workloads.weightsync import base, replica

STEP_S = 0.25
"""What the step in flight still needs when pause() is called."""
LOAD_S = 0.125
TRANSFER_S = 0.5
SERIAL_S = TRANSFER_S + LOAD_S
"""Receive and load, both inside the serial round's pause."""
HASH_S = 0.0625
"""The serial gloo round: the workers hash what they loaded (the link waits for it)."""

ME = base.Member(replica=0, incarnation="i0", ranks=1, rank_offset=1)
PLAN = base.Plan(seq=1, version=1, candidates=(ME,), tensors=(), buckets=(), timeout_seconds=1.0, trainer="t")
ROSTER = base.Roster(seq=1, generation=0, world_size=2, members=(ME,))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Engine:
    """Receives on the gloo path while generating (``overlapped``) or inside the pause (NCCL)."""

    def __init__(
        self, clock: Clock, events: list[str], overlapped: bool, posts_checksum: bool, fail: Exception | None
    ) -> None:
        self.clock, self.events, self.overlapped, self.fail = clock, events, overlapped, fail
        self.posts_checksum = posts_checksum
        self.version = 0
        self.checksum = "sum"

    async def pause(self) -> None:
        self.clock.now += STEP_S  # the step in flight finishes first
        self.events.append("pause")

    async def resume(self) -> None:
        self.events.append("resume")

    async def prefetch(self, plan: base.Plan, roster: base.Roster) -> None:
        self.events.append("prefetch")

    async def apply_prefetched(self, plan: base.Plan) -> str:
        return self._load("apply", plan)

    async def update(self, plan: base.Plan, roster: base.Roster) -> None:
        self.clock.now += TRANSFER_S
        self._load("update", plan)

    def _load(self, event: str, plan: base.Plan) -> str:
        self.events.append(event)
        self.clock.now += LOAD_S
        if self.fail is not None:
            raise self.fail
        self.version = plan.version
        return self.checksum


class Link:
    replica, incarnation = ME.replica, ME.incarnation

    def __init__(
        self, clock: Clock, events: list[str], roster: base.Roster, wait_s: float, fail: Exception | None
    ) -> None:
        self.clock, self.events, self._roster, self.wait_s, self.fail = clock, events, roster, wait_s, fail

    def ready(self, plan: base.Plan) -> None:
        self.events.append("ready")

    def roster(self, plan: base.Plan) -> base.Roster:
        self.events.append("roster")
        return self._roster

    def wait_received(self, plan: base.Plan) -> str:
        self.clock.now += self.wait_s
        if self.fail is not None:
            raise self.fail
        self.events.append("received")
        return "sum"

    def ack(self, plan: base.Plan, checksum: str, seconds: float) -> None:
        self.events.append("ack")

    def rejoin(self) -> None:
        self.events.append("rejoin")


class Round:
    """One updater with its stand-ins; ``run`` applies PLAN, optionally with a group in flight."""

    def __init__(
        self, name: str, overlapped: bool, *, partial_rollout: bool = True, posts_checksum: bool = True,
        fail: Exception | None = None, engine_fail: Exception | None = None, roster: base.Roster = ROSTER,
    ) -> None:  # fmt: skip
        self.clock, self.events = Clock(), []
        self.engine = Engine(self.clock, self.events, overlapped, posts_checksum, fail or engine_fail)
        link = Link(self.clock, self.events, roster, TRANSFER_S if overlapped else HASH_S, fail)
        self.labels = {"namespace": "ns", "job": f"update-{name}", "role": "rollout", "replica": "0"}
        identity = metrics_mod.Identity(**self.labels)
        self.admission = admission_mod.Admission(2, 8, 1, 20.0)
        self.inflight: set[asyncio.Task[None]] = set()
        self.updater = update_mod.Updater(
            self.engine, link, metrics_mod.bind(identity),  # type: ignore[arg-type]
            self.admission, self.inflight, partial_rollout=partial_rollout, poll_s=0.004, clock=self.clock,
        )  # fmt: skip

    def run(self, group_s: float = 0.0) -> dict[str, float] | None:
        async def group() -> None:
            await asyncio.sleep(group_s)
            self.events.append("group done")

        async def scenario() -> dict[str, float] | None:
            if group_s:
                task = asyncio.create_task(group())
                self.inflight.add(task)
                task.add_done_callback(self.inflight.discard)
            return await self.updater.apply(PLAN)

        return asyncio.run(scenario())

    def observed(self, suffix: str) -> Any:
        return metrics_mod.REGISTRY.get_sample_value(f"asyncrl_rollout_pause_seconds_{suffix}", self.labels)


@pytest.mark.parametrize(
    ("overlapped", "posts_checksum", "order", "transfer_s", "pause_s"),
    [
        (True, True, "ready roster prefetch received ack pause apply resume", TRANSFER_S, LOAD_S),
        (False, True, "pause ready roster update resume received ack", SERIAL_S, SERIAL_S),
        (False, False, "pause ready roster update resume ack", SERIAL_S, SERIAL_S),
    ],
    ids=["gloo-overlapped", "gloo-serial", "nccl-serial"],
)
def test_the_pause_counts_only_the_time_the_engine_takes_no_step(
    overlapped: bool, posts_checksum: bool, order: str, transfer_s: float, pause_s: float
) -> None:
    round_ = Round(f"pause-{overlapped}-{posts_checksum}", overlapped, posts_checksum=posts_checksum)
    record = round_.run()
    assert record is not None and round_.engine.version == 1 and round_.admission.loaded == 1
    assert round_.events == order.split()
    assert record["transfer_s"] == transfer_s
    assert record["pause_wait_s"] == STEP_S  # the step in flight still produced tokens
    assert record["pause_s"] == pause_s  # from pause() returning to resume() returning; no hashing
    assert (round_.observed("count"), round_.observed("sum")) == (1.0, pause_s)


def test_partial_rollout_false_lets_the_groups_in_flight_finish_before_the_pause() -> None:
    round_ = Round("drain", True, partial_rollout=False)
    assert round_.run(group_s=0.05) is not None
    assert round_.events.index("group done") < round_.events.index("pause")
    assert round_.admission.open  # closed for the drain, reopened after the round


def test_a_transfer_that_fails_while_generating_never_pauses_and_keeps_the_old_version() -> None:
    round_ = Round("failed-overlapped", True, fail=replica.TransferFailed("bucket 3 timed out"))
    assert round_.run() is None
    assert round_.events == ["ready", "roster", "prefetch", "rejoin"]
    assert round_.engine.version == 0 and round_.admission.loaded == 0 and round_.observed("count") == 0


def test_a_transfer_that_fails_inside_the_pause_resumes_and_keeps_the_old_version() -> None:
    round_ = Round("failed-serial", False, fail=replica.TransferFailed("bucket 3 timed out"))
    assert round_.run() is None
    assert round_.events == ["pause", "ready", "roster", "update", "resume", "rejoin"]  # rejoin unpaused
    assert round_.engine.version == 0 and round_.admission.loaded == 0
    assert (round_.observed("count"), round_.observed("sum")) == (1.0, TRANSFER_S + LOAD_S)


def test_a_load_that_fails_inside_the_pause_resumes_then_rejoins_and_keeps_the_old_version() -> None:
    round_ = Round("failed-apply", True, engine_fail=RuntimeError("reload failed"))
    assert round_.run() is None
    assert round_.events[-4:] == ["pause", "apply", "resume", "rejoin"]
    assert round_.engine.version == 0 and round_.admission.loaded == 0 and round_.admission.open
    assert (round_.observed("count"), round_.observed("sum")) == (1.0, LOAD_S)


def test_a_loaded_checksum_other_than_the_received_one_fails_the_round_and_rejoins() -> None:
    round_ = Round("mismatch", True)
    round_.engine.checksum = "other"
    assert round_.run() is None
    assert round_.events == [
        "ready",
        "roster",
        "prefetch",
        "received",
        "ack",
        "pause",
        "apply",
        "resume",
        "rejoin",
    ]
    assert round_.admission.loaded == 0 and round_.observed("sum") == LOAD_S


def test_an_unusable_engine_is_raised_to_the_worker_after_resuming() -> None:
    round_ = Round("unusable", False, fail=base.EngineUnusable("NCCL load failed half-way"))
    with pytest.raises(base.EngineUnusable):
        round_.run()
    assert round_.events[-1] == "resume" and "rejoin" not in round_.events
    assert round_.admission.open


def test_a_replica_left_out_of_the_roster_rejoins_without_loading() -> None:
    other = base.Roster(seq=1, generation=0, world_size=2, members=(base.Member(1, "i1", 1, 1),))
    round_ = Round("left-out", True, roster=other)
    assert round_.run() is None
    assert round_.events == ["ready", "roster", "rejoin"] and round_.engine.version == 0


class Core:
    """vLLM's engine core as the front end sees it (vllm 0.32 ``EngineCoreProc``): a utility call is
    sent at once and runs after every call sent before it, one at a time. ``stamp`` is the version
    the next outputs would carry; ``log`` says when each call was sent and when it ran."""

    def __init__(self, fail: set[str]) -> None:
        self.stamp, self.fail, self.log = "0", fail, []
        self._last: asyncio.Future[None] | None = None

    async def call(self, name: str, run: Callable[[], Any] = lambda: None) -> Any:
        self.log.append(f"send {name}")
        before, done = self._last, asyncio.get_running_loop().create_future()
        self._last = done
        try:
            await asyncio.sleep(0)  # on the wire
            if before is not None:
                await before
            self.log.append(f"run {name}")
            if name in self.fail:
                raise RuntimeError(f"{name} failed")
            return run()
        finally:
            done.set_result(None)


class LLM:
    """The AsyncLLM methods ``RolloutEngine`` calls around a load, each one utility call."""

    vllm_config = types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(enable_chunked_prefill=False, long_prefill_token_threshold=0)
    )

    def __init__(self, core: Core) -> None:
        self.core = core

    async def collective_rpc(
        self, method: str, timeout: float | None = None, args: tuple[Any, ...] = ()
    ) -> Any:
        return await self.core.call(method, lambda: ["sum"])

    async def start_weight_update(self) -> None:
        await self.core.call("start_weight_update")

    async def update_weights(self, request: Any) -> None:
        await self.core.call("update_weights")

    async def update_weight_version(self, version: str) -> None:
        await self.core.call(f"stamp {version}", lambda: setattr(self.core, "stamp", version))


def stamping(*fail: str) -> tuple[Core, engine_mod.RolloutEngine]:
    core = Core(set(fail))
    return core, engine_mod.RolloutEngine(LLM(core), engine_mod.EngineSettings(model="stand-in"))  # type: ignore[arg-type]


def test_apply_loads_and_stamps_the_version_in_one_round_trip() -> None:
    core, engine = stamping()
    assert asyncio.run(engine.apply_prefetched(PLAN)) == "sum"
    sent, ran = ["asyncrl_apply_prefetched", "stamp 1"], ["asyncrl_apply_prefetched", "stamp 1"]
    assert core.log == [f"send {c}" for c in sent] + [f"run {c}" for c in ran]  # both sent before a reply
    assert (core.stamp, engine.version) == ("1", 1)


def test_a_failed_apply_puts_the_old_stamp_back_before_the_caller_can_resume() -> None:
    core, engine = stamping("asyncrl_apply_prefetched")
    with pytest.raises(RuntimeError, match="asyncrl_apply_prefetched failed"):
        asyncio.run(engine.apply_prefetched(PLAN))
    assert core.log[-2:] == ["send stamp 0", "run stamp 0"]
    assert (core.stamp, engine.version) == ("0", 0)


def test_the_serial_session_and_its_stamp_go_out_back_to_back() -> None:
    core, engine = stamping()
    asyncio.run(engine.update(PLAN, ROSTER))
    calls = ["start_weight_update", "update_weights", "finish_weight_update", "stamp 1"]
    assert core.log == [f"send {c}" for c in calls] + [f"run {c}" for c in calls]
    assert (core.stamp, engine.version) == ("1", 1)


def test_a_failed_receive_raises_its_own_error_and_keeps_the_old_stamp() -> None:
    core, engine = stamping("update_weights", "finish_weight_update")  # vLLM: no finish without a session
    with pytest.raises(RuntimeError, match="update_weights failed"):
        asyncio.run(engine.update(PLAN, ROSTER))
    assert (core.stamp, engine.version) == ("0", 0)


def test_a_stamp_that_cannot_be_put_back_makes_the_engine_unusable() -> None:
    core, engine = stamping("asyncrl_apply_prefetched", "stamp 0")
    with pytest.raises(base.EngineUnusable, match="stamp not restored"):
        asyncio.run(engine.apply_prefetched(PLAN))
    assert engine.version == 0


@pytest.mark.parametrize(
    ("overlapped", "order"),
    [
        (True, "ready roster prefetch received ack validated pause apply resume"),
        (False, "validated pause ready roster update resume received ack"),
    ],
    ids=["gloo-overlapped", "serial"],
)
def test_a_validation_run_in_progress_ends_before_the_pause_even_with_partial_rollout(
    overlapped: bool, order: str
) -> None:
    """Every validation answer comes from one version; with gloo the weights are received and acked
    meanwhile (the trainer is not held), only the reload waits."""
    round_ = Round(f"hold-{overlapped}", overlapped, partial_rollout=True)

    async def validation_ends() -> None:
        await asyncio.sleep(0.02)
        round_.events.append("validated")

    round_.updater.hold = validation_ends
    assert round_.run() is not None
    assert round_.events == order.split()
