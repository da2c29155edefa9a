"""An asyncio loop on a thread of its own, so one vLLM engine serves every test of a module.

vLLM's AsyncLLM runs its output handler on the loop that started it; tests that share one engine (a
module-scoped fixture, ~30 s saved per test) submit their coroutines to that loop: ``host.run(coro)``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-engine-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 300) -> T:
        """Run ``coro`` on the loop thread and return its result (its exception is raised here)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
