"""The Python `kubernetes` client bound to a test cluster's admin kubeconfig.

Called by tests/cluster/conftest.py (the `kube_api` fixture) for tests that prefer typed API objects
over kubectl. Kept apart from `cluster` so the harness itself needs only the standard library.
"""

from __future__ import annotations

from typing import Any

import kubernetes

from asyncrl_testing import cluster


def api_client(c: cluster.Cluster) -> Any:
    """A `kubernetes.client.ApiClient` for the admin user of `c` (close it when done)."""
    return kubernetes.config.new_client_from_config(config_file=str(c.kubeconfig))  # type: ignore[no-untyped-call]
