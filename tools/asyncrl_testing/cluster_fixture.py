"""The session's test cluster as a pytest fixture, shared by every layer that needs one (a plugin loaded
by tests/conftest.py): tests/cluster (through its conftest's kubectl, helm, namespace, kube_api) and
tests/images (the operator image against it). One cluster per session, started on first use.

- `cluster`: etcd, apiserver, controller-manager, scheduler, kwok with fake GPU nodes
  (`ASYNCRL_TEST_GPU_NODES`, default 2). Missing binaries fail the session with the build command;
  they never skip. The terminal summary says how long it took to be ready and where its logs are.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from asyncrl_testing import cluster as cluster_mod
from asyncrl_testing import cluster_bins, cluster_process

_READY_KEY = pytest.StashKey[str]()


@pytest.fixture(scope="session")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[cluster_mod.Cluster]:
    gpu_nodes = int(os.environ.get("ASYNCRL_TEST_GPU_NODES", "2"))
    with contextlib.ExitStack() as stack:
        failure = None
        try:
            c = stack.enter_context(cluster_mod.start_cluster(tmp_path_factory.mktemp("cluster"), gpu_nodes))
        except (cluster_process.ComponentNotReady, cluster_bins.MissingBinaries) as exc:
            failure = f"test cluster did not start: {exc}"
        if failure is not None:  # outside the except block: one clear message, no chained traceback
            pytest.fail(failure, pytrace=False)
        steps = ", ".join(f"{name} {secs:.1f}s" for name, secs in c.timings.items())
        pytestconfig.stash[_READY_KEY] = (
            f"test cluster ready in {c.ready_seconds:.1f}s ({steps}); logs in {c.workdir}"
        )
        yield c


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    line = config.stash.get(_READY_KEY, None)
    if line:
        terminalreporter.write_line(line)
