"""A token bucket (``rateLimit``: rps, burst) that every attempt against an endpoint passes.

Used by ``client.py`` (one bucket per Client, shared by its concurrent calls). It reserves rather than
polls: ``acquire`` takes a token at once — the count may go negative — and sleeps until the moment the
bucket would have held it. Taking happens without an ``await`` in between, so concurrent callers are
served in arrival order and, whatever they do, the grants in any window of W seconds number at most
``burst + rps * W``. A caller cancelled while it sleeps loses its token (the bucket errs on the slow side).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


class TokenBucket:
    """``rps`` tokens per second into a bucket of ``burst``; starts full."""

    def __init__(
        self,
        rps: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        if rps <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs rps > 0 and burst >= 1 (got {rps}, {burst})")
        self.rps, self.burst = rps, burst
        self._clock, self._sleep = clock, sleep
        self._tokens = float(burst)
        self._stamp = clock()

    def _refill(self, now: float) -> None:
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rps)
        self._stamp = now

    def reserve(self) -> float:
        """Take a token now; the seconds until it is due (0 when the bucket held one)."""
        self._refill(self._clock())
        self._tokens -= 1.0
        return max(0.0, -self._tokens / self.rps)

    async def acquire(self) -> float:
        """Wait for a token; returns the seconds waited."""
        wait = self.reserve()
        if wait > 0:
            await self._sleep(wait)
        return wait
