"""One control-plane component as a child process: its own process group, its own log, readiness, teardown.

Called by `cluster` for etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok. Each
component runs in a new session (so its whole process group is signalled on stop, never anything found
by name) and, on Linux, asks the kernel to kill it if the thread that started it dies (PR_SET_PDEATHSIG),
so a SIGKILLed test run leaves no orphan behind.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from asyncrl_workloads.local import process

PR_SET_PDEATHSIG = 1
LOG_TAIL_LINES = 30


class ComponentNotReady(RuntimeError):
    """A component exited or did not pass its readiness check; the message carries its log tail."""


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def log_tail(path: pathlib.Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open(errors="replace") as handle:
            return "".join(collections.deque(handle, maxlen=lines))
    except OSError:
        return "(no log)"


class Component:
    """A started component process; `stop` kills its process group and is safe to call twice."""

    def __init__(self, name: str, argv: Sequence[str], log_path: pathlib.Path, cwd: pathlib.Path,
                 die_with_parent: bool = True) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent if die_with_parent else None,
            )
        self.pgid = self.process.pid  # a new session's leader: its pid is the process group id

    def fail(self, why: str) -> ComponentNotReady:
        return ComponentNotReady(
            f"{self.name} {why}; last {LOG_TAIL_LINES} lines of {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def wait_ready(self, check: Callable[[], bool], timeout: float, interval: float = 0.2) -> float:
        """Poll `check` until it returns True; raise ComponentNotReady if the process exits or time runs out.

        Returns the seconds spent waiting. Exceptions from `check` count as "not ready yet".
        """
        start = time.monotonic()
        last_error = ""
        while True:
            code = self.process.poll()
            if code is not None:
                raise self.fail(f"exited with code {code} before becoming ready")
            try:
                if check():
                    return time.monotonic() - start
            except Exception as exc:  # any failure of a probe means "not ready yet"
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() - start > timeout:
                detail = f" (last probe error: {last_error})" if last_error else ""
                raise self.fail(f"did not become ready within {timeout:.0f}s{detail}")
            time.sleep(interval)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after `grace` seconds."""
        if self.process.returncode is not None and not process.group_alive(self.pgid):
            return
        process.signal_group(self.pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace)
        process.signal_group(self.pgid, signal.SIGKILL)
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{self.name} (pid {self.process.pid}) survived SIGKILL") from exc
