"""`asyncrl plot RUN_DIR`: PNG curves of a local run's reward (with the validation set's, when the job has
one), staleness and throughput.

Called by `asyncrl_workloads.cli`. Reads the run dir's metrics.jsonl (written by `runner`, one record
per poll, fields from `progress.Tracker.record`) and writes reward.png, staleness.png, throughput.png and
curves.png (all three stacked) into the run dir (or --out). Uses matplotlib's Agg backend: no display.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

METRICS_FILE = "metrics.jsonl"


class PlotError(ValueError):
    """The run dir has no usable metrics log."""


def read_records(run_dir: pathlib.Path) -> list[dict[str, Any]]:
    path = run_dir / METRICS_FILE
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise PlotError(f"{path}: cannot read ({exc.strerror}); is {run_dir} an `asyncrl run` dir?") from None
    records = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            records.append(json.loads(text))
        except json.JSONDecodeError:
            if number == len(lines):  # a run killed mid-write leaves a partial last line
                break
            raise PlotError(f"{path} line {number} is not JSON") from None
    if not records:
        raise PlotError(f"{path} holds no records yet")
    return records


# Fields computed from the trainer's new steps of a poll; other polls only carry them forward.
STEP_FIELDS = ("reward", "stalenessMean", "stalenessMax")


def _series(records: list[dict[str, Any]], x: str, y: str) -> tuple[list[float], list[float]]:
    """(xs, ys) of the records that have both fields (step fields only where the poll saw new steps; a
    validation run, repeated in every poll until the next, once)."""
    points = [
        (r[x], r[y])
        for r in records
        if r.get(x) is not None
        and r.get(y) is not None
        and (y not in STEP_FIELDS or r.get("stepsThisPoll", 1) > 0)
    ]
    if x == "validationStep":
        points = sorted(dict(points).items())
    return [p[0] for p in points], [p[1] for p in points]


def _panels(records: list[dict[str, Any]]) -> list[tuple[str, str, str, list[tuple[str, str, str]]]]:
    """(file stem, title, x label, [(x field, y field, legend)]) per panel; rollout replicas over time
    for a run with spec.rollout.autoscale."""
    elastic = [
        (
            "replicas",
            "Rollout replicas (spec.rollout.autoscale)",
            "seconds since start",
            [
                ("elapsed", "rolloutReplicasDesired", "asked for"),
                ("elapsed", "rolloutReplicasReady", "ready (engine serving)"),
            ],
        )
    ]
    return (elastic if any("rolloutReplicasDesired" in r for r in records) else []) + [
        (
            "reward",
            "Reward",
            "trainer step",
            [
                ("step", "reward", "trainer batch mean"),
                ("step", "rolloutReward", "rollouts (window mean)"),
                ("validationStep", "validationReward", "validation set (temperature 0)"),
            ],
        ),
        (
            "staleness",
            "Sample staleness (policy versions)",
            "trainer step",
            [("step", "stalenessMean", "mean"), ("step", "stalenessMax", "max")],
        ),
        (
            "throughput",
            "Throughput",
            "seconds since start",
            [
                ("elapsed", "samplesPerSecond", "samples/s consumed"),
                ("elapsed", "producedPerSecond", "samples/s produced"),
            ],
        ),
    ]


def plot(run_dir: pathlib.Path, out_dir: pathlib.Path | None = None) -> list[pathlib.Path]:
    """Write the PNGs; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    records = read_records(run_dir)
    target = out_dir or run_dir
    target.mkdir(parents=True, exist_ok=True)
    panels = _panels(records)
    written = []
    combined, axes = pyplot.subplots(len(panels), 1, figsize=(8, 3.2 * len(panels)))
    for (stem, title, xlabel, lines), combined_axis in zip(panels, axes, strict=True):
        single, axis = pyplot.subplots(figsize=(8, 3.5))
        for target_axis in (axis, combined_axis):
            for x_field, y_field, legend in lines:
                xs, ys = _series(records, x_field, y_field)
                if xs:
                    target_axis.plot(xs, ys, marker=".", linewidth=1.2, label=legend)
            target_axis.set_title(title)
            target_axis.set_xlabel(xlabel)
            target_axis.grid(alpha=0.3)
            if target_axis.lines:
                target_axis.legend(loc="best", fontsize="small")
        single.tight_layout()
        path = target / f"{stem}.png"
        single.savefig(path, dpi=100)
        pyplot.close(single)
        written.append(path)
    combined.tight_layout()
    path = target / "curves.png"
    combined.savefig(path, dpi=100)
    pyplot.close(combined)
    written.append(path)
    return written
