"""Acceptance tests of the test control plane itself: scheduling onto kwok GPU nodes, RBAC, CRD schema
validation, garbage collection and helm, each against the real binaries; plus the harness's own failure
and teardown paths against a real etcd."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import time
from typing import Any

import kubernetes
import pytest
from asyncrl_testing import cluster as cluster_mod
from asyncrl_testing import cluster_bins, cluster_nodes, cluster_process, cluster_wait

pytestmark = pytest.mark.cluster

CHART = pathlib.Path(__file__).parent / "charts" / "trivial"
IMAGE = "registry.invalid/asyncrl/none:0"  # kwok never pulls images


def get(kubectl: Any, *args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def gpu_pod_spec(gpus: int) -> dict[str, Any]:
    return {
        "containers": [
            {"name": "main", "image": IMAGE, "resources": {"limits": {cluster_nodes.GPU_RESOURCE: str(gpus)}}}
        ]
    }


def condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in pod.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def test_gpu_statefulset_runs_on_kwok_gpu_nodes_and_oversized_pod_is_unschedulable(
    cluster, kubectl, namespace
):
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "gpu-workers", "namespace": namespace},
        "spec": {
            "replicas": 3,
            "serviceName": "gpu-workers",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "gpu-workers"}},
            "template": {"metadata": {"labels": {"app": "gpu-workers"}}, "spec": gpu_pod_spec(1)},
        },
    }
    kubectl("apply", "-f", "-", input=json.dumps(sts))
    pods = cluster_wait.wait_until(
        lambda: get(kubectl, "pods", "-n", namespace, "-l", "app=gpu-workers")["items"],
        lambda items: len(items) == 3 and all(p["status"].get("phase") == "Running" for p in items),
        "3 GPU pods Running",
        timeout=90,
    )
    for pod in pods:
        node = get(kubectl, "node", pod["spec"]["nodeName"])
        assert pod["spec"]["nodeName"] in cluster.gpu_nodes
        assert node["metadata"]["labels"][cluster_nodes.GPU_PRODUCT_LABEL] == cluster_nodes.GPU_PRODUCT
        assert condition(pod, "Ready").get("status") == "True"
    cluster_wait.wait_until(
        lambda: get(kubectl, "statefulset", "gpu-workers", "-n", namespace)["status"],
        lambda status: status.get("readyReplicas") == 3,
        "StatefulSet readyReplicas=3",
    )

    too_big = cluster_nodes.GPUS_PER_NODE + 1
    greedy = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "greedy", "namespace": namespace},
        "spec": gpu_pod_spec(too_big),
    }
    kubectl("apply", "-f", "-", input=json.dumps(greedy))
    pod = cluster_wait.wait_until(
        lambda: get(kubectl, "pod", "greedy", "-n", namespace),
        lambda p: condition(p, "PodScheduled").get("reason") == "Unschedulable",
        "PodScheduled=False/Unschedulable on a 9-GPU pod",
        timeout=60,
    )
    scheduled = condition(pod, "PodScheduled")
    assert scheduled["status"] == "False"
    assert f"Insufficient {cluster_nodes.GPU_RESOURCE}" in scheduled["message"]
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")


def test_python_client_factory_sees_the_gpu_nodes(cluster, kube_api):
    nodes = kube_api(kubernetes.client.CoreV1Api).list_node(label_selector="type=kwok").items
    assert sorted(node.metadata.name for node in nodes) == sorted(cluster.gpu_nodes)
    for node in nodes:
        assert node.status.allocatable[cluster_nodes.GPU_RESOURCE] == str(cluster_nodes.GPUS_PER_NODE)
        assert node.metadata.labels[cluster_nodes.GPU_PRODUCT_LABEL] == cluster_nodes.GPU_PRODUCT


def test_rbac_denies_a_service_account_without_rights(cluster, kubectl, namespace):
    kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    kubectl("create", "role", "read-configmaps", "--verb=list", "--resource=configmaps", "-n", namespace)
    kubectl(
        "create",
        "rolebinding",
        "nobody-reads-configmaps",
        "--role=read-configmaps",
        f"--serviceaccount={namespace}:nobody",
        "-n",
        namespace,
    )
    user = f"system:serviceaccount:{namespace}:nobody"

    denied = kubectl("auth", "can-i", "list", "pods", "-n", namespace, f"--as={user}", check=False)
    assert (denied.returncode, denied.stdout.strip()) == (1, "no")
    allowed = cluster_wait.wait_until(
        lambda: kubectl("auth", "can-i", "list", "configmaps", "-n", namespace, f"--as={user}", check=False),
        lambda done: done.returncode == 0,
        "the RoleBinding to take effect",
        timeout=30,
    )
    assert allowed.stdout.strip() == "yes"

    token = kubectl("create", "token", "nobody", "-n", namespace, "--duration=10m").stdout.strip()
    forbidden = cluster.api(f"/api/v1/namespaces/{namespace}/pods", token=token)
    assert forbidden.status == 403
    body = forbidden.json()
    assert body["reason"] == "Forbidden" and f'User "{user}"' in body["message"]
    # The same token is authenticated and allowed where the Role grants: the 403 above is RBAC, not authn.
    assert cluster.api(f"/api/v1/namespaces/{namespace}/configmaps", token=token).status == 200
    assert cluster.api(f"/api/v1/namespaces/{namespace}/pods", token="not-a-token").status == 401


WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.foundation.asyncrl.test"},
    "spec": {
        "group": "foundation.asyncrl.test",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["replicas"],
                                "properties": {
                                    "replicas": {"type": "integer", "minimum": 1, "maximum": 8},
                                    "mode": {"type": "string", "enum": ["sync", "async"]},
                                },
                            }
                        },
                    }
                },
            }
        ],
    },
}


def widget(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "foundation.asyncrl.test/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def test_crd_schema_rejects_a_violating_object(cluster, kubectl, namespace):
    kubectl("apply", "-f", "-", input=json.dumps(WIDGET_CRD))
    try:
        kubectl("wait", "--for=condition=Established", "crd/widgets.foundation.asyncrl.test", "--timeout=60s")
        good = widget("good", namespace, {"replicas": 2, "mode": "async"})
        kubectl("apply", "-f", "-", input=json.dumps(good))
        assert get(kubectl, "widget", "good", "-n", namespace)["spec"]["replicas"] == 2

        bad = widget("bad", namespace, {"replicas": 0, "mode": "sometimes"})
        rejected = kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
        assert rejected.returncode != 0
        assert "spec.replicas" in rejected.stderr and "spec.mode" in rejected.stderr
        # The raw API answers 422 Invalid with one cause per violated field, and stores nothing.
        raw = cluster.api(f"/apis/foundation.asyncrl.test/v1/namespaces/{namespace}/widgets", "POST", bad)
        assert raw.status == 422 and raw.json()["reason"] == "Invalid", raw.body
        causes = {cause["field"]: cause["reason"] for cause in raw.json()["details"]["causes"]}
        assert causes == {"spec.replicas": "FieldValueInvalid", "spec.mode": "FieldValueNotSupported"}
        missing = kubectl("get", "widget", "bad", "-n", namespace, check=False)
        assert missing.returncode != 0 and "NotFound" in missing.stderr
    finally:
        kubectl("delete", "crd", "widgets.foundation.asyncrl.test", "--wait=false", "--ignore-not-found")


def test_garbage_collector_removes_an_owned_configmap(kubectl, namespace):
    kubectl("create", "configmap", "owner", "-n", namespace)
    kubectl("create", "configmap", "bystander", "-n", namespace)
    owner_uid = get(kubectl, "configmap", "owner", "-n", namespace)["metadata"]["uid"]
    owned = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "owned",
            "namespace": namespace,
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}],
        },
    }
    kubectl("apply", "-f", "-", input=json.dumps(owned))
    time.sleep(2)  # give a wrongly eager collector a chance to show itself
    refs = get(kubectl, "configmap", "owned", "-n", namespace)["metadata"]["ownerReferences"]
    assert [ref["uid"] for ref in refs] == [owner_uid]

    kubectl("delete", "configmap", "owner", "-n", namespace)  # background cascading deletion
    cluster_wait.wait_until(
        lambda: kubectl("get", "configmap", "owned", "-n", namespace, check=False),
        lambda done: done.returncode != 0 and "NotFound" in done.stderr,
        "the owned ConfigMap to be collected",
    )
    assert get(kubectl, "configmap", "bystander", "-n", namespace)["metadata"]["name"] == "bystander"


def test_helm_installs_and_uninstalls_a_chart(helm, kubectl, namespace):
    helm(
        "install",
        "smoke",
        str(CHART),
        "-n",
        namespace,
        "--set",
        "greeting=hi-from-test",
        "--wait",
        "--timeout",
        "60s",
    )
    installed = get(kubectl, "configmap", "smoke-trivial", "-n", namespace)
    assert installed["data"] == {"greeting": "hi-from-test"}
    releases = json.loads(helm("list", "-n", namespace, "-o", "json").stdout)
    assert [(r["name"], r["status"]) for r in releases] == [("smoke", "deployed")]

    helm("uninstall", "smoke", "-n", namespace, "--wait", "--timeout", "60s")
    gone = kubectl("get", "configmap", "smoke-trivial", "-n", namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    assert json.loads(helm("list", "-n", namespace, "-o", "json").stdout) == []


def _etcd_argv(data_dir: pathlib.Path, client_port: int) -> list[str]:
    peer = f"http://127.0.0.1:{cluster_mod.free_port()}"
    client = f"http://127.0.0.1:{client_port}"
    return [
        str(cluster_bins.expected_paths()["etcd"][0]),
        "--name=t",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=t={peer}",
    ]


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for its reaper counts as dead)."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_component_that_cannot_start_is_named_with_its_log_tail(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = _etcd_argv(tmp_path / "etcd", port)
        etcd = cluster_process.Component("etcd", argv, tmp_path / "etcd.log", tmp_path)
        try:
            with pytest.raises(cluster_process.ComponentNotReady) as failure:
                etcd.wait_ready(lambda: False, timeout=30)
        finally:
            etcd.stop()
    message = str(failure.value)
    assert message.startswith("etcd exited with code")
    assert "address already in use" in message


def test_components_die_with_the_process_that_started_them(tmp_path):
    """A SIGKILLed harness (no teardown runs) still leaves no orphan: PR_SET_PDEATHSIG."""
    port = cluster_mod.free_port()
    script = textwrap.dedent(f"""
        import pathlib, sys, time
        from asyncrl_testing import cluster_http, cluster_process
        work = pathlib.Path({str(tmp_path)!r})
        argv = {_etcd_argv(tmp_path / "etcd", port)!r}
        c = cluster_process.Component("etcd", argv, work / "etcd.log", work)
        c.wait_ready(lambda: cluster_http.request("http://127.0.0.1:{port}/health").status == 200, 30)
        print(c.pgid, flush=True)
        time.sleep(300)
    """)
    tools = str(pathlib.Path(__file__).resolve().parents[2] / "tools")
    harness = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": tools, "PATH": "/usr/bin:/bin"},
    )
    try:
        etcd_pid = int(harness.stdout.readline())
    finally:
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        harness.stdout.close()
    assert etcd_pid != harness.pid
    try:
        cluster_wait.wait_until(
            lambda: alive(etcd_pid),
            lambda running: not running,
            f"etcd (pid {etcd_pid}) to die with its parent",
            timeout=10,
            interval=0.1,
        )
    finally:
        if alive(etcd_pid):  # the test failed: don't leave the orphan behind
            os.killpg(etcd_pid, signal.SIGKILL)
