"""Live progress of a local run: scrape every process's /metrics, follow the trainer's step log, and
turn both into one record per poll (the run dir's metrics.jsonl) and one terminal line.

Called by `runner` every poll interval; `plot` reads the records back. Sources:
- each process's Prometheus endpoint (design.md §5 names): produced/consumed/dropped counters, tokens
  generated, the reward histogram (rollouts), queue depth, trainer step and param versions;
- the trainer's step log (ASYNCRL_STEP_LOG, one JSON object per optimizer step, written by
  trainer/loop.py): the batch's mean reward and every consumed sample's staleness.
Rates are deltas between two polls divided by the wall time between them.
"""

from __future__ import annotations

import json
import math
import pathlib
import time
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import parser

# Sample names summed over all processes (counters and histogram sums/counts).
SUMMED = (
    "asyncrl_trajectories_produced_total", "asyncrl_trajectories_consumed_total",
    "asyncrl_trajectories_dropped_total", "asyncrl_tokens_generated_total",
    "asyncrl_reward_sum", "asyncrl_reward_count",
    "asyncrl_sample_staleness_sum", "asyncrl_sample_staleness_count",
)


def scrape(port: int, timeout: float = 1.0) -> str | None:
    """The text of http://127.0.0.1:port/metrics, or None when the process does not answer (yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as response:
            return str(response.read().decode())
    except OSError:
        return None


def aggregate(texts: Mapping[str, str | None]) -> dict[str, float]:
    """pod name -> exposition text  =>  flat totals (see SUMMED) plus max/min of the gauges."""
    totals: dict[str, float] = dict.fromkeys(SUMMED, 0.0)
    out: dict[str, float] = {}
    for text in texts.values():
        if not text:
            continue
        for family in parser.text_string_to_metric_families(text):
            for sample in family.samples:
                name, labels, value = sample.name, sample.labels, float(sample.value)
                if name in totals:
                    totals[name] += value
                elif name == "asyncrl_trainer_step":
                    out["step"] = max(out.get("step", 0.0), value)
                elif name == "asyncrl_queue_depth":
                    out["queueDepth"] = max(out.get("queueDepth", 0.0), value)
                elif name == "asyncrl_param_version" and labels.get("role") == "trainer":
                    out["paramVersion"] = max(out.get("paramVersion", 0.0), value)
                elif name == "asyncrl_param_version" and labels.get("role") == "rollout":
                    out["rolloutVersionMin"] = min(out.get("rolloutVersionMin", math.inf), value)
    out.update(totals)
    out["processesUp"] = float(sum(1 for text in texts.values() if text))
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
    """Keeps the previous poll to turn counters into rates; `record()` makes one metrics.jsonl entry."""

    def __init__(self, max_steps: int | None, clock: Any = time.time) -> None:
        self.max_steps = max_steps
        self.clock = clock
        self.started = clock()
        self._previous: tuple[float, dict[str, float]] | None = None
        self.last_reward: float | None = None

    def record(self, totals: dict[str, float], steps: list[dict[str, Any]], processes: int) -> dict[str, Any]:
        now = self.clock()
        previous_time, previous = self._previous or (self.started, dict.fromkeys(SUMMED, 0.0))
        elapsed = max(now - previous_time, 1e-9)

        def delta(name: str) -> float:
            return max(totals.get(name, 0.0) - previous.get(name, 0.0), 0.0)

        rewards = [float(s["reward_mean"]) for s in steps if s.get("reward_mean") is not None]
        if rewards:
            self.last_reward = rewards[-1]
        staleness = [float(v) for s in steps for v in s.get("staleness", [])]
        window_count = delta("asyncrl_reward_count")
        entry: dict[str, Any] = {
            "time": now,
            "elapsed": round(now - self.started, 3),
            "step": int(max([totals.get("step", 0.0)] + [float(s["step"]) for s in steps])),
            "maxSteps": self.max_steps,
            "paramVersion": int(totals["paramVersion"]) if "paramVersion" in totals else None,
            "rolloutVersionMin": (int(totals["rolloutVersionMin"])
                                  if math.isfinite(totals.get("rolloutVersionMin", math.inf)) else None),
            "reward": _mean(rewards) if rewards else self.last_reward,
            "rolloutReward": delta("asyncrl_reward_sum") / window_count if window_count else None,
            "stalenessMean": _mean(staleness),
            "stalenessMax": max(staleness) if staleness else None,
            "queueDepth": int(totals["queueDepth"]) if "queueDepth" in totals else None,
            "samplesPerSecond": round(delta("asyncrl_trajectories_consumed_total") / elapsed, 4),
            "producedPerSecond": round(delta("asyncrl_trajectories_produced_total") / elapsed, 4),
            "tokensPerSecond": round(delta("asyncrl_tokens_generated_total") / elapsed, 2),
            "produced": int(totals.get("asyncrl_trajectories_produced_total", 0.0)),
            "consumed": int(totals.get("asyncrl_trajectories_consumed_total", 0.0)),
            "dropped": int(totals.get("asyncrl_trajectories_dropped_total", 0.0)),
            "stepsThisPoll": len(steps),
            "processesUp": int(totals.get("processesUp", 0.0)),
            "processes": processes,
        }
        self._previous = (now, dict(totals))
        return entry


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def line(entry: Mapping[str, Any]) -> str:
    """One human line: step, version, reward, staleness, queue depth, throughput, processes up."""
    steps = f"{entry['step']}/{entry['maxSteps']}" if entry.get("maxSteps") else str(entry["step"])
    return (
        f"[{entry['elapsed']:7.1f}s] step {steps}  v{_fmt(entry.get('paramVersion'), 'd')}"
        f"  reward {_fmt(entry.get('reward'), '.3f')}"
        f"  staleness {_fmt(entry.get('stalenessMean'), '.2f')}"
        f" (max {_fmt(entry.get('stalenessMax'), '.0f')})"
        f"  queue {_fmt(entry.get('queueDepth'), 'd')}"
        f"  {entry['samplesPerSecond']:.1f} samples/s {entry['tokensPerSecond']:.0f} tok/s"
        f"  up {entry['processesUp']}/{entry['processes']}"
    )
