"""The rollout worker: keeps groups of ``n`` samples in flight, scores them, publishes them, and
applies each new policy version the trainer announces.

Called by ``entrypoints/rollout.py`` (and data-plane tests) with a started ``RolloutEngine``, a
``ReplicaLink`` to the trainer's weight-sync rendezvous and a publish coroutine (the bus's
``jetstream.Publisher.publish``). Two loops run side by side:

- **generation**: up to ``max_inflight_prompts`` groups at once; each group is one vLLM request
  with ``n`` samples, or with the agent loop (``episode/loop.py``) ``n`` multi-turn episodes side by
  side; every sample becomes one ``Trajectory`` (token ids, processed behaviour logprobs, the policy
  version of every token, the mask, reward) published to the bus.
- **control**: waits for plans (``rollout/planwatch.py``'s ``PlanWatcher`` polls the rendezvous from a
  thread of its own, so the event loop, which also runs vLLM's front end, wakes only when something
  changed); for a plan
  that includes this replica it runs the weight-update round (``rollout/update.py``: with gloo the
  weights are received while still generating and the engine pauses only to reload). With
  ``partialRollout: true`` in-flight requests are frozen across the reload and continue under the
  new weights (their tokens then carry several versions); with ``false`` admission stops and
  in-flight groups finish first. A round that leaves the engine unusable stops the replica (the pod
  restarts).

How many groups a replica may start (the same rule in sync, one-step-off and async modes) is
decided by ``rollout/admission.py``; how a finished group is scored and becomes trajectories, by
``rollout/group.py``. The agent gateway starts groups through ``start_group`` and replaces the generation
loop (``run(stop, serve=...)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.bus import trajectory as trajectory_mod
from asyncrl_workloads.data import fields
from asyncrl_workloads.episode import chat as chat_mod
from asyncrl_workloads.episode import loop as loop_mod
from asyncrl_workloads.rewards import scorer as scorer_mod
from asyncrl_workloads.rollout import admission as admission_mod
from asyncrl_workloads.rollout import engine as engine_mod
from asyncrl_workloads.rollout import group as group_mod
from asyncrl_workloads.rollout import planwatch
from asyncrl_workloads.rollout import update as update_mod
from asyncrl_workloads.rollout import validation as validation_mod
from asyncrl_workloads.weightsync import base, replica

log = logging.getLogger(__name__)
Publish = Callable[[trajectory_mod.Trajectory], Awaitable[bool]]
PromptIds = Callable[[Mapping[str, Any], Sequence[Mapping[str, Any]]], list[int]]
"""(record, tool schemas) -> prompt token ids: ``episode.chat.ChatFormat.prompt_ids`` / ``RawFormat``'s."""


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    job: str
    replica: int
    n: int
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    max_inflight_prompts: int = 16
    partial_rollout: bool = True
    max_staleness: int = 2
    groups_per_version: int = 8
    """Groups the trainer consumes per policy version, all replicas together
    (batch.prompts x requireBatches x syncEverySteps)."""
    replicas: int = 1
    """Expected replicas until a plan says how many take part."""
    prompt_key: str = "prompt"
    seed: int = 0
    poll_s: float = 0.02
    stall_release_s: float = 20.0
    retry_max_s: float = planwatch.RETRY_MAX_S
    """Longest wait between tries at a trainer store that fails other than by refusing."""


@dataclasses.dataclass
class Stats:
    groups_started: int = 0
    groups_done: int = 0
    published: int = 0
    partial: int = 0
    updates: list[dict[str, float]] = dataclasses.field(default_factory=list)


