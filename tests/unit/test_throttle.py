"""throttle.Throttle: a burst of pokes costs one call per interval, and the last poke is always followed
by a call."""

from __future__ import annotations

import threading
import time

from asyncrl_operator import throttle


def test_a_burst_costs_a_bounded_number_of_calls_and_the_last_poke_is_served() -> None:
    calls: list[int] = []
    done = threading.Event()
    t = throttle.Throttle(0.3)

    def call(i: int) -> None:
        calls.append(i)
        if i == 99:
            done.set()

    start = time.monotonic()
    for i in range(100):
        t.poke("job", lambda i=i: call(i))  # type: ignore[misc]
        time.sleep(0.004)
    assert done.wait(2.0)
    elapsed = time.monotonic() - start
    assert calls[0] == 0 and calls[-1] == 99  # the first at once, the last one's call after the burst
    assert len(calls) <= 2 + elapsed / 0.3


def test_keys_are_throttled_apart() -> None:
    seen: list[str] = []
    both = threading.Barrier(3)
    t = throttle.Throttle(10.0)

    def call(key: str) -> None:
        seen.append(key)
        both.wait(2.0)

    for key in ("a", "b"):
        t.poke(key, lambda key=key: call(key))  # type: ignore[misc]
    both.wait(2.0)
    assert sorted(seen) == ["a", "b"]
