"""The real Kueue manager (sigs.k8s.io/kueue, built by tools/build-cluster-bins.sh kueue) against a test
cluster, with its pod and StatefulSet integrations on.

Called by tests/cluster/test_gang_kueue.py:

    with kueue.running(cluster, workdir) as k:
        cluster.kubectl("apply", "-f", "-", input=kueue.queues_yaml("team-a", gpus=4))

What a Deployment of Kueue would do, in the test cluster's terms: its CRDs are applied (server-side: they
are too large for client-side apply); it runs as a process on loopback with the admin kubeconfig, no
leader election, integrations ``pod`` and ``statefulset`` only. Its webhooks are Kueue's own manifests
(config/components/webhook/manifests.yaml, with the namespace selectors its kustomization adds to the pod
and StatefulSet webhooks) for pods, StatefulSets and Kueue's kinds, reached by URL on 127.0.0.1 instead
of through a Service (the test cluster has no kube-proxy); the server's certificate is the apiserver's
own (its SANs hold 127.0.0.1, its CA is the cluster's), so Kueue's internal cert rotation is off. With it
off, Kueue reads its metrics certificate from the fixed path /etc/kueue/metrics/certs
(cmd/kueue/main.go): the process runs in its own mount namespace (``unshare``) where an overlay on /etc
adds that directory, so nothing is written to the machine's /etc. Teardown deletes the webhook
configurations before the process stops, so later pods are not refused by a webhook nobody serves.
"""

from __future__ import annotations

import base64
import contextlib
import pathlib
import shutil
from collections.abc import Iterator
from typing import Any

import yaml

from asyncrl_testing import cluster as cluster_mod
from asyncrl_testing import cluster_http, cluster_process, gang_bins

NAMESPACE = "kueue-system"
METRICS_CERT_DIR = "kueue/metrics/certs"
"""Under /etc: where Kueue reads its metrics server's certificate when internal cert management is off."""
WEBHOOK_CONFIGS = ("asyncrl-test-kueue-mutating", "asyncrl-test-kueue-validating")
SERVED_PATHS = ("--v1-pod", "-apps-v1-statefulset", "-kueue-x-k8s-io-")
"""Webhooks of the two integrations and of Kueue's own kinds; the other frameworks' are off."""
SYSTEM_NAMESPACES = {
    "matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}
    ]
}


def config(health_port: int, metrics_port: int, webhook_port: int, cert_dir: pathlib.Path) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for the test cluster."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": ["pod", "statefulset"]},
        "featureGates": {"VisibilityOnDemand": False},  # an aggregated API server the test cluster lacks
    }


def webhook_configurations(manifests: pathlib.Path, webhook_port: int, ca_cert: pathlib.Path) -> list[Any]:
    """Kueue's webhook manifests, served paths only, each pointed at 127.0.0.1:``webhook_port``."""
    ca_bundle = base64.b64encode(ca_cert.read_bytes()).decode()
    out = []
    for doc, name in zip(yaml.safe_load_all(manifests.read_text()), WEBHOOK_CONFIGS, strict=True):
        hooks = []
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            if not any(part in path for part in SERVED_PATHS):
                continue
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{webhook_port}{path}", "caBundle": ca_bundle}
            if path.endswith(("--v1-pod", "-apps-v1-statefulset")):
                hook["namespaceSelector"] = SYSTEM_NAMESPACES
            hooks.append(hook)
        out.append({**doc, "metadata": {"name": name}, "webhooks": hooks})
    return out


def queues_yaml(queue: str, namespace: str, gpus: int, flavor: str = "default") -> str:
    """A ResourceFlavor, a ClusterQueue with ``gpus`` nvidia.com/gpu (and room for cpu, memory and
    ephemeral-storage), and the
    LocalQueue ``queue`` in ``namespace`` pointing at it."""
    cluster_queue = f"{namespace}-{queue}"
    docs: list[dict[str, Any]] = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": flavor}},
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        # every resource the pods request: a workload asking for one the queue does
                        # not cover is never admitted (asyncrl's pods request ephemeral-storage)
                        "coveredResources": ["cpu", "memory", "ephemeral-storage", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "64"},
                                    {"name": "memory", "nominalQuota": "256Gi"},
                                    {"name": "ephemeral-storage", "nominalQuota": "1Ti"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": queue, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        },
    ]
    return yaml.safe_dump_all(docs)


@contextlib.contextmanager
def running(c: cluster_mod.Cluster, workdir: pathlib.Path) -> Iterator[cluster_process.Component]:
    """Install Kueue's CRDs and webhooks, start the manager, yield it ready; undo it all on exit."""
    home = gang_bins.kueue_dir()
    workdir.mkdir(parents=True, exist_ok=True)
    c.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(home / "crd"), timeout=120)
    c.kubectl("wait", "--for=condition=Established", "-f", str(home / "crd"), "--timeout=60s")
    if c.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
        c.kubectl("create", "namespace", NAMESPACE)
    cert_dir, etc_upper, etc_work = workdir / "certs", workdir / "etc-upper", workdir / "etc-work"
    etc_work.mkdir(exist_ok=True)  # overlayfs' own scratch directory: empty
    for directory in (cert_dir, etc_upper / METRICS_CERT_DIR):
        directory.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(c.pki.serving_cert, directory / "tls.crt")
        shutil.copyfile(c.pki.serving_key, directory / "tls.key")
    health, metrics, webhook = (cluster_mod.free_port() for _ in range(3))
    config_path = workdir / "kueue-config.yaml"
    config_path.write_text(yaml.safe_dump(config(health, metrics, webhook, cert_dir)))
    overlay = f"lowerdir=/etc,upperdir={etc_upper},workdir={etc_work}"
    script = f'mount -t overlay overlay -o {overlay} /etc && exec "$@"'
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "kueue"]
    argv += [str(home / "kueue"), f"--config={config_path}", f"--kubeconfig={c.kubeconfig}"]
    component = cluster_process.Component("kueue", argv, workdir / "kueue.log", workdir)
    try:
        component.wait_ready(
            lambda: cluster_http.request(f"http://127.0.0.1:{health}/readyz").status == 200,
            cluster_mod.READY_TIMEOUT_S,
        )
        hooks = webhook_configurations(home / "webhook" / "manifests.yaml", webhook, c.pki.ca_cert)
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(hooks))
        yield component
    finally:
        c.kubectl(
            "delete", "mutatingwebhookconfiguration", WEBHOOK_CONFIGS[0], "--ignore-not-found", check=False
        )
        c.kubectl(
            "delete", "validatingwebhookconfiguration", WEBHOOK_CONFIGS[1], "--ignore-not-found", check=False
        )
        component.stop()
