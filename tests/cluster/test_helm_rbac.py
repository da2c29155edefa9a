"""The chart's RBAC is sufficient and minimal, proven on the real apiserver.

Sufficient: the operator (the `asyncrl-operator` console script, as a local process) runs with a
TokenRequest token of the chart's ServiceAccount -- no other credentials -- and reconciles
examples/job.yaml end to end: every child applied, status written, pods scheduled onto kwok GPU nodes,
and a failed rollout pod replaced (the `pods: delete` path); and examples/gateway-cpu.yaml: the gateway's
Service and NetworkPolicy applied, the admin key only a secretKeyRef, both deleted again when agent.loop
changes (the `get`/`delete` path). Its log shows no Forbidden.
Minimal: `kubectl auth can-i --as=system:serviceaccount:...` is yes for each verb of the rendered
ClusterRole and no for listing/watching Secrets, pods/exec, cluster-admin and other things the operator
never does (it only `get`s the Secrets a job names, to check their keys exist).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import secrets
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from asyncrl_testing import cluster_wait, gang_bins, jobs

pytestmark = pytest.mark.cluster

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "asyncrl-operator"
RELEASE, RELEASE_NS = "arl-rbac", "arl-rbac-system"
SA = f"{RELEASE}-asyncrl-operator"
SUBJECT = f"system:serviceaccount:{RELEASE_NS}:{SA}"
CRD = "asyncrljobs.asyncrl.dev"
JOB = "math"
CHILD_KINDS = "configmap,service,serviceaccount,role,rolebinding,networkpolicy,statefulset,pod"


def get(kubectl: Any, *args: str) -> Any:
    """`kubectl get -o json` parsed; {} when --ignore-not-found found nothing."""
    text = kubectl("get", *args, "-o", "json").stdout
    return json.loads(text) if text.strip() else {}


def can_i(kubectl: Any, verb: str, resource: str, *scope: str) -> str:
    """`kubectl auth can-i` as the chart's ServiceAccount. "pods/exec" means the subresource (kubectl
    would read TYPE/NAME, i.e. a pod named exec, so it is passed as --subresource)."""
    kind, _, sub = resource.partition("/")
    extra = [f"--subresource={sub}"] if sub else []
    done = kubectl("auth", "can-i", verb, kind, *extra, "--as", SUBJECT, *scope, check=False)
    return str(done.stdout.strip())


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def rbac_release(cluster: Any, helm: Any, kubectl: Any) -> Iterator[dict[str, Any]]:
    """A release without the CRD (the CRD is cluster-wide: another release or crds/ provides it)."""
    if not kubectl("get", "crd", CRD, "--ignore-not-found", "-o", "name").stdout.strip():
        kubectl("apply", "--server-side", "-f", str(REPO / "crds" / "asyncrl.dev_asyncrljobs.yaml"))
        kubectl("wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=60s")
    helm(
        "upgrade",
        "--install",
        RELEASE,
        str(CHART),
        "-n",
        RELEASE_NS,
        "--create-namespace",
        "--wait",
        "--set",
        "crds.install=false",
        "--set",
        "dashboards.enabled=false",
        timeout=180,
    )
    manifest = [d for d in yaml.safe_load_all(helm("get", "manifest", RELEASE, "-n", RELEASE_NS).stdout) if d]
    (role,) = [d for d in manifest if d["kind"] == "ClusterRole"]
    yield role
    helm("uninstall", RELEASE, "-n", RELEASE_NS, "--wait", check=False, timeout=120)


def token_kubeconfig(
    cluster: Any, kubectl: Any, sa: str, sa_namespace: str, path: pathlib.Path
) -> pathlib.Path:
    """A kubeconfig holding only a TokenRequest token of the chart's ServiceAccount."""
    token = kubectl("create", "token", sa, "-n", sa_namespace, "--duration=1h").stdout.strip()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "operator",
        "clusters": [
            {
                "name": "test",
                "cluster": {"server": cluster.server, "certificate-authority": str(cluster.pki.ca_cert)},
            }
        ],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "test", "user": "operator"}}],
    }
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def operator_as(
    cluster: Any, kubectl: Any, sa: str, sa_namespace: str, workdir: pathlib.Path, *extra: str
) -> Iterator[pathlib.Path]:
    """The `asyncrl-operator` process authenticated only as `sa` (no other credential); yields its log."""
    kubeconfig = token_kubeconfig(cluster, kubectl, sa, sa_namespace, workdir / "sa.kubeconfig")
    whoami = subprocess.run(
        [str(cluster.bins.kubectl), "--kubeconfig", str(kubeconfig), "auth", "whoami", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    user = json.loads(whoami.stdout)["status"]["userInfo"]["username"]
    assert user == f"system:serviceaccount:{sa_namespace}:{sa}", whoami.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(KUBECONFIG=str(kubeconfig), HOME=str(workdir))
    script = pathlib.Path(sys.executable).with_name("asyncrl-operator")
    log = workdir / "operator.log"
    live = free_port()
    argv = [str(script), "--metrics-port", str(free_port()), "--liveness-port", str(live)]
    argv += ["--resync-seconds", "3", *extra]
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=workdir, start_new_session=True
        )
    try:
        cluster_wait.wait_until(
            lambda: proc.poll() is None and healthy(live), bool, "the operator live", timeout=60
        )
        yield log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def forbidden_lines(log: pathlib.Path) -> list[str]:
    """Log lines where the apiserver's authorizer refused the operator ("... is forbidden: User
    "system:serviceaccount:..." cannot <verb> resource ..."). Other 403s, such as writes into a namespace
    that another test is deleting, are not RBAC and are not counted."""
    refused = re.compile(r'forbidden: User \\?"system:serviceaccount:[^"\\]+\\?" cannot ')
    return [line for line in log.read_text().splitlines() if refused.search(line)]


@pytest.fixture
def operator_as_sa(
    cluster: Any, kubectl: Any, rbac_release: dict[str, Any], tmp_path: pathlib.Path
) -> Iterator[pathlib.Path]:
    with operator_as(cluster, kubectl, SA, RELEASE_NS, tmp_path) as log:
        yield log


def storage_for_example(kubectl: Any, namespace: str) -> None:
    """The ReadWriteMany claim examples/job.yaml mounts, bound to a static PV so its pods schedule."""
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"rl-storage-{namespace}"},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Delete",
            "hostPath": {"path": f"/tmp/{namespace}"},
            "claimRef": {"namespace": namespace, "name": "rl-storage"},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "rl-storage", "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": pv["metadata"]["name"],
            "resources": {"requests": {"storage": "10Gi"}},
        },
    }
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [pv, pvc]}))


