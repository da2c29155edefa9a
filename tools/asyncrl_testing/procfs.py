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
