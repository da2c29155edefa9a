"""`jetstream.connect`'s first connect: a bus that is not there fails it with nats-py's own error,
whatever the failed attempts looked like (the reconnect-forever setting applies only afterwards)."""

from __future__ import annotations

import asyncio
import time

import nats.errors
import pytest
from asyncrl_testing import netfaults
from asyncrl_workloads.bus import jetstream
from asyncrl_workloads.local import process


def test_nothing_listening_fails_the_first_connect_after_its_attempts() -> None:
    started = time.monotonic()
    with pytest.raises(nats.errors.NoServersError):
        asyncio.run(jetstream.connect(f"nats://127.0.0.1:{process.free_port()}"))
    assert time.monotonic() - started < 30  # attempts, not forever


def test_a_peer_that_never_answers_fails_the_first_connect_too() -> None:
    """Attempts that time out (not refused) reach the error callback before the client exists."""
    with netfaults.deaf_listener() as port, pytest.raises(nats.errors.NoServersError):
        asyncio.run(jetstream.connect(f"nats://127.0.0.1:{port}", connect_timeout=0.3))
