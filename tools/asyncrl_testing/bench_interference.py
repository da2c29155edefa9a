"""How much a training trainer slows the rollout through the hardware alone (a script, not a test):
the ceiling this machine puts on P1 before any asyncrl code couples the two.

    .venv/bin/python tools/asyncrl_testing/bench_interference.py --json /tmp/intf.json     # ~5 min
    .venv/bin/python tools/asyncrl_testing/bench_interference.py --coupled --pairs 8 --window 30 \
        --settle 3 --json /tmp/p1-paired.json                                              # ~10 min

P1 divides the async rate by a rollout-only rate measured with the other core idle. In the async
phase both cores are busy: if they share anything (caches, memory bandwidth, a power budget), the
rollout generates slower beside the trainer even though nothing makes it wait. Measured here with
the processes, pinning and tiny job of ``bench_modes.py`` and no link between them (no shared
stream, no weight sync):

- one rollout-only job runs on the rollout core for the whole measurement;
- beside it, on the trainer core, a trainer trains on a stream of its own, pre-filled with
  synthetic groups shaped like the rollout's (geometric response lengths, mean ~75, cut at
  ``--max-tokens``; rewards vary within a group), enough that it never runs dry;
- the trainer is switched on and off (SIGCONT / SIGSTOP to its process group) in ``--pairs`` pairs
  of ``--window`` s windows, ordered on-off, off-on, ... (ABBA: a linear drift of the host cancels
  within two pairs); the rollout's generated tokens and samples are read from its /metrics at each
  window's edges, after ``--settle`` s.

Per pair: rollout rate with the trainer training ÷ with it stopped. The result is the median over
pairs, by tokens (free of the response-length noise of a window) and by samples. The trainer's
steps per window are reported: every "on" window must have some, every "off" window none. A ratio of
0.9 means P1 cannot exceed ~0.9 on this host however well the code overlaps generation and training.
An earlier version of this script ran the rollout alone and beside a trainer in separate phases;
host drift between phases (±10%) and a trainer whose pre-filled queue ran dry mid-window made it
inconclusive (benchmarks/NOTES.md).

``--coupled``: P1 itself with windows paired in time. One real async job (rollout and trainer of the
same job: its stream, its weight-sync group, a sync every step), and the switch is the trainer's
JetStream consumer, paused and resumed (``pause_consumer``, nats-server 2.11+): paused, the trainer
gets no samples, takes no step and broadcasts nothing, while its process (and the store the rollout
polls) stays up, so the rollout runs as in rollout-only (the stream takes what it publishes); resumed,
the trainer trains on what the rollout produces and every step's weights go to the rollout, which
pauses to reload them and (``kvCacheOnUpdate: recompute``) prefills its in-flight requests again.
On/off is then async ÷ rollout-only for the same process minutes apart, the way P1 divides them
(the trainer, ~3x faster here, is never the bound). maxStaleness is 1024, so the admission bound never
closes in an off window (in bench_modes' async phases, with 2, it never closed either). The trainer
would catch up the backlog of each off window at ~3x the steady rate of syncs, a bias against
async: switching on purges the stream first (``consumer_switch``); syncs per second are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import pathlib
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path[:0] = [str(pathlib.Path(__file__).resolve().parent)]

import bench_modes as bm  # noqa: E402

SCRAPED = (bm.PRODUCED, bm.TOKENS, bm.PAUSE_COUNT, bm.PAUSE_SUM)


def prefill(url: str, job: str, groups: int, n: int, max_tokens: int, seed: int = 0) -> int:
    """Publish ``groups`` synthetic groups of ``n`` to ``job``'s stream (as bench_modes configures it)."""
    import nats
    from asyncrl_workloads import tinymodel
    from asyncrl_workloads.bus import jetstream, trajectory

    rng = random.Random(seed)
    ids = sorted(tinymodel.vocabulary().values())

    async def go() -> int:
        nc = await nats.connect(url)
        js = nc.jetstream()
        settings = jetstream.StreamSettings(bm.NS, job, max_size=200_000)
        await jetstream.ensure_stream(js, settings)
        pub, sent = jetstream.Publisher(js, settings), 0
        for g in range(groups):
            prompt = [rng.choice(ids) for _ in range(24)]
            for j in range(n):
                length = min(1 + int(rng.expovariate(1 / 75)), max_tokens)
                sent += await pub.publish(trajectory.Trajectory(
                    id=trajectory.trajectory_id(job, 0, str(g), j), job=job, replica=0,
                    group_id=f"{job}:{g}", group_size=n, sample_index=j, prompt_ids=prompt,
                    response_ids=[rng.choice(ids) for _ in range(length)],
                    behaviour_logprobs=[-4.6 * rng.random() for _ in range(length)],
                    versions=[0] * length, mask=[1] * length, reward=float(rng.random() < 0.3),
                    created_at=time.time(),
                ))  # fmt: skip
        await nc.close()
        return sent

    return asyncio.run(go())