def job_status(kubectl: Any, namespace: str) -> dict[str, Any]:
    status: dict[str, Any] = get(kubectl, "asyncrljob", JOB, "-n", namespace).get("status") or {}
    return status


def test_operator_with_the_chart_token_reconciles_the_example_job(
    kubectl: Any, namespace: str, operator_as_sa: pathlib.Path
) -> None:
    storage_for_example(kubectl, namespace)
    kubectl("apply", "-n", namespace, "-f", str(REPO / "examples" / "job.yaml"))  # as a user would
    children = [
        ("configmap", f"{JOB}-config"),
        ("serviceaccount", f"{JOB}-trainer"),
        ("role", f"{JOB}-trainer"),
        ("rolebinding", f"{JOB}-trainer"),
        ("networkpolicy", f"{JOB}-net"),
        ("networkpolicy", f"{JOB}-trainer-egress"),
        ("poddisruptionbudget", f"{JOB}-trainer"),
        ("poddisruptionbudget", f"{JOB}-rollout"),
        ("service", f"{JOB}-trainer"),
        ("service", f"{JOB}-rollout"),
        ("statefulset", f"{JOB}-trainer"),
        ("statefulset", f"{JOB}-rollout"),
        ("statefulset", f"{JOB}-nats"),
    ]
    cluster_wait.wait_until(
        lambda: [
            c
            for c in children
            if not kubectl("get", *c, "-n", namespace, "--ignore-not-found", "-o", "name").stdout.strip()
        ],
        lambda missing: not missing,
        "every child of the example job",
        timeout=90,
    )
    generation = get(kubectl, "asyncrljob", JOB, "-n", namespace)["metadata"]["generation"]
    status = cluster_wait.wait_until(
        lambda: job_status(kubectl, namespace),
        lambda st: st.get("phase") == "Running" and st.get("observedGeneration") == generation,
        "the example job Running (pods scheduled on kwok GPU nodes)",
        timeout=120,
    )
    # Running needs one ready rollout, not all: kwok readies the second pod a moment later, so wait for both.
    status = cluster_wait.wait_until(
        lambda: job_status(kubectl, namespace),
        lambda st: (
            st.get("rollout", {}).get("readyReplicas") == 2
            and st.get("trainer", {}).get("readyReplicas") == 1
        ),
        "both rollout replicas and the trainer ready",
        timeout=60,
    )
    assert status["phase"] == "Running"

    # A failed rollout pod is replaced by the operator (pods: list + delete) and counted in status.
    pod = get(kubectl, "pod", f"{JOB}-rollout-0", "-n", namespace)
    kubectl(
        "patch",
        "pod",
        f"{JOB}-rollout-0",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Failed", "reason": "Test"}}),
    )
    cluster_wait.wait_until(
        lambda: get(kubectl, "pod", f"{JOB}-rollout-0", "-n", namespace, "--ignore-not-found").get(
            "metadata", {}
        ),
        lambda meta: meta.get("uid") not in (None, pod["metadata"]["uid"]),
        "the failed rollout pod replaced",
        timeout=60,
    )
    cluster_wait.wait_until(
        lambda: job_status(kubectl, namespace).get("restarts", {}).get("rollout", 0),
        lambda n: n >= 1,
        "status.restarts.rollout counted",
        timeout=30,
    )
    assert not forbidden_lines(operator_as_sa), "\n".join(forbidden_lines(operator_as_sa))


