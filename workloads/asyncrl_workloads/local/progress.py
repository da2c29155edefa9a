"""Live progress of a local run: scrape every process's /metrics, follow the trainer's step log, and
turn both into one record per poll (the run dir's metrics.jsonl) and one terminal line.

Called by `runner` every poll interval; `plot` reads the records back. Sources:
- each process's Prometheus endpoint (docs/metrics.md): produced/consumed/dropped counters, tokens
  generated, the reward histogram (rollouts), queue depth, trainer step and param versions, and for a
  job with an agent loop its tool calls and finished episodes (series a rollout creates only once it
  counted one, so a job without `spec.agent` shows nothing of them);
- the trainer's step log (ASYNCRL_STEP_LOG, one JSON object per optimizer step, written by
  trainer/loop.py): the batch's mean reward and every consumed sample's staleness;
- with spec.data.validation, rollout replica 0's `asyncrl_validation_*` gauges: the last validation
  run's mean reward and the trainer step of the weights it scored.
Rates are counter increases over a sliding window (10 s) divided by its length; counters of a
process that restarted or exited are carried (`Counters`), so totals never go backwards.
"""

from __future__ import annotations

import collections
import json
import math
import pathlib
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import parser

# Sample names summed over all processes (counters and histogram sums/counts).
SUMMED = (
    "asyncrl_trajectories_produced_total",
    "asyncrl_trajectories_consumed_total",
    "asyncrl_trajectories_dropped_total",
    "asyncrl_tokens_generated_total",
    "asyncrl_reward_sum",
    "asyncrl_reward_count",
    "asyncrl_sample_staleness_sum",
    "asyncrl_sample_staleness_count",
    "asyncrl_tool_calls_total",  # summed over tool and outcome
    "asyncrl_agent_episodes_total",  # summed over how they ended
)


VALIDATION_GAUGES = {
    "asyncrl_validation_reward": "validationReward",
    "asyncrl_validation_step": "validationStep",
}
"""Validation gauges (one process exports them) and their record fields."""


def scrape(port: int, timeout: float = 1.0) -> str | None:
    """The text of http://127.0.0.1:port/metrics, or None when the process does not answer (yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as response:
            return str(response.read().decode())
    except OSError:
        return None


def parse(text: str) -> tuple[dict[str, float], dict[str, float]]:
    """One process's exposition text => (its SUMMED samples, its gauges: step, queueDepth, versions)."""
    sums: dict[str, float] = {}
    gauges: dict[str, float] = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            if name in SUMMED:
                sums[name] = sums.get(name, 0.0) + value
            elif name == "asyncrl_trainer_step":
                gauges["step"] = max(gauges.get("step", 0.0), value)
            elif name == "asyncrl_queue_depth":
                gauges["queueDepth"] = max(gauges.get("queueDepth", 0.0), value)
            elif name in VALIDATION_GAUGES:
                gauges[VALIDATION_GAUGES[name]] = value
            elif name == "asyncrl_param_version":
                key = "paramVersion" if labels.get("role") == "trainer" else "rolloutVersionMin"
                pick = max if key == "paramVersion" else min
                gauges[key] = pick(gauges.get(key, value), value)
    return sums, gauges


class Counters:
    """Run-wide counter totals that survive processes restarting or exiting.

    A restarted process starts its counters at zero again: the drop is added to an offset (what
    Prometheus' rate() does with counter resets). A process that is down keeps its last values.
    """

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], float] = {}
        self._offset: dict[tuple[str, str], float] = {}

    def update(self, pod: str, sums: Mapping[str, float]) -> None:
        for name, value in sums.items():
            key = (pod, name)
            last = self._last.get(key)
            if last is not None and value < last:
                self._offset[key] = self._offset.get(key, 0.0) + last
            self._last[key] = value

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for (pod, name), value in self._last.items():
            out[name] = out.get(name, 0.0) + value + self._offset.get((pod, name), 0.0)
        return out