def consumer_switch(url: str, job: str) -> Callable[[bool], None]:
    """Resume (True) or pause (False) the trainer's JetStream consumer of ``job``'s stream.

    Resuming first purges what the stream took while paused: the trainer starts again from fresh
    samples at the rate they come, as in steady async, instead of catching up a backlog at ~3 steps
    (and syncs) per step's worth of rollout time. Samples it had pulled before the pause it still
    trains; their acks then name deleted messages, which the server ignores."""
    import nats
    from asyncrl_workloads.bus import jetstream, subjects

    stream = jetstream.StreamSettings(bm.NS, job, max_size=1).stream

    async def go(on: bool) -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        if on:
            await js.purge_stream(stream)
            await js.resume_consumer(stream, subjects.TRAINER_CONSUMER)
        else:
            until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)
            await js.pause_consumer(stream, subjects.TRAINER_CONSUMER, until.strftime("%Y-%m-%dT%H:%M:%SZ"))
        await nc.close()

    return lambda on: asyncio.run(go(on))


def toggled(bench: bm.Bench, pairs: int, window: float, settle: float, coupled: bool) -> dict[str, Any]:
    rjob, tjob = ("intf-async", "intf-async") if coupled else ("intf-rollout", "intf-trainer")
    published = 0
    if not coupled:
        groups = int(pairs * (window + settle) * 130 / 8) + 64  # > 130 samples/s of training, every on window
        published = prefill(bench.url, tjob, groups, 8, bench.a.max_tokens)
    rcfg, rport = bench.config(rjob, "async", 1024), bench.port()
    tcfg, tport = (rcfg if coupled else bench.config(tjob, "async", 1024)), bench.port()
    log = bench.work / "intf-trainer-steps.jsonl"
    trainer_args = ("intf-trainer", "asyncrl_workloads.entrypoints.trainer", tcfg, bench.work,
                    bm.trainer_env(bench.work, "intf-trainer", tport), bench.tcore)  # fmt: skip
    procs: list[bm.Proc] = [bm.Proc(*trainer_args)] if coupled else []  # it hosts the weight-sync store
    roll = bm.Proc("intf-rollout", "asyncrl_workloads.entrypoints.rollout", rcfg, bench.work,
                   bm.rollout_env(rport), bench.rcore)  # fmt: skip
    procs.append(roll)
    windows: list[dict[str, Any]] = []

    def steal() -> float:  # a virtual machine's rate can change with what its host runs
        return bm.procfs.core_steal_seconds(bench.rcore) if bench.rcore is not None else 0.0

    try:
        bm.wait_until(lambda: bm.scrape_ok(rport, bm.PRODUCED) > 0, procs, 300, "the first produced sample")
        if not coupled:
            procs.append(bm.Proc(*trainer_args))
        tr = procs[0] if coupled else procs[-1]
        bm.wait_until(lambda: len(bm.read_steps(log)) >= 2, procs, 300, "the trainer's second step")
        bench.affinity["intf-rollout"], bench.affinity["intf-trainer"] = roll.affinity(), tr.affinity()
        if coupled:
            switch = consumer_switch(bench.url, tjob)
        else:

            def switch(on: bool) -> None:
                os.killpg(tr.p.pid, signal.SIGCONT if on else signal.SIGSTOP)

        state = True
        for i in range(pairs):
            for on in (True, False) if i % 2 == 0 else (False, True):
                if on != state:  # ABBA: an on window may follow an on window
                    switch(on)
                    state = on
                time.sleep(settle)
                for p in procs:
                    p.check()
                steps0, m0, t0 = len(bm.read_steps(log)), bm.scrape(rport, SCRAPED), time.monotonic()
                use, steal0 = bm.CoreUse(tr, bench.tcore), steal()
                time.sleep(window)
                steps1, m1, t1 = len(bm.read_steps(log)), bm.scrape(rport, SCRAPED), time.monotonic()
                windows.append({
                    "pair": i, "trainer": "on" if on else "off", "trainer_steps": steps1 - steps0,
                    "trainer_core_share": use.result()["session_fraction"],
                    "tokens_per_s": round((m1[bm.TOKENS] - m0[bm.TOKENS]) / (t1 - t0), 1),
                    "samples_per_s": round((m1[bm.PRODUCED] - m0[bm.PRODUCED]) / (t1 - t0), 2),
                    "syncs_per_s": round((m1[bm.PAUSE_COUNT] - m0[bm.PAUSE_COUNT]) / (t1 - t0), 3),
                    "pause_s": round(m1[bm.PAUSE_SUM] - m0[bm.PAUSE_SUM], 3),
                    "rollout_core_steal": round((steal() - steal0) / (t1 - t0), 4),
                })  # fmt: skip
                print(json.dumps(windows[-1]), flush=True)
        if not state:
            switch(True)
        queue_left = bm.read_steps(log)[-1]["counters"]["queue_depth"]
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.p.pid, signal.SIGCONT)  # a stopped process would not see SIGTERM
            p.stop()
    by: dict[str, list[float]] = {"tokens": [], "samples": []}
    for i in range(pairs):
        pair = {w["trainer"]: w for w in windows if w["pair"] == i}
        w_on, w_off = pair["on"], pair["off"]
        by["tokens"].append(w_on["tokens_per_s"] / w_off["tokens_per_s"])
        by["samples"].append(w_on["samples_per_s"] / w_off["samples_per_s"])
    clean = all((w["trainer_steps"] > 0) == (w["trainer"] == "on") for w in windows)
    return {
        "rollout_tokens_on_over_off": round(statistics.median(by["tokens"]), 3),
        "rollout_samples_on_over_off": round(statistics.median(by["samples"]), 3),
        "pairs_tokens": [round(x, 3) for x in by["tokens"]],
        "pairs_samples": [round(x, 3) for x in by["samples"]],
        "windows": windows,
        "trainer_steps_only_when_on": clean,
        "trainer_queue_left": queue_left,
        "prefilled": published,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pairs", type=int, default=8, help="on/off pairs of windows")
    parser.add_argument("--window", type=float, default=12.0, help="seconds measured per window")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds after each switch")
    parser.add_argument(
        "--coupled", action="store_true",
        help="P1 paired in time: one async job, its trainer's consumer paused/resumed (module docstring)",
    )  # fmt: skip
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
            measured = toggled(bench, args.pairs, args.window, args.settle, args.coupled)
    result = {
        "benchmark": "P1 paired: async ÷ rollout-only, one async job, trainer consumer on/off"
        if args.coupled
        else "rollout slowed by a training trainer beside it (hardware only)",
        "coupled": args.coupled,
        **measured,
        "pairs": args.pairs, "window_s": args.window, "settle_s": args.settle,
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
