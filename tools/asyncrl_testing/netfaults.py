"""Network peers that misbehave on purpose, for tests of the rollout's weight-sync link."""

from __future__ import annotations

import socket
import threading


def slamming_door() -> int:
    """A local port whose every connection is accepted and closed at once (a store going down).

    A plain TCP connect gets through, so ``rendezvous.connect_store``'s probe passes, and c10d's client
    then retries its handshake until its timeout: a store call that takes seconds and then fails.
    Served by a daemon thread for the rest of the process."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            conn, _ = server.accept()
            conn.close()

    threading.Thread(target=serve, name="slamming-door", daemon=True).start()
    return int(server.getsockname()[1])
