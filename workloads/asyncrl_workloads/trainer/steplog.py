"""What trainer rank 0 records about its steps: counters, metrics, the JSON step log, the progress report.

Called by trainer/loop.py (``Leader``) only: ``account`` after each step's samples are acked,
``refresh_queue`` after each step and while waiting for samples, ``catch_up`` for each catch-up
round, ``write`` once per step and ``report`` after each step, while waiting, and once (forced) at
the end.

The step log is one JSON object per line, appended to ``LoopSettings.step_log`` (the local runner,
the e2e tests and tools/asyncrl_testing/bench_modes.py read it): ``step``, ``time``, ``version``,
the backend's step metrics (with ``teacher_kl`` for a teacher job), ``staleness`` and ``ids`` of the
step's samples (in batch order), ``counters`` (see ``counters``), ``sync`` (the sync report, or null
when the step did not sync), when catch-up rounds ran since the previous step, ``catch_up`` (their
sync reports) and, when validation results came since the previous step, ``validation`` (those
results, status.progress.validation's fields: rewardMean, k, meanAtK, passAtK, ...). With dynamic
sampling (spec.trainer.algorithm.dynamicSampling) each line also has ``zero_variance_dropped_groups``
(equal-reward groups dropped while gathering the step) and ``zero_variance_kept_groups`` (equal-reward
groups trained in it: the per-step bound was reached).

The progress report is the job's ``status.progress`` (trainer/progress.py throttles and writes it;
``validation``, the latest validation run, comes from trainer/validation.py; ``dropped``, the samples
never trained on by reason since the job started, from the ledger) with local extras: the last step's
mean reward, samples per second since this process started and the counters.
"""

from __future__ import annotations

import collections
import json
import pathlib
import statistics
import time
from typing import Any

import nats.js.errors

from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.bus import jetstream
from asyncrl_workloads.tracking import tracker as tracker_mod
from asyncrl_workloads.trainer import inbox, progress
from asyncrl_workloads.trainer import validation as validation_mod

UTILIZATION_STEPS = 20
"""Steps status.progress.utilization covers (spec.rollout.autoscale's signals)."""


