"""Fixtures for tests against the real control plane (tools/asyncrl_testing/cluster.py).

- `cluster` (asyncrl_testing/cluster_fixture.py, loaded by tests/conftest.py, shared with tests/images):
  one cluster per test session (etcd, apiserver, controller-manager, scheduler, kwok with fake GPU
  nodes). Missing binaries fail the session with the build command; they never skip.
- `kubectl`, `helm`: run the real binaries with the cluster's admin kubeconfig (CompletedProcess back;
  `check=True` raises with stderr on a non-zero exit).
- `namespace`: a fresh namespace per test, deleted afterwards.
- `kube_api`: a factory for typed clients of the `kubernetes` package, e.g.
  `kube_api(kubernetes.client.CoreV1Api)`.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from asyncrl_testing import cluster as cluster_mod
from asyncrl_testing import cluster_wait

T = TypeVar("T")


@pytest.fixture(scope="session")
def kubectl(cluster: cluster_mod.Cluster) -> Callable[..., Any]:
    return cluster.kubectl


@pytest.fixture(scope="session")
def helm(cluster: cluster_mod.Cluster) -> Callable[..., Any]:
    return cluster.helm


@pytest.fixture
def namespace(cluster: cluster_mod.Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new namespace named after the test; its `default` ServiceAccount exists before the test starts."""
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-") or "test"
    name = f"{base}-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", name)
    cluster_wait.wait_until(
        lambda: cluster.api(f"/api/v1/namespaces/{name}/serviceaccounts/default").status,
        lambda status: status == 200,
        f"the default ServiceAccount in {name}",
        timeout=30,
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


@pytest.fixture(scope="session")
def kube_api(cluster: cluster_mod.Cluster) -> Iterator[Callable[[type[T]], T]]:
    from asyncrl_testing import cluster_client

    client = cluster_client.api_client(cluster)

    def make(api_class: type[T]) -> T:
        return api_class(client)  # type: ignore[call-arg]

    yield make
    client.close()
