"""How long an endpoint has done nothing but fail, and when to give up on it.

Kept by ``client.Client`` (``client.health``), one per endpoint per process, updated after every attempt;
read by the judge's scorer and the teacher through ``Client.gave_up``, and by the client itself, which
starts no retry once it has given up. An endpoint whose every attempt has failed for longer than
``giveUpAfterSeconds`` ends the process with the classified error (``err.line()`` to the termination log,
exit 3): the operator shows it in EndpointsReady and the restarted pod checks again, rather than the job
dropping samples forever behind a healthy-looking status.

A failing spell starts when its first failed attempt *started*, not when it ended: an attempt that hangs
until its deadline (timeoutSeconds) has been failing all along, and counting from its end would let
every hung attempt push the give-up back by a whole timeout. Nor does the spell reach back past the end
of the last success (an attempt that began before a concurrent one succeeded).

A BadRequest (one request the server refused, e.g. a prompt too long) says nothing about the endpoint's
health: it neither starts nor ends a failing spell.
"""

from __future__ import annotations

from asyncrl_workloads.endpoints import errors


class Health:
    def __init__(self, give_up_after: float) -> None:
        self.give_up_after = give_up_after
        self.first_failure: float | None = None
        """When the failing spell began: the start of the earliest attempt that failed since the last
        success ended (None: the last attempt to end succeeded)."""
        self.last_success: float | None = None
        """When the last successful attempt ended."""
        self.last_error: errors.EndpointError | None = None

    def succeeded(self, now: float) -> None:
        self.first_failure = None
        self.last_success = now

    def failed(self, err: errors.EndpointError, started: float) -> None:
        """An attempt that began at ``started`` ended with ``err``."""
        if err.kind == "BadRequest":
            return
        began = started if self.last_success is None else max(started, self.last_success)
        self.first_failure = began if self.first_failure is None else min(self.first_failure, began)
        self.last_error = err

    def failing_for(self, now: float) -> float:
        """Seconds since the failing spell began; 0 while the last attempt to end succeeded."""
        return 0.0 if self.first_failure is None else max(0.0, now - self.first_failure)

    def gave_up(self, now: float) -> errors.EndpointError | None:
        """The last error once ``failing_for(now)`` exceeds give_up_after, else None."""
        return self.last_error if self.failing_for(now) > self.give_up_after else None