class StepLog:
    """Follows the trainer's JSONL step log; `read_new()` returns the steps appended since the last call."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = ""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with self.path.open() as handle:
                handle.seek(self._offset)
                chunk = handle.read()
                self._offset = handle.tell()
        except OSError:
            return []
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()  # an incomplete last line waits for the next read
        return [json.loads(line) for line in lines if line.strip()]


def _mean(values: Iterable[float]) -> float | None:
    items = list(values)
    return sum(items) / len(items) if items else None


class Tracker:
    """Turns polls into metrics.jsonl records: counters into rates over the last `window_s` seconds,
    gauges from the processes that answered, reward and staleness from the new trainer steps."""

    def __init__(
        self, max_steps: int | None, clock: Callable[[], float] = time.time, window_s: float = 10.0
    ) -> None:
        self.max_steps = max_steps
        self.clock = clock
        self.window_s = window_s
        self.started = clock()
        self.counters = Counters()
        self._history: collections.deque[tuple[float, dict[str, float]]] = collections.deque()
        self.last_reward: float | None = None
        self.last_step = 0  # carried while the trainer is down (restarting, or finished and gone)
        self.last_version: int | None = None
        self.last_validation: dict[str, Any] = {}

    def _validation(self, gauges: Mapping[str, float]) -> dict[str, Any]:
        """The last validation run's fields, carried while replica 0 does not answer; none before the
        first run (a job without spec.data.validation never has them)."""
        if "validationStep" in gauges:
            self.last_validation = {
                "validationStep": int(gauges["validationStep"]),
                "validationReward": _finite(gauges.get("validationReward")),
            }
        return dict(self.last_validation)

    def record(self, texts: Mapping[str, str | None], steps: list[dict[str, Any]]) -> dict[str, Any]:
        """`texts`: pod -> its /metrics text (None when it did not answer); `steps`: new step-log rows."""
        now = self.clock()
        gauges: dict[str, float] = {}
        for pod, text in texts.items():
            if not text:
                continue
            sums, pod_gauges = parse(text)
            self.counters.update(pod, sums)
            for key, value in pod_gauges.items():
                pick = min if key == "rolloutVersionMin" else max
                gauges[key] = pick(gauges.get(key, value), value)
        totals = self.counters.totals()
        while self._history and now - self._history[0][0] > self.window_s:
            self._history.popleft()
        base_time, base = self._history[0] if self._history else (self.started, {})
        span = max(now - base_time, 1e-9)
        self._history.append((now, totals))

        def rate(name: str) -> float:
            return max(totals.get(name, 0.0) - base.get(name, 0.0), 0.0) / span

        rewards = [float(s["reward_mean"]) for s in steps if s.get("reward_mean") is not None]
        if rewards:
            self.last_reward = rewards[-1]
        staleness = [float(v) for s in steps for v in s.get("staleness", [])]
        seen = [gauges.get("step", 0.0)] + [float(s["step"]) for s in steps]
        self.last_step = int(max([self.last_step, *seen]))
        if "paramVersion" in gauges:
            self.last_version = max(self.last_version or 0, int(gauges["paramVersion"]))
        window_count = rate("asyncrl_reward_count")
        # prometheus_client leaves out a histogram's _sum when a bucket bound is negative: no mean then
        rollout_reward = (
            rate("asyncrl_reward_sum") / window_count
            if window_count and "asyncrl_reward_sum" in totals
            else None
        )
        # The agent loop's fields appear with its first finished episode (a job without one never has
        # episode series); calls per episode is over the window: None when no episode finished in it.
        agent: dict[str, Any] = {}
        if "asyncrl_agent_episodes_total" in totals:
            episodes = rate("asyncrl_agent_episodes_total")
            agent = {
                "toolCallsPerEpisode": round(rate("asyncrl_tool_calls_total") / episodes, 4)
                if episodes
                else None,
                "toolCalls": int(totals.get("asyncrl_tool_calls_total", 0.0)),
                "agentEpisodes": int(totals["asyncrl_agent_episodes_total"]),
            }
        return {
            "time": now,
            "elapsed": round(now - self.started, 3),
            "step": self.last_step,
            "maxSteps": self.max_steps,
            "paramVersion": self.last_version,
            "rolloutVersionMin": int(gauges["rolloutVersionMin"]) if "rolloutVersionMin" in gauges else None,
            "reward": _mean(rewards) if rewards else self.last_reward,
            "rolloutReward": rollout_reward,
            "stalenessMean": _mean(staleness),
            "stalenessMax": max(staleness) if staleness else None,
            "queueDepth": int(gauges["queueDepth"]) if "queueDepth" in gauges else None,
            **self._validation(gauges),
            "samplesPerSecond": round(rate("asyncrl_trajectories_consumed_total"), 4),
            "producedPerSecond": round(rate("asyncrl_trajectories_produced_total"), 4),
            "tokensPerSecond": round(rate("asyncrl_tokens_generated_total"), 2),
            "produced": int(totals.get("asyncrl_trajectories_produced_total", 0.0)),
            "consumed": int(totals.get("asyncrl_trajectories_consumed_total", 0.0)),
            "dropped": int(totals.get("asyncrl_trajectories_dropped_total", 0.0)),
            **agent,
            "stepsThisPoll": len(steps),
            "processesUp": sum(1 for text in texts.values() if text),
            "processes": len(texts),
        }


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def line(entry: Mapping[str, Any]) -> str:
    """One human line: step, version, reward (and `val <reward>@<step>`, the last validation run, for a job
    with spec.data.validation), staleness, queue depth, throughput, tool calls per episode (a job with an
    agent loop only), processes up, rollouts ready/asked for (spec.rollout.autoscale)."""
    steps = f"{entry['step']}/{entry['maxSteps']}" if entry.get("maxSteps") else str(entry["step"])
    agent = f"  {_fmt(entry['toolCallsPerEpisode'], '.2f')} tool calls/ep" if "agentEpisodes" in entry else ""
    replicas = ""
    if "rolloutReplicasDesired" in entry:  # spec.rollout.autoscale
        replicas = f"  rollouts {entry['rolloutReplicasReady']}/{entry['rolloutReplicasDesired']}"
    val = ""
    if "validationStep" in entry:
        val = f"  val {_fmt(entry['validationReward'], '.3f')}@{entry['validationStep']}"
    return (
        f"[{entry['elapsed']:7.1f}s] step {steps}  v{_fmt(entry.get('paramVersion'), 'd')}"
        f"  reward {_fmt(entry.get('reward'), '.3f')}{val}"
        f"  staleness {_fmt(entry.get('stalenessMean'), '.2f')}"
        f" (max {_fmt(entry.get('stalenessMax'), '.0f')})"
        f"  queue {_fmt(entry.get('queueDepth'), 'd')}"
        f"  {entry['samplesPerSecond']:.1f} samples/s {entry['tokensPerSecond']:.0f} tok/s{agent}"
        f"  up {entry['processesUp']}/{entry['processes']}{replicas}"
    )
