"""Root conftest: makes the test-support package (tools/asyncrl_testing) importable for every layer.

Layer fixtures live beside their tests: tests/cluster/conftest.py (real control plane),
tests/dataplane/conftest.py (nats-server, Prometheus, tiny model).
"""

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
