"""The Helm chart charts/asyncrl-operator, rendered by the real helm binary (no cluster).

`helm lint --strict`, golden `helm template` output for the default and the namespaced install
(regenerate with ASYNCRL_UPDATE_GOLDEN=1 after an intended change), the CRD kept in sync with crds/,
values.schema.json rejecting bad values with the field named, and the properties the issue asks of
every install: Recreate with one replica, pod security, least-privilege RBAC, dashboard ConfigMaps.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
from typing import Any

import pytest
import yaml
from asyncrl_testing import chart

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = chart.CHART
GOLDEN = pathlib.Path(__file__).resolve().parent / "golden_chart"
RELEASE, NAMESPACE, KUBE_VERSION = chart.RELEASE, chart.NAMESPACE, chart.KUBE_VERSION
helm, render, template_text = chart.helm, chart.render, chart.template_text
ALL_ON = [
    "metrics.serviceMonitor.enabled=true",
    "metrics.podMonitor.enabled=true",
    "prometheusRule.enabled=true",
]
VARIANTS: dict[str, list[str]] = {
    "default": [],
    "namespaced": ["watch.namespaced=true", "watch.namespace=team-a", *ALL_ON],
}


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


@pytest.mark.parametrize(
    "sets", [[], ALL_ON, VARIANTS["namespaced"]], ids=["default", "all-on", "namespaced"]
)
def test_helm_lint_is_clean(sets: list[str]) -> None:
    args = ["lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION]
    for item in sets:
        args += ["--set", item]
    done = helm(*args)
    assert "0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


def without_crd(text: str) -> str:
    """The rendered chart minus the CRD document and its checksum: the CRD is compared with crds/ by
    the drift tests below, so regenerating the CRD does not churn these golden files."""
    docs = [d for d in text.split("\n---\n") if "# Source: asyncrl-operator/templates/crd.yaml" not in d]
    return re.sub(r"checksum/crd: [0-9a-f]{64}", "checksum/crd: <sha256 of the CRD>", "\n---\n".join(docs))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_template_matches_golden(variant: str) -> None:
    text = without_crd(template_text(VARIANTS[variant]))
    golden = GOLDEN / f"{variant}.yaml"
    if os.environ.get("ASYNCRL_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"{golden} missing: run with ASYNCRL_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), (
        f"helm template differs from {golden}; if intended, ASYNCRL_UPDATE_GOLDEN=1"
    )


def test_chart_crd_is_a_copy_of_the_generated_crd() -> None:
    generated = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    copied = sorted(p.name for p in (CHART / "files" / "crds").glob("*.yaml"))
    assert generated and copied == generated, "run tools/sync-chart-crd"
    for name in generated:
        assert (CHART / "files" / "crds" / name).read_bytes() == (REPO / "crds" / name).read_bytes(), (
            f"charts/asyncrl-operator/files/crds/{name} drifted from crds/{name}: run tools/sync-chart-crd"
        )
    done = subprocess.run([str(REPO / "tools" / "sync-chart-crd"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_rendered_crd_is_the_generated_one_plus_keep() -> None:
    crd = one(render([]), "CustomResourceDefinition")
    generated = yaml.safe_load((REPO / "crds" / "asyncrl.dev_asyncrljobs.yaml").read_text())
    assert crd["spec"] == generated["spec"]
    assert crd["metadata"]["name"] == generated["metadata"]["name"]
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert by_kind(render(["crds.install=false"]), "CustomResourceDefinition") == []
    assert "annotations" not in one(render(["crds.keep=false"]), "CustomResourceDefinition")["metadata"]


def test_operator_runs_one_replica_with_recreate_and_locked_down_pod() -> None:
    deploy = one(render([]), "Deployment")
    spec = deploy["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert container["command"] == ["asyncrl-operator"]
    assert not [a for a in container["args"] if a.startswith("--namespace")], "default install watches all"
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert pod["serviceAccountName"] == one(render([]), "ServiceAccount")["metadata"]["name"]


def test_scheduling_and_image_values_reach_the_pod() -> None:
    pod = one(
        render(
            [
                "operator.nodeSelector.pool=system",
                "operator.tolerations[0].key=dedicated",
                "operator.tolerations[0].operator=Exists",
                "image.registry=reg.example",
                "image.tag=1.2.3",
                "image.pullSecrets[0]=regcred",
            ]
        ),
        "Deployment",
    )["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "system"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert pod["containers"][0]["image"] == "reg.example/asyncrl/asyncrl-operator:1.2.3"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def _rules(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = one(docs, kind)["rules"]
    return rules


def test_rbac_never_lists_secrets_nor_grants_exec_or_wildcards() -> None:
    for docs in (render([]), render(VARIANTS["namespaced"])):
        kind = "Role" if by_kind(docs, "Role") else "ClusterRole"
        for rule in _rules(docs, kind):
            assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
            assert not {"pods/exec", "pods/attach", "pods/portforward"} & set(rule["resources"])
            if "secrets" in rule["resources"]:  # only to check a key a job names exists
                assert rule["resources"] == ["secrets"] and rule["verbs"] == ["get"]
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


def test_namespaced_install_has_a_role_only() -> None:
    docs = render(VARIANTS["namespaced"])
    assert by_kind(docs, "ClusterRole") == [] and by_kind(docs, "ClusterRoleBinding") == []
    role, binding = one(docs, "Role"), one(docs, "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "team-a"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "asyncrl-asyncrl-operator", "namespace": NAMESPACE}
    ]
    nodes = {
        "apiGroups": [""],
        "resources": ["nodes"],
        "verbs": ["list"],
    }  # cluster-scoped: only cluster-wide
    assert _rules(docs, "Role") == [r for r in _rules(render([]), "ClusterRole") if r != nodes]
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args
    assert one(docs, "PodMonitor")["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}


def test_dashboards_ship_as_labelled_configmaps() -> None:
    maps = [cm for cm in by_kind(render([]), "ConfigMap") if "grafana_dashboard" in cm["metadata"]["labels"]]
    shipped = sorted(name for cm in maps for name in cm["data"])
    assert shipped == sorted(p.name for p in (CHART / "dashboards").glob("*.json"))
    for cm in maps:
        (name,) = cm["data"]
        assert cm["data"][name] == (CHART / "dashboards" / name).read_text().rstrip("\n")


def test_monitors_and_rules_are_opt_in() -> None:
    default_kinds = {doc["kind"] for doc in render([])}
    assert not {"ServiceMonitor", "PodMonitor", "PrometheusRule"} & default_kinds
    docs = render(ALL_ON)
    assert one(docs, "ServiceMonitor")["spec"]["endpoints"][0]["honorLabels"] is True
    pm = one(docs, "PodMonitor")
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert pm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/managed-by"] == "asyncrl-operator"
    svc = one(docs, "Service")
    assert svc["spec"]["selector"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("operator.replicas=2", "/operator/replicas"),
        ("watch.namespace=Not_A_Namespace", "/watch/namespace"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        (
            "prometheusRule.thresholds.trainerStalledFor=ten minutes",
            "/prometheusRule/thresholds/trainerStalledFor",
        ),
        ("operator.replcias=1", "replcias"),
    ],
)
def test_schema_rejects_bad_values_naming_the_field(value: str, field: str) -> None:
    args = ["template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, "--set", value]
    done = helm(*args, check=False)
    assert done.returncode != 0, f"--set {value} was accepted"
    assert "values don't meet the specifications of the schema" in done.stderr
    assert field in done.stderr, done.stderr


def test_readme_values_table_is_current() -> None:
    spec = importlib.util.spec_from_file_location("chart_values_table", CHART / "hack" / "values_table.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme = (CHART / "README.md").read_text()
    assert module.readme_with_table(readme) == readme, "run charts/asyncrl-operator/hack/values_table.py"
    documented = {key for key, _ in module.documented_keys((CHART / "values.yaml").read_text())}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for section, body in values.items():
        if isinstance(body, dict) and body:
            assert any(k.startswith(section + ".") for k in documented), f"values.{section} is undocumented"
