"""Root conftest: makes the test-support package (tools/asyncrl_testing) importable for every layer.

Layer fixtures live beside their tests: tests/cluster/conftest.py (real control plane),
tests/dataplane/conftest.py (nats-server, Prometheus, tiny model), tests/images/conftest.py (container
engine, built images). The session's test cluster (`cluster`) is shared by tests/cluster and tests/images,
so it is a plugin loaded here: asyncrl_testing/cluster_fixture.py.
"""

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

pytest_plugins = ["asyncrl_testing.cluster_fixture"]
