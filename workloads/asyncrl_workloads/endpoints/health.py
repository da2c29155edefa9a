"""How long an endpoint has done nothing but fail, and when to give up on it.

Kept by ``client.Client`` (``client.health``), one per endpoint per process, updated after every attempt;
read by the judge's scorer and the teacher through ``Client.gave_up``. An endpoint whose every attempt
has failed for longer than ``giveUpAfterSeconds`` ends the process with the classified error
(``err.line()`` to the termination log, exit 3): the operator shows it in EndpointsReady and the restarted
pod checks again, rather than the job dropping samples forever behind a healthy-looking status.

A BadRequest (one request the server refused, e.g. a prompt too long) says nothing about the endpoint's
health: it neither starts nor ends a failing spell.
"""

from __future__ import annotations

from asyncrl_workloads.endpoints import errors


class Health:
    def __init__(self, give_up_after: float) -> None:
        self.give_up_after = give_up_after
        self.first_failure: float | None = None
        """When the first attempt failed after the last success (None: the last attempt succeeded)."""
        self.last_error: errors.EndpointError | None = None

    def succeeded(self) -> None:
        self.first_failure = None

    def failed(self, err: errors.EndpointError, now: float) -> None:
        if err.kind == "BadRequest":
            return
        if self.first_failure is None:
            self.first_failure = now
        self.last_error = err

    def failing_for(self, now: float) -> float:
        """Seconds since the first failure after the last success; 0 while the last attempt succeeded."""
        return 0.0 if self.first_failure is None else max(0.0, now - self.first_failure)

    def gave_up(self, now: float) -> errors.EndpointError | None:
        """The last error once ``failing_for(now)`` exceeds give_up_after, else None."""
        return self.last_error if self.failing_for(now) > self.give_up_after else None
