"""An asyncio loop on a daemon thread of its own, where every endpoint call runs.

Used by ``rewards/scorer.py`` (the judge: ``await runner.run(client.chat(...))`` from vLLM's engine loop)
and by the trainer's teacher (``runner.call(client.prompt_logprobs(ids))`` from synchronous code). The
calls' network waits, retries and back-off sleeps then never hold the caller's loop, and one Client
(its connections, semaphore and bucket) lives on one loop, as asyncio requires.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Runner:
    def __init__(self, name: str = "endpoints") -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the loop thread (idempotent)."""
        if self._thread is not None:
            return
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"{self.name}-calls", daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop thread; cancelling the future cancels it there."""
        if self.loop is None or self._thread is None:
            coro.close()
            raise RuntimeError(f"runner {self.name} is not started")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` from another loop; its result or exception comes back here."""
        return await asyncio.wrap_future(self.submit(coro))

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` from synchronous code and block for its result."""
        return self.submit(coro).result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what still runs, stop the loop and join the thread (idempotent)."""
        loop, thread = self.loop, self._thread
        if loop is None or thread is None:
            return
        if thread.is_alive():
            asyncio.run_coroutine_threadsafe(_cancel_all(), loop).result(timeout)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
        if not thread.is_alive():
            loop.close()
        self.loop, self._thread = None, None


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
