"""The termination message: the one line a container leaves for Kubernetes when it exits.

Written by the rollout and the trainer just before they exit on an error the user must see (an endpoint's
``EndpointError.line()``, then exit code 3); the kubelet copies the file into the container status
(``state.terminated.message``), where the operator reads it into the job's conditions. Kubernetes keeps
at most 4096 bytes; a longer line is cut on a character boundary. Writing never raises: the process is
already on its way out with a better error to report than a failed write.
"""

from __future__ import annotations

import contextlib
import os

PATH_ENV = "ASYNCRL_TERMINATION_LOG"
"""Overrides the file (local runs and tests); Kubernetes' default is /dev/termination-log."""
DEFAULT_PATH = "/dev/termination-log"
MAX_BYTES = 4096


def path() -> str | None:
    """The file to write: PATH_ENV, else /dev/termination-log when it exists (the kubelet mounts it into
    every container); None outside a container, so a local run never creates a file under /dev."""
    if os.environ.get(PATH_ENV):
        return os.environ[PATH_ENV]
    return DEFAULT_PATH if os.path.exists(DEFAULT_PATH) else None


def write(line: str) -> None:
    """Replace the termination message with ``line`` (cut to 4096 bytes of UTF-8, newline included)."""
    data = (line.rstrip("\n") + "\n").encode("utf-8", "replace")
    if len(data) > MAX_BYTES:
        data = data[: MAX_BYTES - 1].decode("utf-8", "ignore").encode() + b"\n"
    target = path()
    if target is None:
        return
    with contextlib.suppress(Exception), open(target, "wb") as handle:
        handle.write(data)
