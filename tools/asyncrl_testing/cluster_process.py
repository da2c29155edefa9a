"""One control-plane component as a child process: its own process group, its own log, readiness, teardown.

Called by `cluster` for etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok. The
process handling is the local runner's (`asyncrl_workloads.local.process.Child`): each component runs
in a new session (its whole process group is signalled on stop, never anything found by name) and, on
Linux, asks the kernel to kill it if the thread that started it dies (PR_SET_PDEATHSIG), so a SIGKILLed
test run leaves no orphan behind. This module only names the failures as the cluster's own.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

from asyncrl_workloads.local import process


class ComponentNotReady(process.NotReady):
    """A component exited or did not pass its readiness check; the message carries its log tail."""


class Component(process.Child):
    """A started component process; `stop` kills its process group and is safe to call twice."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: pathlib.Path,
        cwd: pathlib.Path,
        die_with_parent: bool = True,
    ) -> None:
        super().__init__(name, argv, log_path, cwd=cwd, die_with_parent=die_with_parent)

    def fail(self, why: str) -> ComponentNotReady:
        return ComponentNotReady(
            f"{self.name} {why}; last {process.LOG_TAIL_LINES} lines of {self.log_path}:\n"
            f"{process.log_tail(self.log_path)}"
        )