def test_operator_with_the_chart_token_renders_a_gateway_job_and_prunes_it_after_a_loop_change(
    kubectl: Any, namespace: str, operator_as_sa: pathlib.Path
) -> None:
    job, admin = "gw", "gw-gateway-admin"  # examples/gateway-cpu.yaml
    key = secrets.token_hex(24)
    kubectl("create", "secret", "generic", admin, "-n", namespace, f"--from-literal=apiKey={key}")
    kubectl("apply", "-n", namespace, "-f", str(REPO / "examples" / "gateway-cpu.yaml"))
    service, policy, rollout = cluster_wait.wait_until(
        lambda: [
            get(kubectl, kind, name, "-n", namespace, "--ignore-not-found")
            for kind, name in [
                ("service", "gw-gateway"),
                ("networkpolicy", "gw-gateway"),
                ("sts", "gw-rollout"),
            ]
        ],
        all,
        "the gateway job's Service, NetworkPolicy and rollout StatefulSet",
        timeout=60,
    )
    selector = {"asyncrl.dev/job": job, "asyncrl.dev/role": "rollout"}
    assert service["spec"]["type"] == "ClusterIP" and service["spec"]["selector"] == selector
    assert service["spec"]["ports"] == [
        {"name": "gateway", "port": 8100, "targetPort": 8100, "protocol": "TCP"}
    ]
    assert policy["spec"]["podSelector"] == {"matchLabels": selector}
    assert policy["spec"]["ingress"] == [
        {"from": [{"podSelector": {}}], "ports": [{"port": 8100, "protocol": "TCP"}]}
    ]
    (container,) = rollout["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["ASYNCRL_GATEWAY_ADMIN_KEY"]["valueFrom"] == {"secretKeyRef": {"name": admin, "key": "apiKey"}}
    assert env["ASYNCRL_GATEWAY_URL"]["value"] == "http://$(POD_NAME).gw-rollout.$(POD_NAMESPACE).svc:8100"
    owned = kubectl("get", CHILD_KINDS, "-n", namespace, "-l", f"asyncrl.dev/job={job}", "-o", "json").stdout
    assert len(json.loads(owned)["items"]) >= 10 and key not in owned  # the key is in the Secret only

    # its agent worker (spec.agent.workers) as a Deployment, with the key only as a secretKeyRef
    agents = cluster_wait.wait_until(
        lambda: get(kubectl, "deployment", "gw-agent", "-n", namespace, "--ignore-not-found"),
        bool,
        "the agent workers' Deployment",
        timeout=60,
    )
    agent_env = {e["name"]: e for e in agents["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert agent_env["ASYNCRL_GATEWAY_ADMIN_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": admin, "key": "apiKey"}
    }

    # agent.loop gateway -> tool: the operator deletes the gateway's Service and NetworkPolicy and the
    # agents' Deployment, budget and policy.
    tool_loop = {
        "loop": "tool", "gateway": None, "workers": None, "tools": ["asyncrl_workloads.tasks.lookup:lookup"]
    }  # fmt: skip
    kubectl(
        "patch",
        "asyncrljob",
        job,
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"agent": tool_loop}}),
    )
    cluster_wait.wait_deleted(
        kubectl,
        "service,networkpolicy",
        "gw-gateway",
        namespace,
        "the gateway's Service and NetworkPolicy deleted",
    )
    cluster_wait.wait_deleted(
        kubectl,
        "deployment,pdb,networkpolicy",
        "gw-agent",
        namespace,
        "the agents' Deployment, budget, policy deleted",
    )
    headless = get(kubectl, "service", "gw-rollout", "-n", namespace)
    assert [p["name"] for p in headless["spec"]["ports"]] == ["metrics"]
    assert not forbidden_lines(operator_as_sa), "\n".join(forbidden_lines(operator_as_sa))


