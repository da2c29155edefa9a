"""Test support that is not product code: the real control plane, Prometheus."""
