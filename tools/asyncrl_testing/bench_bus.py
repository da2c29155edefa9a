"""Bus benchmark P4 (a script, not a test): trajectories/s through asyncrl's bus vs raw nats-py.

    .venv/bin/python tools/asyncrl_testing/bench_bus.py --count 4000 --response-tokens 512

Both sides run against the same real nats-server and the same stream configuration (work queue, file
storage, max_msgs above the count so nothing is discarded), one publisher then one consumer:

- raw: `js.publish(subject, payload)` of pre-encoded bytes, then pull `fetch(256)` + `ack()` each;
- asyncrl: `jetstream.Publisher.publish(trajectory)` (encode + Nats-Msg-Id dedup header), then
  `jetstream.Consumer.fetch(256)` (decode + validate) + `ack()`;
- parts (a diagnostic, not P4): raw nats-py calls doing what asyncrl's bus does per message, inline
  (`codec.encode_trajectory` + the `Nats-Msg-Id` header on publish, `codec.decode_trajectory` on
  fetch). parts ÷ raw is what the codec and the dedup header cost; asyncrl ÷ parts is what the
  Publisher/Consumer classes (retries, stream check, delivery counts) add on top.

The payload bytes are identical (the raw side sends what the codec produced). Reports publish+consume
throughput of each (median over rounds) and the median of the paired per-round ratios asyncrl / raw
(goal >= 0.8), as one JSON line and a Markdown row, with the 1-minute load average: on a shared, loaded
machine the per-message CPU cost of asyncrl (encode, validate, decode) weighs more than on an idle one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

sys.path[:0] = [str(pathlib.Path(__file__).resolve().parents[2] / d) for d in ("workloads", "operator")]

import nats  # noqa: E402
from asyncrl_workloads.bus import codec, jetstream, trajectory  # noqa: E402
from asyncrl_workloads.local import natsserver  # noqa: E402


def make(i: int, prompt_tokens: int, response_tokens: int) -> trajectory.Trajectory:
    rng = random.Random(i)
    return trajectory.Trajectory(
        id=trajectory.trajectory_id("bench", 0, str(i // 8), i % 8), job="bench", replica=0,
        group_id=f"bench:{i // 8}", group_size=8, sample_index=i % 8,
        prompt_ids=[rng.randrange(32000) for _ in range(prompt_tokens)],
        response_ids=[rng.randrange(32000) for _ in range(response_tokens)],
        behaviour_logprobs=[-rng.random() * 5 for _ in range(response_tokens)],
        versions=[3] * response_tokens, mask=[1] * response_tokens, reward=rng.random(),
        created_at=time.time(),
    )  # fmt: skip


async def _drain(
    fetch: Callable[[], Awaitable[list[Any]]], ack_all: Callable[[list[Any]], Awaitable[None]], count: int
) -> None:
    got = 0
    while got < count:
        batch = await fetch()
        await ack_all(batch)
        got += len(batch)


async def _open(url: str, job: str, count: int) -> tuple[Any, Any, jetstream.StreamSettings]:
    """A connection and a fresh stream for one side of one round."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    settings = jetstream.StreamSettings("bench", job, max_size=count * 2)
    await jetstream.ensure_stream(js, settings)
    return nc, js, settings


async def _rate(nc: Any, t0: float, count: int) -> float:
    """Messages per second since ``t0``, once every ack has left the client."""
    await nc.flush()
    elapsed = time.perf_counter() - t0
    await nc.close()
    return count / elapsed


async def _ack_all(msgs: list[Any]) -> None:
    for m in msgs:
        await m.ack()


async def run_raw(url: str, payloads: list[bytes], job: str) -> float:
    nc, js, settings = await _open(url, job, len(payloads))
    sub = await js.pull_subscribe(settings.subject, durable="raw", stream=settings.stream)
    t0 = time.perf_counter()
    for data in payloads:
        await js.publish(settings.subject, data)
    await _drain(lambda: sub.fetch(256, timeout=5), _ack_all, len(payloads))
    return await _rate(nc, t0, len(payloads))


async def run_parts(url: str, trajs: list[trajectory.Trajectory], job: str) -> float:
    nc, js, settings = await _open(url, job, len(trajs))
    sub = await js.pull_subscribe(settings.subject, durable="parts", stream=settings.stream)
    t0 = time.perf_counter()
    for t in trajs:
        await js.publish(settings.subject, codec.encode_trajectory(t), headers={"Nats-Msg-Id": t.id})

    async def fetch() -> list[Any]:
        msgs = await sub.fetch(256, timeout=5)
        for m in msgs:
            codec.decode_trajectory(m.data)
        return list(msgs)

    await _drain(fetch, _ack_all, len(trajs))
    return await _rate(nc, t0, len(trajs))


async def run_asyncrl(url: str, trajs: list[trajectory.Trajectory], job: str) -> float:
    nc, js, settings = await _open(url, job, len(trajs))
    consumer = jetstream.Consumer(js, settings)
    await consumer.open()
    pub = jetstream.Publisher(js, settings)
    t0 = time.perf_counter()
    for t in trajs:
        await pub.publish(t)

    async def ack_all(received: list[Any]) -> None:
        for r in received:
            assert r.trajectory is not None
            await r.msg.ack()

    await _drain(lambda: consumer.fetch(256, 5.0), ack_all, len(trajs))
    return await _rate(nc, t0, len(trajs))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--response-tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=pathlib.Path, help="also write the result object here")
    args = parser.parse_args()
    trajs = [make(i, args.prompt_tokens, args.response_tokens) for i in range(args.count)]
    payloads = [codec.encode_trajectory(t) for t in trajs]
    with tempfile.TemporaryDirectory() as tmp, natsserver.start(store_dir=pathlib.Path(tmp) / "js") as server:
        raw, ours, parts = [], [], []
        for r in range(args.rounds):  # paired and interleaved: drift in machine load hits each side alike
            raw.append(asyncio.run(run_raw(server.url, payloads, f"raw{r}")))
            ours.append(asyncio.run(run_asyncrl(server.url, trajs, f"asyncrl{r}")))
            parts.append(asyncio.run(run_parts(server.url, trajs, f"parts{r}")))
    ratios = sorted(o / r for o, r in zip(ours, raw, strict=True))
    result = {
        "benchmark": "P4 bus",
        "count": args.count,
        "payload_bytes": sum(map(len, payloads)) // len(payloads),
        "raw_per_s": round(statistics.median(raw), 1),
        "asyncrl_per_s": round(statistics.median(ours), 1),
        "ratio": round(statistics.median(ratios), 3),
        "ratios": [round(x, 3) for x in ratios],
        "parts_per_s": round(statistics.median(parts), 1),
        "parts_over_raw": sorted(round(p / r, 3) for p, r in zip(parts, raw, strict=True)),
        "asyncrl_over_parts": sorted(round(o / p, 3) for o, p in zip(ours, parts, strict=True)),
        "rounds": args.rounds,
        "load_avg_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(
        f"| P4 bus: asyncrl ÷ raw nats-py (publish+fetch+ack, {result['payload_bytes']} B) "
        f"| {result['asyncrl_per_s']}/s ÷ {result['raw_per_s']}/s = **{result['ratio']}** | ≥ 0.8 |"
    )


if __name__ == "__main__":
    main()
