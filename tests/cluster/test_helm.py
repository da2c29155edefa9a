"""`helm install/upgrade/uninstall` of charts/asyncrl-operator against the real test control plane.

One release (`asyncrl` in `asyncrl-system`) is installed for the module with every optional object on;
prometheus-operator's real CRDs (ServiceMonitor, PodMonitor, PrometheusRule from the
prometheus-operator Go module, fetched through the Go module proxy) are installed first so the
apiserver validates those objects against their real schemas. The tests run in file order: install,
upgrade with a changed CRD, a namespaced install beside it, and last uninstall (which must keep the CRD
and the users' jobs).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import tempfile
from typing import Any

import pytest
import yaml
from asyncrl_testing import cluster_wait, jobs

pytestmark = pytest.mark.cluster

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "asyncrl-operator"
RELEASE, RELEASE_NS = "asyncrl", "asyncrl-system"
CRD = "asyncrljobs.asyncrl.dev"
ALL_ON = [
    "metrics.serviceMonitor.enabled=true",
    "metrics.podMonitor.enabled=true",
    "prometheusRule.enabled=true",
]
PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
MONITORING_CRDS = ("servicemonitors", "podmonitors", "prometheusrules")


def get(kubectl: Any, *args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def exists(kubectl: Any, *args: str) -> bool:
    return kubectl("get", *args, "--ignore-not-found", "-o", "name", check=False).stdout.strip() != ""


def monitoring_crd_files() -> list[pathlib.Path]:
    """prometheus-operator's CRDs from its Go module (cached by `go mod download`)."""
    go = shutil.which("go")
    if go is None:
        pytest.fail("go is needed to fetch prometheus-operator's CRDs through the Go module proxy")
    done = subprocess.run(
        [go, "mod", "download", "-json", PROMETHEUS_OPERATOR],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tempfile.gettempdir(),
    )
    if done.returncode != 0:
        pytest.fail(f"go mod download {PROMETHEUS_OPERATOR} failed: {done.stderr or done.stdout}")
    folder = pathlib.Path(json.loads(done.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
    return [folder / f"monitoring.coreos.com_{plural}.yaml" for plural in MONITORING_CRDS]


def adopt_crd(kubectl: Any, release: str, namespace: str) -> None:
    """Let the release take over a CRD applied earlier without helm (other tests apply crds/ directly):
    helm adopts an existing object that carries its ownership label and annotations."""
    if not exists(kubectl, "crd", CRD):
        return
    kubectl("label", "crd", CRD, "--overwrite", "app.kubernetes.io/managed-by=Helm")
    kubectl(
        "annotate",
        "crd",
        CRD,
        "--overwrite",
        f"meta.helm.sh/release-name={release}",
        f"meta.helm.sh/release-namespace={namespace}",
    )


def install(helm: Any, kubectl: Any, chart: pathlib.Path = CHART, *sets: str) -> None:
    adopt_crd(kubectl, RELEASE, RELEASE_NS)
    args = [
        "upgrade",
        "--install",
        RELEASE,
        str(chart),
        "-n",
        RELEASE_NS,
        "--create-namespace",
        "--wait",
        "--timeout",
        "120s",
    ]
    for item in (*ALL_ON, *sets):
        args += ["--set", item]
    helm(*args, timeout=180)


def manifest_objects(helm: Any) -> list[tuple[str, str, str | None]]:
    """(kind, name, namespace) of every object helm says the release owns."""
    text = helm("get", "manifest", RELEASE, "-n", RELEASE_NS).stdout
    docs = [d for d in yaml.safe_load_all(text) if d]
    return [(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in docs]


@pytest.fixture(scope="module")
def release(cluster: Any, helm: Any, kubectl: Any) -> str:
    for path in monitoring_crd_files():
        kubectl("apply", "--server-side", "-f", str(path), timeout=120)
    for plural in MONITORING_CRDS:
        kubectl("wait", "--for=condition=Established", f"crd/{plural}.monitoring.coreos.com", "--timeout=60s")
    install(helm, kubectl)
    return RELEASE


def test_install_creates_every_object(release: str, helm: Any, kubectl: Any) -> None:
    objects = manifest_objects(helm)
    kinds = {kind for kind, _, _ in objects}
    assert kinds == {
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "Deployment",
        "NetworkPolicy",
        "ConfigMap",
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
    }
    for kind, name, namespace in objects:
        assert exists(kubectl, kind.lower(), name, *(["-n", namespace] if namespace else [])), (kind, name)
    crd = get(kubectl, "crd", CRD)
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established["Established"] == "True" and established["NamesAccepted"] == "True"
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    deploy = get(kubectl, "deployment", "-n", RELEASE_NS, "asyncrl-asyncrl-operator")
    assert deploy["status"].get("availableReplicas") == 1  # kwok runs the pod; --wait saw it ready
    dashboards = get(kubectl, "configmaps", "-n", RELEASE_NS, "-l", "grafana_dashboard=1")["items"]
    assert sorted(k for cm in dashboards for k in cm["data"]) == ["asyncrl-fleet.json", "asyncrl-job.json"]


def test_installed_crd_schema_is_the_generated_one(release: str, kubectl: Any) -> None:
    """What the apiserver stores equals crds/ as Python reads it (catches YAML-1.1 keys such as `n`)."""
    stored = get(kubectl, "crd", CRD)["spec"]["versions"]
    generated = yaml.safe_load((REPO / "crds" / f"asyncrl.dev_{CRD.split('.')[0]}.yaml").read_text())
    for version, want in zip(stored, generated["spec"]["versions"], strict=True):
        assert version["schema"] == json.loads(json.dumps(want["schema"])), (
            f"{version['name']} schema differs"
        )


def test_upgrade_with_a_changed_crd_updates_it(
    release: str, helm: Any, kubectl: Any, tmp_path: pathlib.Path
) -> None:
    chart = tmp_path / "asyncrl-operator"
    shutil.copytree(CHART, chart)
    crd_file = chart / "files" / "crds" / "asyncrl.dev_asyncrljobs.yaml"
    body = yaml.safe_load(crd_file.read_text())
    version = body["spec"]["versions"][0]
    version.setdefault("additionalPrinterColumns", []).append(
        {"name": "Upgraded", "type": "string", "jsonPath": ".metadata.annotations.upgraded"}
    )
    crd_file.write_text(yaml.safe_dump(body, sort_keys=False))
    before = get(kubectl, "deployment", "-n", RELEASE_NS, "asyncrl-asyncrl-operator")
    try:
        install(helm, kubectl, chart)
        columns = get(kubectl, "crd", CRD)["spec"]["versions"][0]["additionalPrinterColumns"]
        assert "Upgraded" in [c["name"] for c in columns]
        after = get(kubectl, "deployment", "-n", RELEASE_NS, "asyncrl-asyncrl-operator")
        checksum = "checksum/crd"
        assert (
            after["spec"]["template"]["metadata"]["annotations"][checksum]
            != before["spec"]["template"]["metadata"]["annotations"][checksum]
        ), "operator not restarted"
    finally:
        install(helm, kubectl)
    columns = get(kubectl, "crd", CRD)["spec"]["versions"][0]["additionalPrinterColumns"]
    assert "Upgraded" not in [c["name"] for c in columns]


def test_namespaced_install_grants_a_role_in_one_namespace(
    release: str, cluster: Any, helm: Any, kubectl: Any, namespace: str
) -> None:
    """...in a namespace that enforces the restricted Pod Security Standard: `--wait` sees the operator
    pod Ready, so the API server admitted it (a privileged pod in the same namespace is refused)."""
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    refused = cluster.privileged_pod_refusal(namespace)
    assert 'violates PodSecurity "restricted:latest"' in refused, refused
    name = "asyncrl-ns"
    helm(
        "install",
        name,
        str(CHART),
        "-n",
        namespace,
        "--wait",
        "--timeout",
        "120s",
        "--set",
        "watch.namespaced=true",
        "--set",
        "crds.install=false",
        "--set",
        "dashboards.enabled=false",
        timeout=180,
    )
    try:
        objects = [d for d in yaml.safe_load_all(helm("get", "manifest", name, "-n", namespace).stdout) if d]
        assert {d["kind"] for d in objects} == {
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "Service",
            "Deployment",
            "NetworkPolicy",
        }
        operator_pods = json.loads(
            kubectl(
                "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=operator", "-o", "json"
            ).stdout
        )["items"]
        assert len(operator_pods) == 1 and operator_pods[0]["status"]["phase"] == "Running"
        sa = f"system:serviceaccount:{namespace}:asyncrl-ns-asyncrl-operator"
        can = kubectl(
            "auth", "can-i", "patch", "asyncrljobs.asyncrl.dev", "-n", namespace, "--as", sa, check=False
        ).stdout.strip()
        assert can == "yes"
        for elsewhere in ("default", RELEASE_NS):
            can = kubectl(
                "auth", "can-i", "list", "asyncrljobs.asyncrl.dev", "-n", elsewhere, "--as", sa, check=False
            ).stdout.strip()
            assert can == "no", f"the namespaced operator may list jobs in {elsewhere}"
        can = kubectl(
            "auth", "can-i", "list", "asyncrljobs.asyncrl.dev", "--all-namespaces", "--as", sa, check=False
        ).stdout.strip()
        assert can == "no"
    finally:
        helm("uninstall", name, "-n", namespace, "--wait", timeout=120)


def test_uninstall_keeps_the_crd_and_the_users_jobs(
    release: str, helm: Any, kubectl: Any, namespace: str
) -> None:
    job = jobs.make_job("keepme", namespace)
    kubectl("apply", "-f", "-", input=json.dumps(job))
    helm("uninstall", RELEASE, "-n", RELEASE_NS, "--wait", timeout=120)
    try:
        assert exists(kubectl, "crd", CRD), "helm uninstall deleted the CRD"
        assert exists(kubectl, "asyncrljob", "keepme", "-n", namespace), "helm uninstall deleted a user's job"
        cluster_wait.wait_until(
            lambda: exists(kubectl, "deployment", "asyncrl-asyncrl-operator", "-n", RELEASE_NS),
            lambda present: not present,
            "the operator Deployment removed",
            timeout=60,
        )
        assert not exists(kubectl, "clusterrole", "asyncrl-asyncrl-operator")
        assert not exists(kubectl, "configmaps", "-n", RELEASE_NS, "-l", "grafana_dashboard=1")
    finally:
        install(helm, kubectl)  # a re-install adopts the kept CRD (same release name)
    assert exists(kubectl, "asyncrljob", "keepme", "-n", namespace)