class StepLog:
    """Rank 0's counters since this process started, and where they are written."""

    def __init__(
        self,
        path: pathlib.Path | None,
        intake: inbox.Inbox,
        metrics: metrics_mod.Bound,
        reporter: progress.Reporter,
        validation: validation_mod.ValidationLog | None = None,
        tracker: tracker_mod.Tracker | None = None,
    ) -> None:
        self.path, self.intake, self.metrics, self.reporter = path, intake, metrics, reporter
        self.validation = validation
        self.tracker = tracker
        """spec.tracking's trackers (tracking/): each step log record goes to them too."""
        self.recent_staleness: collections.deque[int] = collections.deque(maxlen=1024)
        led = intake.ledger
        self.queue_full_reported = led.queue_full_earlier + led.queue_full_current
        """The job's queue_full drops up to what this process has counted in its metric. It starts at
        the ledger's count: a restarted trainer's counter starts at 0 and counts only drops it finds
        new, so Prometheus' increase() does not count the earlier ones again."""
        self.queue_depth = 0
        self.stored = 0
        self.started = time.monotonic()
        self.consumed_at_start = intake.ledger.consumed_total
        self.recent_steps: collections.deque[tuple[float, float, bool]] = collections.deque(
            maxlen=UTILIZATION_STEPS
        )
        """(waited, wall time, whole batch already queued) of the last steps: status.progress.utilization."""
        self.recent_done: collections.deque[tuple[float, int]] = collections.deque(
            maxlen=UTILIZATION_STEPS + 1
        )
        """(time.monotonic() at the step's accounting, samples) of the last steps and the one before
        them: the consumed samples/s of status.progress.utilization (wall time: waits, syncs and all)."""
        self.catch_ups: list[dict[str, Any]] = []
        """Catch-up rounds since the last step (reported with the next step)."""
        self.last_wait = 0.0
        """Seconds the last accounted step waited for its batch (the step log's ``wait_seconds``)."""

    def account(self, taken: list[inbox.Taken], waited: float, total: float, queued_at_ask: int = 0) -> None:
        """A step's samples were acked: count them (metrics, staleness filter), the time waited, and
        whether the stream already held the whole batch when the step asked (``queued_at_ask``: the queue
        depth read after the previous step)."""
        m = self.metrics
        m.consumed.inc(len(taken))
        for t in taken:
            m.staleness.observe(t.staleness)
            self.recent_staleness.append(t.staleness)
            self.intake.filter.consume(t.staleness)
        m.trainer_idle.set(waited / total if total > 0 else 0.0)
        self.last_wait = waited
        self.recent_steps.append((waited, total, bool(taken) and queued_at_ask >= len(taken)))
        self.recent_done.append((time.monotonic(), len(taken)))

    def utilization(self) -> dict[str, Any] | None:
        """The trainer's wait share and the steps that found their batch queued, over the last steps."""
        if not self.recent_steps:
            return None
        total = sum(t for _, t, _ in self.recent_steps)
        waited = sum(w for w, _, _ in self.recent_steps)
        return {
            "trainerWaitFraction": round(min(1.0, waited / total) if total > 0 else 0.0, 4),
            "rolloutBlockedFraction": round(
                sum(q for _, _, q in self.recent_steps) / len(self.recent_steps), 4
            ),
            "steps": len(self.recent_steps),
            **self._recent_rate(),
        }

    def _recent_rate(self) -> dict[str, float]:
        """samplesPerSecond: samples of the last steps ÷ the wall time since the step before them."""
        done = list(self.recent_done)
        elapsed = done[-1][0] - done[0][0] if len(done) > 1 else 0.0
        if elapsed <= 0:
            return {}
        return {"samplesPerSecond": round(sum(n for _, n in done[1:]) / elapsed, 3)}

    async def refresh_queue(self) -> None:
        """Read the bus consumer's state: queue depth and age, and samples the full stream dropped.
        While the bus does not answer (NATS restarting) or has no stream (it came back without its
        store; the next fetch creates it again) they keep their last values. A stream created again
        since the last look (NATS came back without its store) is counted from its start
        (`Inbox.follow_stream`)."""
        try:
            state = await self.intake.consumer.state()
        except (*jetstream.NO_ANSWER, nats.js.errors.NotFoundError, nats.js.errors.ServiceUnavailableError):
            return
        self.queue_depth = state.messages
        self.metrics.queue_depth.set(state.messages)
        self.metrics.queue_oldest_age.set(state.oldest_age_s)
        self.intake.follow_stream(state.created, state.messages)
        led = self.intake.ledger
        handles = self.intake.batcher.handles()
        held = [r.stream_seq for r in handles if r.stream == state.created]
        held += self.intake.consumer.buffered_seqs()  # received by the client, not fetched by the loop yet
        current = jetstream.queue_full_drops(state, led.acked_in_stream(), held)
        if current > led.queue_full_current:  # never has to go down
            led.queue_full_current = current
            led.save()  # a restarted trainer's counter starts from it (and adds only newer drops)
        dropped = led.queue_full_earlier + led.queue_full_current
        if dropped > self.queue_full_reported:
            self.metrics.dropped["queue_full"].inc(dropped - self.queue_full_reported)
            self.queue_full_reported = dropped
        self.stored = state.last_seq

    def catch_up(self, sync_report: dict[str, Any]) -> None:
        self.catch_ups.append(sync_report)

    def counters(self) -> dict[str, int]:
        led = self.intake.ledger
        return {
            "consumed": led.consumed_total,
            "dropped_stale": led.dropped_stale,
            "dropped_stale_tokens": self.intake.dropped_stale_tokens,
            "dropped_invalid": led.dropped_invalid,
            "dropped_reward_error": led.dropped_reward_error,
            "dropped_queue_full": led.queue_full_earlier + led.queue_full_current,
            "dropped_store_lost": led.lost_with_store,
            "dropped_zero_variance": led.dropped_zero_variance,
            "zero_variance_kept": led.zero_variance_kept,
            "queue_depth": self.queue_depth,
            "stored": self.stored,
            "redeliveries_skipped": self.intake.redeliveries_skipped,
        }

    def dropped(self) -> dict[str, int]:
        """status.progress.dropped: samples never trained on since the job started, by reason."""
        c = self.counters()
        return {
            "stale": c["dropped_stale"],
            "invalid": c["dropped_invalid"],
            "queueFull": c["dropped_queue_full"],
            "storeLost": c["dropped_store_lost"],
            "rewardError": c["dropped_reward_error"],
            "zeroVariance": c["dropped_zero_variance"],
        }

    def write(
        self,
        step: int,
        version: int,
        step_metrics: dict[str, float],
        taken: list[inbox.Taken],
        sync_report: dict[str, Any] | None,
    ) -> None:
        """Step ``step`` is done (at ``version`` after its sync): set the step metrics and append its
        line to the step log."""
        m = self.metrics
        m.trainer_step.set(step)
        m.trainer_last_step_ts.set(time.time())
        if "teacher_kl" in step_metrics:  # a teacher job (backend.py)
            m.teacher_kl.set(step_metrics["teacher_kl"])
        catch_ups, self.catch_ups = self.catch_ups, []
        validated = self.validation.take_new() if self.validation is not None else []
        if self.path is None and self.tracker is None:
            return
        record: dict[str, Any] = {
            "step": step,
            "time": time.time(),
            "version": version,
            **step_metrics,
            "wait_seconds": round(self.last_wait, 4),  # waiting for the batch (utilization, benchmarks)
            "staleness": [t.staleness for t in taken],
            "ids": [t.trajectory.id for t in taken],
            "rewards": [t.trajectory.reward for t in taken],
            "counters": self.counters(),
            "sync": sync_report,
        }
        if self.intake.max_zero_variance_drops is not None:
            dropped_groups, kept_groups = self.intake.step_zero_variance
            record["zero_variance_dropped_groups"] = dropped_groups
            record["zero_variance_kept_groups"] = kept_groups
        if catch_ups:
            record["catch_up"] = catch_ups
        if validated:  # the trackers get these from trainer/validation.py, with their generations
            record["validation"] = validated
        if self.tracker is not None:
            self.tracker.step(record, self.samples_per_second())
        if self.path is not None:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")

    def samples_per_second(self) -> float:
        """Samples consumed per second since this process started."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return (self.intake.ledger.consumed_total - self.consumed_at_start) / elapsed

    def report(
        self,
        step: int,
        version: int,
        step_time: float | None,
        last_sync_time: float | None,
        step_metrics: dict[str, float],
        force: bool,
    ) -> None:
        """Hand the progress report to the reporter (which throttles unless ``force``)."""
        recent = list(self.recent_staleness)
        body = {
            "step": step,
            "paramVersion": version,
            "samplesConsumed": self.intake.ledger.consumed_total,
            "staleness": {
                "p50": float(statistics.median(recent)) if recent else 0.0,
                "max": max(recent, default=0),
            },
            "queueDepth": self.queue_depth,
            "dropped": self.dropped(),
        }
        if self.intake.max_zero_variance_drops is not None:
            body["zeroVarianceKept"] = self.intake.ledger.zero_variance_kept
        if step_time is not None:
            body["stepTime"] = progress.rfc3339(step_time)
        if last_sync_time is not None:
            body["lastSyncTime"] = progress.rfc3339(last_sync_time)
        if self.validation is not None and self.validation.latest is not None:
            body["validation"] = self.validation.latest
        if self.tracker is not None:
            body["tracking"] = [{"backend": b, **s} for b, s in self.tracker.status().items()]
        utilization = self.utilization()
        if utilization is not None:  # with the report's time: spec.rollout.autoscale takes it as a sample
            body["utilization"] = utilization
            body["lastUpdateTime"] = progress.rfc3339(time.time(), millis=True)
        extras = {
            "reward": step_metrics.get("reward_mean"),
            "samplesPerSecond": self.samples_per_second(),
            "counters": self.counters(),
            "updated": time.time(),
        }

        self.reporter.report(body, extras, force=force)
