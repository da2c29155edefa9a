"""How much the rollout and the trainer slow each other down through the hardware alone (a script, not
a test): the ceiling this machine puts on P1 before any asyncrl code is involved.

    .venv/bin/python tools/asyncrl_testing/bench_interference.py --rounds 2 --json /tmp/intf.json

P1 divides the async rate by rollout-only and trainer-only rates measured with the other core idle.
In the async phase both cores are busy: if the two cores share anything (SMT siblings on the host,
caches, memory bandwidth, a power budget), each process runs slower than alone even though they
never wait for each other. This measures that directly with the same processes, pinning and tiny
job as ``bench_modes.py``, but with no link between them (no bus, no weight sync):

(a)  rollout-only alone (rollout core), produced/s;
(ab) a rollout-only job and, beside it on the trainer core, a trainer-only job training on (a)'s
     stream (pre-filled with real samples): both rates over the same window;
(b)  the trainer-only job alone, on (ab)'s rollout stream;
(a') rollout-only alone again (the host drifts: (a) and (a') bracket (ab)).

Per round: rollout beside / alone = ab.rollout ÷ mean(a, a'), trainer beside / alone = ab.trainer ÷ b.
The result is the median over rounds. A ratio of 0.9 means P1 cannot exceed ~0.9 on this host however
well the code overlaps generation and training.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path[:0] = [str(pathlib.Path(__file__).resolve().parent)]

import bench_modes as bm  # noqa: E402


def beside(bench: bm.Bench, rjob: str, tjob: str) -> dict[str, Any]:
    """A rollout-only job on the rollout core and a trainer-only job (on ``tjob``'s pre-filled stream)
    on the trainer core at once; both rates over one window."""
    rcfg, rport = bench.config(rjob, "async", 1024), bench.port()
    tcfg, tport = bench.config(tjob, "async", 1024), bench.port()
    tag = f"beside-{tjob}"
    log = bench.work / f"{tag}-steps.jsonl"
    roll = bm.Proc(f"{rjob}-rollout", "asyncrl_workloads.entrypoints.rollout", rcfg, bench.work,
                   bm.rollout_env(rport), bench.rcore)  # fmt: skip
    procs = [roll]
    try:
        bm.wait_until(lambda: bm.scrape_ok(rport, bm.PRODUCED) > 0, procs, 300, "the first produced sample")
        tr = bm.Proc(f"{tag}-trainer", "asyncrl_workloads.entrypoints.trainer", tcfg, bench.work,
                     bm.trainer_env(bench.work, tag, tport), bench.tcore)  # fmt: skip
        procs.append(tr)
        bm.wait_until(lambda: len(bm.read_steps(log)) >= 2, procs, 300, "the trainer's second step")
        time.sleep(5.0)  # both warm
        m0, t0, start = bm.scrape(rport, (bm.PRODUCED, bm.TOKENS)), time.monotonic(), time.time()
        time.sleep(bench.a.measure)
        for p in procs:
            p.check()
        m1, t1, end = bm.scrape(rport, (bm.PRODUCED, bm.TOKENS)), time.monotonic(), time.time()
        bench.affinity[f"{rjob}-rollout"], bench.affinity[f"{tag}-trainer"] = roll.affinity(), tr.affinity()
    finally:
        for p in reversed(procs):
            p.stop()
    produced = m1[bm.PRODUCED] - m0[bm.PRODUCED]
    trainer = bm.window_rate(bm.read_steps(log), start, end)
    return {
        "rollout_per_s": round(produced / (t1 - t0), 2),
        "rollout_tokens_per_s": round((m1[bm.TOKENS] - m0[bm.TOKENS]) / (t1 - t0), 1),
        "trainer_per_s": trainer["per_s"],
        "trainer_steps": trainer["steps"],
        "trainer_queue_left": bm.read_steps(log)[-1]["counters"]["queue_depth"],
    }


def run_round(bench: bm.Bench, i: int) -> dict[str, Any]:
    a = bench.rollout_only(f"intf-r{i}-a")
    print(f"round {i} a", json.dumps(a), flush=True)
    ab = beside(bench, f"intf-r{i}-ab", f"intf-r{i}-a")
    print(f"round {i} ab", json.dumps(ab), flush=True)
    b = bench.trainer_only(f"intf-r{i}-ab")
    print(f"round {i} b", json.dumps(b), flush=True)
    a2 = bench.rollout_only(f"intf-r{i}-a2")
    print(f"round {i} a'", json.dumps(a2), flush=True)
    alone = statistics.mean([a["per_s"], a2["per_s"]])
    out = {"a": a, "ab": ab, "b": b, "a2": a2, "rollout_alone": round(alone, 2)}
    out["rollout_ratio"] = round(ab["rollout_per_s"] / alone, 3)
    tokens_alone = statistics.mean([a["tokens_per_s"], a2["tokens_per_s"]])
    out["rollout_tokens_ratio"] = round(ab["rollout_tokens_per_s"] / tokens_alone, 3)  # length noise out
    out["trainer_ratio"] = (
        round(ab["trainer_per_s"] / b["per_s"], 3) if ab["trainer_per_s"] and b["per_s"] else None
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--measure", type=float, default=35.0, help="seconds measured per phase")
    parser.add_argument(
        "--warmup",
        type=float,
        default=20.0,
        help="rollout-only: seconds after the first sample (also fills the stream (ab) trains on)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rollout-core", type=int, default=1)
    parser.add_argument("--trainer-core", type=int, default=0)
    parser.add_argument("--json", type=pathlib.Path, help="write the result object here")
    parser.add_argument("--keep", type=pathlib.Path, help="work dir to keep (logs, step logs, configs)")
    args = parser.parse_args()
    # the job shape of bench_modes: every setting its Bench reads, from its own defaults (a copied
    # list went stale when bench_modes gained --inflight)
    for key, value in vars(bm.build_parser().parse_args([])).items():
        if not hasattr(args, key):
            setattr(args, key, value)
    pin, why = bm.pinnable((args.rollout_core, args.trainer_core))
    if not pin:
        print(f"cannot pin: {why}", file=sys.stderr)
        return 2
    from asyncrl_workloads import tinymodel
    from asyncrl_workloads.local import natsserver

    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="asyncrl-intf-") as tmp:
        work = args.keep or pathlib.Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        model = tinymodel.create_tiny_model(work / "model", seed=0)
        t_begin = time.monotonic()
        with natsserver.start(store_dir=work / "nats", log_path=work / "nats.log") as server:
            bench = bm.Bench(args, work, model, server.url, pin)
            rounds = [run_round(bench, i) for i in range(args.rounds)]
    result = {
        "benchmark": "rollout/trainer hardware interference",
        "rollout_beside_over_alone": round(statistics.median(r["rollout_ratio"] for r in rounds), 3),
        "trainer_beside_over_alone": round(
            statistics.median(r["trainer_ratio"] for r in rounds if r["trainer_ratio"] is not None), 3
        ),
        "rounds": rounds,
        "pinning": bm.pin_verdict(pin, why, bench.affinity, args.rollout_core, args.trainer_core),
        "load_avg_start": [round(x, 2) for x in load], "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.monotonic() - t_begin, 1),
    }  # fmt: skip
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
