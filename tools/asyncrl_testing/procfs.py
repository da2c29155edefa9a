"""Reading a process from /proc (Linux): what the benchmarks and the e2e diagnostics measure it by."""

from __future__ import annotations

import os
import pathlib


def stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat after ``(comm)``: state ppid pgrp session ... (index 11, 12: utime, stime)."""
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int | str, fields: list[str] | None = None) -> float:
    """User + system CPU time the process has used (``fields``: its stat_fields, when already read)."""
    fields = fields if fields is not None else stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cmdline(pid: int | str, limit: int = 120) -> str:
    """The process's command line, arguments space-separated, cut at ``limit`` characters."""
    raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    return raw.replace(b"\0", b" ").decode(errors="replace")[:limit]


def _name_and_fields(stat: pathlib.Path) -> tuple[str, list[str]]:
    """A process's or thread's stat file, read once: its name (between the parentheses) and the
    fields after it (as ``stat_fields``)."""
    text = stat.read_text()
    return text[text.index("(") + 1 : text.rindex(")")], text.rsplit(")", 1)[1].split()


def session_processes(session: int) -> dict[int, str]:
    """pid -> name of every process in session ``session`` (orphans stay in their session)."""
    out = {}
    for proc in pathlib.Path("/proc").iterdir():
        try:
            if proc.name.isdigit():
                name, fields = _name_and_fields(proc / "stat")
                if int(fields[3]) == session:
                    out[int(proc.name)] = name
        except (OSError, ValueError, IndexError):
            continue  # a process that ended while we read
    return out


def session_thread_cpu(session: int) -> dict[str, float]:
    """CPU seconds of every thread of every process in session ``session``, summed by
    "process name/thread name" (a pool's threads share a name, so they add up)."""
    out: dict[str, float] = {}
    for pid, pname in session_processes(session).items():
        try:
            for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
                tname, tfields = _name_and_fields(task / "stat")
                key = f"{pname}/{tname}"
                out[key] = out.get(key, 0.0) + cpu_seconds(task.name, tfields)
        except (OSError, ValueError, IndexError):
            continue  # a process or thread that ended while we read
    return out


def _core_ticks(core: int) -> list[int]:
    """One CPU's /proc/stat line: user nice system idle iowait irq softirq steal ... (ticks)."""
    for line in pathlib.Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{core} "):
            return [int(x) for x in line.split()[1:]]
    raise ValueError(f"no cpu{core} in /proc/stat")


def core_busy_seconds(core: int) -> float:
    """Non-idle time of one CPU since boot (/proc/stat: all but idle and iowait)."""
    ticks = _core_ticks(core)
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def core_steal_seconds(core: int) -> float:
    """Time the hypervisor ran something else while this virtual CPU wanted to run (since boot)."""
    return _core_ticks(core)[7] / os.sysconf("SC_CLK_TCK")


def thread_affinity(pid: int | str) -> list[str]:
    """The distinct Cpus_allowed_list values of a process's threads (one entry when all agree)."""
    seen: set[str] = set()
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    seen.add(line.split()[1])
        except OSError:
            continue
    return sorted(seen)


def run_processes(run_dir: pathlib.Path) -> list[int]:
    """Pids of an `asyncrl run`'s processes: their environment holds ASYNCRL_STEP_LOG=<run dir>/steps.jsonl
    (set by the runner for every pod process and inherited by vLLM's engine cores and workers), or their
    command line names the run dir (the nats-server's store). Zombies are left out (they hold nothing)."""
    marker = f"ASYNCRL_STEP_LOG={run_dir / 'steps.jsonl'}".encode()
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if stat_fields(entry.name)[0] == "Z":
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in environ or str(run_dir).encode() in command:
            found.append(int(entry.name))
    return found