class RolloutWorker:
    def __init__(
        self,
        settings: WorkerSettings,
        engine: engine_mod.RolloutEngine,
        link: replica.ReplicaLink | None,
        publish: Publish,
        scorer: scorer_mod.Scorer,
        records: Sequence[Mapping[str, Any]],
        encode: Callable[[str], list[int]],
        metrics: metrics_mod.Bound,
        *,
        prompt_ids: PromptIds | None = None,
        agent: loop_mod.ToolLoop | None = None,
        validator: validation_mod.Validator | None = None,
    ) -> None:
        """``encode`` tokenizes a raw prompt string; ``prompt_ids`` (the job's data.format), when given,
        renders a record instead; ``agent`` runs each sample as a multi-turn episode; ``validator``
        (replica 0 of a job with spec.data.validation) is told of every version the engine loads."""
        self.s, self.engine, self.link, self.publish = settings, engine, link, publish
        self.scorer, self.records, self.encode, self.m = scorer, records, encode, metrics
        self.prompt_ids, self.agent, self.validator = prompt_ids, agent, validator
        self.stats = Stats()
        self.incarnation = link.incarnation if link else "local"
        self._rng = random.Random(settings.seed * 1000003 + settings.replica)
        self._order: list[int] = []
        self._inflight: set[asyncio.Task[None]] = set()
        self._generating: set[asyncio.Task[Any]] = set()
        self.admission = admission_mod.Admission(
            settings.max_staleness, settings.groups_per_version, settings.replicas, settings.stall_release_s
        )
        self._idle_since: float | None = None
        self._idle_total = 0.0
        self._started_at = time.monotonic()
        self.failure: BaseException | None = None
        self._engine_epoch = 0
        self._round: base.Plan | None = None
        """The weight update this replica is taking part in (a stop finishes it before leaving)."""

    # ---- generation loop -------------------------------------------------------------------
    def _next_record(self) -> Mapping[str, Any]:
        if not self._order:
            self._order = list(range(len(self.records)))
            self._rng.shuffle(self._order)
        return self.records[self._order.pop()]

    async def _generation(self, stop: asyncio.Event) -> None:
        admission = self.admission
        last = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            self.m.inflight_group_seconds.inc(len(self._inflight) * (now - last))
            last = now
            slot_free = len(self._inflight) < self.s.max_inflight_prompts
            if not slot_free or not admission.may_start():
                # a free slot, admission neither drained nor paused: the staleness bound alone holds it
                bound = slot_free and admission.open and not admission.behind
                if not self._inflight and admission.stalled(self.engine.version, now):
                    log.info("no new version for %.0f s: admitting one more batch", self.s.stall_release_s)
                    bound = False
                self._mark_idle(len(self._inflight) == 0)
                await asyncio.sleep(self.s.poll_s)
                if bound:
                    self.m.admission_blocked_seconds.inc(time.monotonic() - now)
                continue
            admission.started()
            self._mark_idle(False)
            index = self.stats.groups_started
            self.stats.groups_started += 1
            task = asyncio.create_task(self._group(index, self._next_record()))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
        # Stopping (SIGTERM: scale-down, job end, node drain): abort what is in flight instead of
        # finishing it. A long generation could outlast the pod's grace period, and a group cut off
        # here was never published, so nothing is lost that a restart would have kept.
        await self.abort_generating()

    async def abort_generating(self) -> None:
        """Cancel the groups still generating (or, from the gateway, waiting for their sessions) and
        wait for those already publishing: a group goes out whole or not at all."""
        generating, inflight = len(self._generating), len(self._inflight)
        log.info("stopping: aborting %d generating groups of %d in flight", generating, inflight)
        for task in list(self._generating):
            task.cancel()  # AsyncLLM aborts the request when its generate() is cancelled
        await asyncio.gather(*self._inflight, return_exceptions=True)

    def _mark_idle(self, idle: bool) -> None:
        now = time.monotonic()
        if idle and self._idle_since is None:
            self._idle_since = now
        elif not idle and self._idle_since is not None:
            self._idle_total += now - self._idle_since
            self._idle_since = None
        wall = now - self._started_at
        if wall > 0:
            current = self._idle_total + (now - self._idle_since if self._idle_since else 0.0)
            self.m.rollout_idle.set(current / wall)

    def group_key(self, index: int) -> str:
        """incarnation.index: unique across this replica's restarts, so trajectory ids never repeat."""
        return f"{self.incarnation}.{index}"

    def group_id(self, index: int) -> str:
        return group_mod.group_id(self.s.job, self.s.replica, self.group_key(index))

    def start_group(
        self,
        samples: Callable[[], Awaitable[list[group_mod.Sample]]],
        record: Mapping[str, Any] | None = None,
        *,
        from_data: bool = False,
    ) -> tuple[int, Mapping[str, Any] | None] | None:
        """Start a group whose samples come from elsewhere (the gateway's sessions) if a slot is free and
        the staleness bound admits it, under the same rule as the worker's own groups. Returns its index
        and record, or None (the caller answers 429). The record (``from_data``: the job's next one,
        drawn only when admitted; None: the agent's own task) is what the reward function scores
        samples without a reward against."""
        now = time.monotonic()
        if len(self._inflight) >= self.s.max_inflight_prompts or not self.admission.may_start():
            if self._inflight or not self.admission.stalled(self.engine.version, now):
                return None
            log.info("no new version for %.0f s: admitting one more batch", self.s.stall_release_s)
            if not self.admission.may_start():
                return None
        self.admission.started()
        index = self.stats.groups_started
        self.stats.groups_started += 1
        if from_data:
            record = self._next_record()
        task = asyncio.create_task(self._group(index, record, samples))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return index, record

    async def _group(
        self,
        index: int,
        record: Mapping[str, Any] | None,
        produce: Callable[[], Awaitable[list[group_mod.Sample]]] | None = None,
    ) -> None:
        try:
            task = asyncio.current_task()
            assert task is not None
            self._generating.add(task)
            try:
                if produce is not None:
                    samples = await produce()
                else:
                    assert record is not None
                    samples = await self._generate(index, record)
            finally:
                self._generating.discard(task)
            key = self.group_key(index)
            kept = await group_mod.score(samples, record, self.scorer, self.m, index)
            for traj in group_mod.trajectories(kept, self.s.job, self.s.replica, key):
                self.m.tokens_generated.inc(sum(traj.mask))
                self.m.reward.observe(traj.reward)
                if len(set(traj.versions)) > 1:
                    self.stats.partial += 1
                    self.m.partial_rollouts.inc()
                if await self.publish(traj):
                    self.stats.published += 1
            self.stats.groups_done += 1
            gave_up = self.scorer.gave_up()
            if gave_up is not None:
                raise gave_up  # the judge failed for giveUpAfterSeconds: exit, the pod shows why
        except Exception as exc:  # the engine or the bus failed: stop, the pod restarts
            log.exception("group %d failed", index)
            if self.failure is None:
                self.failure = exc

    async def _generate(self, index: int, record: Mapping[str, Any]) -> list[group_mod.Sample]:
        """The group's ``n`` samples: one engine request, or ``n`` agent episodes side by side."""
        seed = self.s.seed * 7919 + self.s.replica * 1_000_003 + index
        if self.agent is not None:
            episodes = await asyncio.gather(
                *(self.agent.run(record, seed * 131 + i) for i in range(self.s.n))
            )
            return [
                group_mod.Sample(
                    ep.prompt_ids, ep.response_ids, ep.logprobs, ep.versions, ep.mask, ep.final_text, ep
                )
                for ep in episodes
            ]
        if self.prompt_ids is not None:
            try:
                prompt_ids = self.prompt_ids(record, ())
            except chat_mod.FormatError as exc:  # a record the template rejects: skip it, not the replica
                log.warning("group %d: prompt not rendered, group skipped: %s", index, exc)
                return []
        else:
            prompt_ids = self.encode(str(fields.require(record, self.s.prompt_key)))
        # vLLM seeds sample i of an n-sample request with seed + i: groups' seeds n apart never share one
        params = self.engine.sampling(
            self.s.n, self.s.max_tokens, self.s.temperature, self.s.top_p, seed=seed * max(1, self.s.n)
        )
        completions = await self.engine.generate(prompt_ids, params)
        return [
            group_mod.Sample(
                list(prompt_ids), c.token_ids, c.logprobs, c.versions, [1] * len(c.token_ids), c.text
            )
            for c in completions
        ]

    # ---- control loop ----------------------------------------------------------------------
    async def _control(self, stop: asyncio.Event) -> None:
        assert self.link is not None
        link = self.link
        updater = update_mod.Updater(
            self.engine, link, self.m, self.admission, self._inflight,
            partial_rollout=self.s.partial_rollout, poll_s=self.s.poll_s,
            hold=self.validator.wait if self.validator is not None else None,
        )  # fmt: skip
        watcher = planwatch.PlanWatcher(link, self.s.poll_s)
        try:
            await self._follow(stop, link, watcher, updater)
        finally:  # also when cancelled
            watcher.close()

    async def _follow(
        self,
        stop: asyncio.Event,
        link: replica.ReplicaLink,
        watcher: planwatch.PlanWatcher,
        updater: update_mod.Updater,
    ) -> None:
        logged: bool | None = None  # whether the last logged failure was a refusal; None: none since
        wait_s: float | None = None
        init_wait_s: float | None = None  # the engine workers' connection to the store, the same way
        while not stop.is_set():
            try:
                plan = await watcher.next(self._engine_epoch)
                logged = wait_s = None
            except replica.TrainerUnreachable as exc:
                wait_s = planwatch.retry_after_s(wait_s, exc.refused, self.s.retry_max_s)
                init_wait_s = None  # the engine's failures after a reconnect are a new streak
                if logged != exc.refused:
                    log.warning(
                        "%s; retrying%s",
                        exc,
                        "" if exc.refused else f" (backing off to {self.s.retry_max_s:g} s)",
                    )
                    logged = exc.refused
                with contextlib.suppress(TimeoutError):  # a stop does not wait out the back-off
                    await asyncio.wait_for(stop.wait(), wait_s)
                if exc.refused:  # the next failure of another kind waits 1 s first
                    wait_s = None
                continue
            if link.epoch != self._engine_epoch:  # (re)connected: point the engine workers at the store
                try:
                    await self.engine.init_weight_sync(
                        link.host, link.port, link.replica, link.incarnation, link.connect_timeout
                    )
                    self._engine_epoch = link.epoch
                    init_wait_s = None
                except Exception as exc:  # the engine workers' own store connection failed
                    # The link reached the store just before, so this is rare and may repeat while
                    # the trainer stays frozen (a connect timeout per try): back off like the link,
                    # say it once per streak, and end the wait at once on stop.
                    first = init_wait_s is None
                    init_wait_s = planwatch.retry_after_s(init_wait_s, False, self.s.retry_max_s)
                    log.log(
                        logging.WARNING if first else logging.DEBUG,
                        "weight sync: engine could not reach the trainer store (%s); retrying in %g s",
                        exc, init_wait_s,
                    )  # fmt: skip
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), init_wait_s)
                    continue
            if plan is not None and plan.version > self.engine.version:
                if plan.includes(link.replica, link.incarnation):
                    self.admission.joined(plan)
                    self._round = plan
                    try:
                        record = await updater.apply(plan)
                    except base.EngineUnusable as exc:  # half-loaded weights: stop, the pod restarts
                        self.failure = exc
                    else:
                        if record is not None:
                            self.stats.updates.append(record)
                            if self.validator is not None:
                                self.validator.loaded(self.engine.version)
                    finally:
                        self._round = None
                else:
                    paused = self.admission.left_out(plan, self.engine.version)
                    log.info(
                        "v%d announced without this replica (at v%d); joining at the next version%s",
                        plan.version, self.engine.version, ", generation paused" if paused else "",
                    )  # fmt: skip

    async def run(
        self, stop: asyncio.Event, serve: Callable[[asyncio.Event], Coroutine[Any, Any, None]] | None = None
    ) -> None:
        """Generate and follow the trainer until ``stop`` is set or the engine fails. ``serve`` (the
        gateway) replaces the worker's own generation loop: groups then start through ``start_group``."""
        self.m.param_version.set(self.engine.version)
        if self.validator is not None:
            self.validator.loaded(self.engine.version)
        generation = asyncio.create_task(serve(stop) if serve is not None else self._generation(stop))
        control = asyncio.create_task(self._control(stop)) if self.link is not None else None
        if control is not None:
            control.add_done_callback(self._control_ended)
        watch = asyncio.create_task(self._watch(stop))
        try:
            await generation
        finally:
            # The plan watcher may be inside a store call (seconds against a store going down; see
            # PlanWatcher.close): cancelling the control loop closes it without waiting; the
            # interpreter joins its thread at exit, while the engine shuts down. A round this replica
            # is taking part in is finished first (bounded by the round's own deadline): leaving in the
            # middle of the broadcast would fail it for every other member too.
            if control is not None and self._round is not None and stop.is_set() and not control.done():
                log.info("stopping: finishing the weight update to v%d first", self._round.version)
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(control), self._round.timeout_seconds)
            for task in (watch, control):
                if task is not None:
                    task.cancel()
            if control is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await control
            if self.validator is not None:
                await self.validator.close()
        if self.failure is not None:
            raise self.failure

    def _control_ended(self, task: asyncio.Task[None]) -> None:
        """A control loop that raised is a failed replica (``_watch`` then stops generation)."""
        if not task.cancelled() and task.exception() is not None and self.failure is None:
            self.failure = task.exception()

    async def _watch(self, stop: asyncio.Event) -> None:
        """Stop on the first failed group: a replica that cannot generate should restart."""
        while not stop.is_set():
            if self.failure is not None:
                stop.set()
            await asyncio.sleep(0.2)
