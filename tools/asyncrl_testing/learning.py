"""What the learning e2e tests measure a running job by: the learning criterion, a process's metrics,
the bus stream's state (tests/e2e/test_async_learning.py, tests/e2e/test_gateway_learning.py)."""

from __future__ import annotations

import asyncio
import statistics
import urllib.request

import nats
from asyncrl_workloads.bus import subjects
from prometheus_client import parser


def assert_rises(values: list[float], what: str) -> None:
    """The last fifth's mean exceeds the first fifth's by > 3 standard errors (and by 0.05)."""
    fifth = len(values) // 5
    first, last = values[:fifth], values[-fifth:]
    stderr = (statistics.variance(first) / fifth + statistics.variance(last) / fifth) ** 0.5
    gain = statistics.mean(last) - statistics.mean(first)
    print(
        f"{what} first fifth {statistics.mean(first):.3f} last fifth {statistics.mean(last):.3f} "
        f"gain {gain:.3f} ({gain / max(stderr, 1e-9):.1f} standard errors)"
    )
    assert gain > 3 * stderr and gain > 0.05, what


Sample = tuple[str, tuple[tuple[str, str], ...], float]


def metric_samples(port: int, prefixes: tuple[str, ...] = ("asyncrl_",)) -> set[Sample]:
    """The samples a process's /metrics on 127.0.0.1:``port`` shows now, of metrics whose name starts
    with one of ``prefixes``: (name, sorted labels, value)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items())), float(s.value))
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(prefixes)
    }


def total(samples: set[Sample], name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels``."""
    return sum(
        value for n, have, value in samples if n == name and set(labels.items()) <= set(dict(have).items())
    )


def stream_state(url: str, namespace: str, job: str) -> tuple[int, int]:
    """The job's trajectory stream: (last sequence = messages ever stored, messages in it now)."""

    async def go() -> tuple[int, int]:
        nc = await nats.connect(url)
        try:
            info = await nc.jetstream().stream_info(subjects.stream_name(namespace, job))
        finally:
            await nc.close()
        return int(info.state.last_seq), int(info.state.messages)

    return asyncio.run(go())
