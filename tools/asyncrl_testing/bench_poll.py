"""What the rollout's plan poll costs its core (a script, not a test): CPU time of an asyncio loop.

    taskset -c 1 .venv/bin/python tools/asyncrl_testing/bench_poll.py        # ~1 min

A real TCPStore server in another process (as the trainer hosts it); in this process an asyncio loop
that, for ``--seconds`` each: only sleeps 20 ms ("idle"); polls a counter key through
``asyncio.to_thread`` then sleeps 20 ms ("to_thread", what ``rollout/worker.py``'s control loop did
until ``PlanWatcher``); polls with a direct call then sleeps ("direct"); polls from a thread of its
own that sleeps 20 ms between peeks while the loop waits ("thread", what ``PlanWatcher`` does);
blocks in ``TCPStore.wait`` on a key that never appears, with a 0.5 s timeout ("wait"; torch prints
two c10d warnings per timed-out wait). Reports process CPU seconds ÷ wall seconds per variant, each
run twice, interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import pathlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "workloads")]

import torch.distributed as dist  # noqa: E402
from asyncrl_workloads.local.process import free_port  # noqa: E402
from asyncrl_workloads.weightsync import rendezvous  # noqa: E402

PERIOD_S = 0.02


async def run(kind: str, seconds: float, peek: Callable[[], int], wait: Callable[[], None]) -> float:
    t0, c0 = time.monotonic(), time.process_time()
    if kind == "thread":  # a poller thread of its own; the loop wakes only for what it hands over
        done = threading.Event()

        def poller() -> None:
            while not done.wait(PERIOD_S):
                peek()

        thread = threading.Thread(target=poller, daemon=True)
        thread.start()
        await asyncio.sleep(seconds)
        done.set()
        thread.join()
        return (time.process_time() - c0) / (time.monotonic() - t0)
    while time.monotonic() - t0 < seconds:
        if kind == "to_thread":
            await asyncio.to_thread(peek)
        elif kind == "direct":
            peek()
        elif kind == "wait":
            await asyncio.to_thread(wait)
            continue
        await asyncio.sleep(PERIOD_S)
    return (time.process_time() - c0) / (time.monotonic() - t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=8.0, help="per variant and repeat")
    args = parser.parse_args()
    port = free_port()
    code = (
        f"import sys, time; sys.path[:0] = [{str(REPO / 'workloads')!r}]; "
        "from asyncrl_workloads.weightsync import rendezvous; "
        f"s = rendezvous.host_store({port}, 30); time.sleep(3600)"
    )  # the trainer's store, as the trainer hosts it
    server = subprocess.Popen([sys.executable, "-c", code])
    try:
        store = rendezvous.connect_store("127.0.0.1", port, 30)  # as ReplicaLink connects

        def peek() -> int:
            return rendezvous.peek_int(store, rendezvous.PLAN_SEQ)  # ReplicaLink.poll's round trip

        def wait() -> None:
            with contextlib.suppress(RuntimeError, dist.DistStoreError):  # the timeout
                store.wait(["never"], datetime.timedelta(seconds=0.5))

        out: dict[str, list[float]] = {}
        for kind in ("idle", "to_thread", "direct", "thread", "wait") * 2:
            out.setdefault(kind, []).append(round(asyncio.run(run(kind, args.seconds, peek, wait)), 4))
        peek()  # the client still answers after timed-out waits
    finally:
        server.kill()
        server.wait()
    print(json.dumps({"benchmark": "plan poll CPU", "cpu_per_wall": out, "period_s": PERIOD_S}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
