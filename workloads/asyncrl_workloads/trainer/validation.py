"""Trainer rank 0's side of validation runs (spec.data.validation): the generations log and the result
that goes into status.progress.validation.

Built by ``trainer/main.py`` when the job has a validation set; subscribed to the job's validation
subject (core NATS), where rollout replica 0 (``rollout/validation.py``) sends each run as one
``sample`` message per answer (k per record), then one ``result``. ``trainer/steplog.py`` puts
``latest`` into every progress report and the results received since the previous step (``take_new``)
into the next line of the step log.

The generations log is JSONL, one line per sample as it arrives (step, version, index and sample: the
record's place in the set and the answer's among its k, prompt, response, reward, error, record; verl's
validation generations logger writes the same per step): at
ASYNCRL_VALIDATION_LOG when set (the local runner: ``<run dir>/validation.jsonl``), else
``<trainer.checkpoint.path>/validation.jsonl``, on the checkpoint volume beside the ledger. It is
appended to across restarts.

What this side can miss: messages sent while no trainer runs (core NATS keeps nothing; the rollout's
``asyncrl_validation_*`` gauges still show the run) and, after a trainer restart, the last result until
the next run (status.progress is the restarted trainer's report). ``latest`` is the result of the
highest step seen, so a rollout that restarted and validated its initial weights again does not
replace a later result in the status.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
from typing import Any

from asyncrl_workloads.bus import codec
from asyncrl_workloads.tracking import tracker as tracker_mod

log = logging.getLogger(__name__)

LOG_ENV = "ASYNCRL_VALIDATION_LOG"
LOG_NAME = "validation.jsonl"
RESULT_FIELDS = (
    "step", "paramVersion", "rewardMean", "k", "meanAtK", "passAtK", "samples", "failed", "seconds", "time"
)  # fmt: skip
"""What status.progress.validation holds (asyncrl_api.status.ValidationProgress)."""


def log_path(checkpoint_path: str) -> pathlib.Path:
    """Where the generations are written (see the module docstring)."""
    return pathlib.Path(os.environ.get(LOG_ENV) or pathlib.Path(checkpoint_path) / LOG_NAME)


class ValidationLog:
    def __init__(self, path: pathlib.Path, tracker: tracker_mod.Tracker | None = None) -> None:
        self.path = path
        self.tracker = tracker
        """spec.tracking's trackers: each result goes to them with its run's samples as the table."""
        self.pending: dict[int, list[dict[str, Any]]] = {}
        """The samples of runs whose result has not come yet, by step (only with a tracker)."""
        self.latest: dict[str, Any] | None = None
        """The result of the highest step received, in status.progress.validation's fields."""
        self.new: list[dict[str, Any]] = []
        """Results received since the step log last took them (``take_new``), in arrival order."""
        self.failures = 0

    def take(self, part: str, body: dict[str, Any]) -> None:
        """One message's part and body (``codec.decode_validation``)."""
        if part == "sample":
            if self.tracker is not None:
                rows = self.pending.setdefault(int(body.get("step") or 0), [])
                if len(rows) < 10_000:
                    rows.append(body)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a") as handle:
                    handle.write(json.dumps(body, sort_keys=True) + "\n")
            except OSError as exc:  # advisory, as progress is: training goes on
                self.failures += 1
                if self.failures == 1 or self.failures % 1000 == 0:
                    log.warning("validation log %s not written (%d times): %s", self.path, self.failures, exc)
            return
        result = {name: body.get(name) for name in RESULT_FIELDS}
        result["k"] = result["k"] or 1  # a rollout older than validationSampling answers once
        if self.latest is None or int(result["step"] or 0) >= int(self.latest["step"] or 0):
            self.latest = result
        if len(self.new) < 100:  # a trainer that stopped stepping keeps the first ones, bounded
            self.new.append(result)
        if self.tracker is not None:
            self.tracker.validation(result, self.pending.pop(int(result["step"] or 0), []))
        log.info(
            "validation step %s (v%s): mean@%s %s, pass@%s %s over %s samples",
            result["step"], result["paramVersion"], result["k"], result["meanAtK"], result["k"],
            result["passAtK"], result["samples"],
        )  # fmt: skip

    def take_new(self) -> list[dict[str, Any]]:
        """The results received since the last call (the step log's ``validation``)."""
        new, self.new = self.new, []
        return new

    async def subscribe(self, nc: Any, subject: str) -> None:
        async def received(msg: Any) -> None:
            try:
                part, body = codec.decode_validation(msg.data)
            except codec.CodecError as exc:
                log.warning("validation message not read: %s", exc)
                return
            self.take(part, body)

        await nc.subscribe(subject, cb=received)
