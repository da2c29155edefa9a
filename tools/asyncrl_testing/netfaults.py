"""Network peers that misbehave on purpose, for tests of the rollout's weight-sync link, and a bus that
crashes (`crash_nats`)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import threading
import time
from collections.abc import Iterator

from asyncrl_workloads.local import natsserver


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


@contextlib.contextmanager
def deaf_listener(trickle_s: float | None = None) -> Iterator[int]:
    """A local port whose connections are accepted and then never answered (what a frozen process
    looks like from outside: its kernel completes the handshake and acks what is sent); with
    ``trickle_s``, answered slowly forever instead: one zero byte per connection every ``trickle_s``
    seconds, so a per-read socket timeout never fires. The connections are closed on exit, which ends
    any call still waiting on one."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    closing = threading.Event()

    def trickle() -> None:
        while trickle_s is not None and not closing.wait(trickle_s):
            for conn in list(held):
                with contextlib.suppress(OSError):
                    conn.send(b"\0")

    def serve() -> None:
        while not closing.is_set():
            try:
                conn, _ = server.accept()
            except OSError:  # closed on exit
                return
            held.append(conn)

    thread = threading.Thread(target=serve, name="deaf-listener", daemon=True)
    thread.start()
    threading.Thread(target=trickle, name="deaf-listener-trickle", daemon=True).start()
    try:
        yield int(server.getsockname()[1])
    finally:
        closing.set()
        server.close()
        for conn in held:
            conn.close()


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[None]:
    """SIGSTOP ``pid`` for the block, SIGCONT after (a trainer frozen by the kernel, a debugger, or a
    node under memory pressure). Waits until the kernel reports the process stopped, since a signal
    is delivered asynchronously: a call right after ``kill`` may still be answered."""
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10
        while _state(pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.005)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _state(pid: int) -> str:
    """The one-letter state in /proc/<pid>/stat (after the parenthesised command name)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def crash_nats(
    server: natsserver.NatsServer, outage_s: float, store_dir: pathlib.Path, log_path: pathlib.Path
) -> natsserver.NatsServer:
    """SIGKILL ``server`` and start nats-server again ``outage_s`` later on its port, with the JetStream
    store ``store_dir``: its own (a pod the kubelet restarts, its store on a volume) or an empty one (an
    emptyDir pod replaced). Returns the new server."""
    server.child.process.kill()
    server.child.process.wait()
    time.sleep(outage_s)
    return natsserver.start(store_dir=store_dir, log_path=log_path, port=server.port)
