"""Where the gang-scheduling parts of the test cluster live: Kueue's manager, CRDs and webhook manifests,
and the PodGroup CRDs of scheduler-plugins and Volcano; also KEDA's CRDs (the other third-party CRDs the
tests apply: docs/autoscaling.md's ScaledObject is checked against them).

Called by ``asyncrl_testing.kueue``, tests/cluster/test_gang*.py and test_helm_rbac.py (``kubectl auth
can-i`` resolves podgroups.<group> only while the CRD is served). The layout and version keys match
tools/build-cluster-bins.sh (components ``kueue``, ``gangcrds`` and ``kedacrds``), under the same cache as
``cluster_bins``; each is built only on a miss. A missing one raises ``cluster_bins.MissingBinaries``
naming the build command, as the control plane's binaries do.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from asyncrl_testing import cluster_bins, cluster_wait

KUEUE_VERSION = os.environ.get("KUEUE_VERSION", "v0.17.0")
SCHED_PLUGINS_VERSION = os.environ.get("SCHED_PLUGINS_VERSION", "v0.34.1-devel")
VOLCANO_APIS_VERSION = os.environ.get("VOLCANO_APIS_VERSION", "v1.14.0")
KEDA_VERSION = os.environ.get("KEDA_VERSION", "v2.21.0")

COSCHEDULING_CRD = "scheduling.x-k8s.io_podgroups.yaml"
VOLCANO_CRD = "scheduling.volcano.sh_podgroups.yaml"


def _missing(what: pathlib.Path, component: str) -> cluster_bins.MissingBinaries:
    return cluster_bins.MissingBinaries(
        f"{what} is missing. Build it with: {cluster_bins.BUILD_COMMAND} {component}"
    )


def kueue_dir() -> pathlib.Path:
    """``kueue`` (the manager), ``crd/`` (its CRDs) and ``webhook/manifests.yaml``."""
    path = cluster_bins.cache_dir() / f"kueue-{KUEUE_VERSION}"
    for need in (path / "kueue", path / "webhook" / "manifests.yaml", path / "crd"):
        if not need.exists():
            raise _missing(need, "kueue")
    return path


def pod_group_crds() -> dict[str, pathlib.Path]:
    """PodGroup CRD files by API group: scheduler-plugins' (as its module ships it) and Volcano's
    (generated from volcano.sh/apis as Volcano's Makefile does)."""
    path = cluster_bins.cache_dir() / f"gang-crds-{SCHED_PLUGINS_VERSION}-{VOLCANO_APIS_VERSION}"
    out = {"scheduling.x-k8s.io": path / COSCHEDULING_CRD, "scheduling.volcano.sh": path / VOLCANO_CRD}
    for need in out.values():
        if not need.is_file():
            raise _missing(need, "gangcrds")
    return out


def install_pod_group_crds(c: Any) -> None:
    """Apply both PodGroup CRDs (server-side, idempotent) to cluster ``c`` and wait until they are served.
    They stay installed: other modules' tests may rely on them."""
    crds = pod_group_crds()
    for path in crds.values():
        c.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    for group in crds:
        wait_established(c, f"podgroups.{group}")


def wait_established(c: Any, crd: str, timeout: float = 60.0) -> None:
    """Until the CRD is served. Not `kubectl wait --for=condition=Established`: on a CRD applied a moment
    ago, before the apiserver wrote any condition, it fails at once ("<nil> is of the type <nil>"), and so
    does a jsonpath filter on the conditions."""

    def established() -> bool:
        conditions = json.loads(c.kubectl("get", "crd", crd, "-o", "json").stdout)["status"].get("conditions")
        return any(x["type"] == "Established" and x["status"] == "True" for x in conditions or [])

    cluster_wait.wait_until(established, bool, f"CRD {crd} Established", timeout=timeout)


def install_keda_crds(c: Any) -> None:
    """Apply KEDA's CRDs (as github.com/kedacore/keda/v2 ships them) to cluster ``c`` and wait until
    ScaledObjects are served. KEDA's operator and webhook are not run: the objects are checked against
    the CRDs' schemas only."""
    path = cluster_bins.cache_dir() / f"keda-crds-{KEDA_VERSION}"
    if not (path / "keda.sh_scaledobjects.yaml").is_file():
        raise _missing(path / "keda.sh_scaledobjects.yaml", "kedacrds")
    c.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    wait_established(c, "scaledobjects.keda.sh")
