"""Polling until a condition on the live cluster holds, with a failure message that shows the last state.

Called by tests/cluster/* and other cluster-level tests: controllers act asynchronously, so assertions
about their effects (a pod Running, a dependent garbage-collected) poll with a deadline.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The condition did not hold before the deadline; an AssertionError so pytest reports it as a failure."""


def wait_until(
    observe: Callable[[], T],
    holds: Callable[[T], bool],
    what: str,
    timeout: float = 60.0,
    interval: float = 0.5,
) -> T:
    """Call `observe` until `holds(observation)`; return that observation, or fail showing the last one."""
    deadline = time.monotonic() + timeout
    while True:
        seen = observe()
        if holds(seen):
            return seen
        if time.monotonic() > deadline:
            message = f"timed out after {timeout:.0f}s waiting for {what}; last observed: {seen!r}"
            raise WaitTimeout(message[:4000])
        time.sleep(interval)


def wait_deleted(
    kubectl: Callable[..., subprocess.CompletedProcess[str]],
    kinds: str,
    name: str,
    namespace: str,
    what: str,
    timeout: float = 30.0,
) -> None:
    """Until `kubectl get KINDS NAME -n NAMESPACE` finds none of them (an operator's prune, a garbage
    collection); `kubectl` is a test's kubectl runner (the `kubectl` fixture or `cluster.kubectl`)."""
    wait_until(
        lambda: kubectl(
            "get", kinds, name, "-n", namespace, "--ignore-not-found", "-o", "name"
        ).stdout.strip(),
        lambda left: not left,
        what,
        timeout=timeout,
    )