def rule_checks(role: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                base, _, sub = resource.partition("/")
                name = f"{base}.{group}" if group else base
                out += [(verb, f"{name}/{sub}" if sub else name) for verb in rule["verbs"]]
    return out


def test_can_i_yes_for_every_verb_the_operator_uses(
    cluster: Any, kubectl: Any, rbac_release: dict[str, Any], namespace: str
) -> None:
    gang_bins.install_pod_group_crds(cluster)  # can-i resolves podgroups.<group> only while it is served
    checks = rule_checks(rbac_release)
    assert len(checks) >= 20
    denied = [(verb, res) for verb, res in checks if can_i(kubectl, verb, res, "-n", namespace) != "yes"]
    assert not denied, f"{SUBJECT} lacks {denied}"
    assert can_i(kubectl, "watch", f"{CRD}", "--all-namespaces") == "yes"


@pytest.mark.parametrize(
    ("verb", "resource", "scope"),
    [
        ("list", "secrets", "--all-namespaces"),
        ("list", "secrets", "-n default"),
        ("watch", "secrets", "-n kube-system"),
        ("create", "pods/exec", "-n default"),
        ("create", "pods/attach", "-n default"),
        ("create", "pods/portforward", "-n default"),
        ("create", "pods", "-n default"),
        ("*", "*", "--all-namespaces"),
        ("create", "clusterroles", ""),
        ("create", "clusterrolebindings", ""),
        ("escalate", "roles", "-n default"),
        ("bind", "roles", "-n default"),
        ("impersonate", "serviceaccounts", "-n default"),
        ("delete", "nodes", ""),
        ("create", "customresourcedefinitions", ""),
        ("delete", "namespaces", ""),
        ("deletecollection", "deployments.apps", "-n default"),
        ("delete", "configmaps", "-n default"),
        ("delete", "statefulsets.apps", "-n default"),
        ("deletecollection", "pods", "-n default"),
        ("create", "serviceaccounts/token", "-n default"),
        ("update", "asyncrljobs.asyncrl.dev", "-n default"),
    ],
)
def test_can_i_no_for_what_the_operator_never_does(
    kubectl: Any, rbac_release: dict[str, Any], verb: str, resource: str, scope: str
) -> None:
    assert can_i(kubectl, verb, resource, *scope.split()) == "no", f"{SUBJECT} may {verb} {resource} {scope}"


def test_namespaced_install_operates_its_namespace_with_a_role_only(
    cluster: Any,
    helm: Any,
    kubectl: Any,
    rbac_release: dict[str, Any],
    namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    """watch.namespaced=true: the operator, holding only the chart's Role, reconciles a job there."""
    release = "arl-team"
    helm(
        "install",
        release,
        str(CHART),
        "-n",
        namespace,
        "--wait",
        "--set",
        "watch.namespaced=true",
        "--set",
        "crds.install=false",
        "--set",
        "dashboards.enabled=false",
        timeout=180,
    )
    try:
        sa = f"{release}-asyncrl-operator"
        with operator_as(cluster, kubectl, sa, namespace, tmp_path, "--namespace", namespace) as log:
            kubectl("apply", "-f", "-", input=json.dumps(jobs.make_job("small", namespace)))
            status = cluster_wait.wait_until(
                lambda: get(kubectl, "asyncrljob", "small", "-n", namespace).get("status") or {},
                lambda st: st.get("phase") == "Running",
                "the job Running under the namespaced operator",
                timeout=120,
            )
            assert status["trainer"]["readyReplicas"] == 2
            assert not forbidden_lines(log), "\n".join(forbidden_lines(log))
    finally:
        helm("uninstall", release, "-n", namespace, "--wait", check=False, timeout=120)
