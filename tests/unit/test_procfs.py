"""procfs: how the modes benchmark attributes the rollout core's time (per session, per thread)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

from asyncrl_testing import procfs

SPIN = "import sys, time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\nsys.stdin.read()"


def child(seconds: float) -> subprocess.Popen[bytes]:
    """A process in its own session that spins ``seconds`` and then waits for its stdin to close."""
    return subprocess.Popen(
        [sys.executable, "-c", SPIN.format(s=seconds)], stdin=subprocess.PIPE, start_new_session=True
    )


def test_session_cpu_counts_only_that_sessions_threads() -> None:
    busy, idle = child(0.6), child(0.0)
    try:
        time.sleep(1.2)  # both are alive (reading stdin); the busy one has spun
        spent = procfs.session_thread_cpu(busy.pid)
        quiet = procfs.session_thread_cpu(idle.pid)
    finally:
        for p in (busy, idle):
            p.communicate(b"")
    assert sum(spent.values()) >= 0.4, spent
    assert sum(quiet.values()) < 0.3, quiet  # interpreter start-up only, none of the spin
    assert all(key.count("/") == 1 for key in spent), spent  # "process/thread"
    assert procfs.session_thread_cpu(busy.pid) == {}  # the session is gone


def test_core_busy_seconds_grows_while_a_pinned_process_spins() -> None:
    core = min(os.sched_getaffinity(0))
    before = procfs.core_busy_seconds(core)
    p = subprocess.Popen(
        [sys.executable, "-c", SPIN.format(s=0.5)],
        stdin=subprocess.PIPE,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )
    p.communicate(b"")
    assert procfs.core_busy_seconds(core) - before >= 0.4


def test_core_steal_is_the_eighth_column_of_the_cores_stat_line() -> None:
    core = min(os.sched_getaffinity(0))
    stat = pathlib.Path("/proc/stat").read_text().splitlines()
    line = next(x for x in stat if x.startswith(f"cpu{core} "))
    # user nice system idle iowait irq softirq steal: steal only moves forward between two reads
    expected = int(line.split()[8]) / os.sysconf("SC_CLK_TCK")
    assert expected <= procfs.core_steal_seconds(core) <= expected + 1.0
    assert procfs.core_steal_seconds(core) <= procfs.core_busy_seconds(core)  # steal is counted as busy


def test_thread_affinity_reads_back_a_pinned_processs_mask() -> None:
    core = max(os.sched_getaffinity(0))
    p = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )
    try:
        pinned = procfs.thread_affinity(p.pid)
    finally:
        p.communicate(b"")
    assert pinned == [str(core)]
    assert len(procfs.thread_affinity(os.getpid())) >= 1
