"""The operator's Helm chart rendered by the real helm binary, without a cluster.

Called by tests/unit/test_chart.py (lint, goldens, schema), test_review.py (kube-score on the rendered
chart) and test_chart_alerts.py (promtool on its PrometheusRule): one place for the binary, its
scratch homes and the release the goldens were made with.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
from typing import Any

import pytest
import yaml

from asyncrl_testing import cluster_bins

CHART = pathlib.Path(__file__).resolve().parents[2] / "charts" / "asyncrl-operator"
RELEASE, NAMESPACE, KUBE_VERSION = "asyncrl", "asyncrl-system", "1.37.2"


def helm_binary() -> pathlib.Path:
    path = cluster_bins.cache_dir() / f"helm-{cluster_bins.HELM_VERSION}" / "helm"
    if not os.access(path, os.X_OK):
        pytest.fail(f"helm not found at {path}: build it with {cluster_bins.BUILD_COMMAND} helm")
    return path


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm with its cache/config/data homes under /tmp (never the user's)."""
    env = dict(
        os.environ,
        HELM_CACHE_HOME="/tmp/asyncrl-helm/cache",
        HELM_CONFIG_HOME="/tmp/asyncrl-helm/config",
        HELM_DATA_HOME="/tmp/asyncrl-helm/data",
    )
    done = subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, env=env, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{done.stderr}{done.stdout[-2000:]}")
    return done


def template_text(sets: list[str]) -> str:
    """`helm template` of the chart as RELEASE in NAMESPACE, with `--set` for each of ``sets``."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
    for item in sets:
        args += ["--set", item]
    return helm(*args).stdout


def render(sets: list[str]) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(template_text(sets)) if doc]
