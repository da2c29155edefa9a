"""spec.rollout.autoscale in `asyncrl run`: the operator's decision (asyncrl_api.autoscale.decide) applied
to the rollout processes.

The runner plans rollout pods up to maxReplicas (their ports and cores fixed up front, as a StatefulSet's
ordinals are) and starts the first ``replicas`` of them. Each poll, ``Elastic.poll`` takes the trainer's
report (the progress file: status.progress.utilization with lastUpdateTime, as on a cluster) as a sample
when it is new, counts the started rollouts whose /readyz answers 200 (the engine serves), and asks for a
decision; a change starts the next ordinals or SIGTERMs the highest ones (a rollout aborts or publishes
whole its in-flight groups on SIGTERM, then says bye to weight sync, as on a scale-down of the
StatefulSet).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from asyncrl_api import autoscale


def ready(port: int, timeout: float = 0.5) -> bool:
    """The process's /readyz answers 200 (a rollout: its engine is loaded and generating)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=timeout) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def read_report(path: pathlib.Path) -> autoscale.Signals | None:
    """The trainer's latest report as a sample (without the ready count), or None without utilization."""
    try:
        progress = json.loads(path.read_text()).get("progress") or {}
    except (OSError, ValueError):
        return None
    u, stamp = progress.get("utilization"), progress.get("lastUpdateTime")
    if not u or not stamp:
        return None
    at = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    rate, consumed = u.get("samplesPerSecond"), progress.get("samplesConsumed")
    return autoscale.Signals(
        at,
        float(u["trainerWaitFraction"]),
        float(u["rolloutBlockedFraction"]),
        0,
        None if rate is None else float(rate),
        None if consumed is None else int(consumed),
    )


class Elastic:
    """The local autoscaler: samples, decisions and the replica count it asked the supervisor for."""

    def __init__(
        self,
        spec: autoscale.AutoscaleSpec,
        replicas: int,
        progress_file: pathlib.Path,
        scale: Callable[[int], None],
        say: Callable[[str], None],
    ) -> None:
        self.spec, self.progress_file, self.scale, self.say = spec, progress_file, scale, say
        self.replicas = min(max(replicas, spec.min_replicas), spec.max_replicas)
        self.history = autoscale.History()
        self.last: autoscale.Decision | None = None
        self.changes: list[dict[str, object]] = []

    def poll(self, ready_replicas: int, now: float | None = None) -> autoscale.Decision | None:
        """One sample (if the trainer reported since the last) and, with it, a decision applied at once."""
        sample = read_report(self.progress_file)
        if sample is None or not self.history.add(dataclasses.replace(sample, ready_replicas=ready_replicas)):
            return None
        now = time.time() if now is None else now
        decision = self.history.decide(self.spec, self.replicas, now)
        self.last = decision
        self.history.applied(self.spec, self.replicas, decision, now)
        if decision.replicas != self.replicas:
            change = f"rollout replicas {self.replicas} -> {decision.replicas}"
            self.say(f"asyncrl: autoscale: {change}: {decision.message}")
            self.changes.append(
                {"time": now, "from": self.replicas, "to": decision.replicas, "reason": decision.reason}
            )
            self.replicas = decision.replicas
            self.scale(decision.replicas)
        return decision
