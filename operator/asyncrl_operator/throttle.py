"""At most one call per key per interval, and always one after the last poke: pod events -> status refresh.

Used by ``asyncrl_operator.pod_events.handle_pod``: a burst of pod events of one job (a gang starting,
a crash loop, kwok or the kubelet rewriting status) costs one status refresh per interval instead of one
per event, and the refresh after the last event always runs, so what a pod reported reaches the job's
status within ``interval`` (plus the refresh itself). Calls run on a timer thread; a failing call is
logged, not raised (the next poke or the resync loop tries again).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Hashable

log = logging.getLogger(__name__)
_MAX_REMEMBERED = 4096


class Throttle:
    """Per-key trailing throttle."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._guard = threading.Lock()
        self._pending: dict[Hashable, Callable[[], None]] = {}
        self._last: collections.OrderedDict[Hashable, float] = collections.OrderedDict()

    def poke(self, key: Hashable, call: Callable[[], None]) -> None:
        """Run ``call`` now if ``key`` ran no call in the last interval, else once when it has passed
        (a call already waiting for ``key`` is replaced by this one)."""
        with self._guard:
            waiting = key in self._pending
            self._pending[key] = call
            if waiting:
                return
            delay = max(0.0, self._last.get(key, -self.interval) + self.interval - time.monotonic())
        timer = threading.Timer(delay, self._fire, (key,))
        timer.daemon = True
        timer.start()

    def _fire(self, key: Hashable) -> None:
        with self._guard:
            call = self._pending.pop(key)
            self._last[key] = time.monotonic()
            self._last.move_to_end(key)
            while len(self._last) > _MAX_REMEMBERED:
                self._last.popitem(last=False)
        try:
            call()
        except Exception:
            log.exception("throttled call for %s failed", key)
