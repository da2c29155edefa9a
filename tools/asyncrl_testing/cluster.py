"""A real Kubernetes control plane for tests: etcd, kube-apiserver, controller-manager, scheduler, kwok.

Called by tests/cluster/conftest.py (the session `cluster` fixture) and by tools/testcluster (humans).

    with cluster.start_cluster(workdir, gpu_nodes=2) as c:
        c.kubectl("get", "nodes")

Startup order and what each step waits for:
  PKI (CA, serving + admin certs, SA key pair) -> etcd (/health) -> kube-apiserver (/readyz, RBAC,
  client-cert admin, SA token issuer) -> kube-controller-manager (/healthz; signs SA tokens, publishes
  kube-root-ca.crt, runs GC) -> kube-scheduler (/healthz) -> kwok (/healthz, default stages) -> N fake
  GPU nodes (`nvidia.com/gpu: 8`) Ready -> `default` ServiceAccount and root-CA ConfigMap exist.
Every port is free-picked; every component has its own process group and log under `<workdir>/logs`.
Teardown (also on error) stops components in reverse order and removes the etcd data dir (or the
whole workdir when the harness made it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

from asyncrl_testing import cluster_bins, cluster_http, cluster_nodes, cluster_pki, cluster_process

SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.244.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
BOOT_ATTEMPTS = 2
PORT_TAKEN = "address already in use"
READY_TIMEOUT_S = float(os.environ.get("ASYNCRL_CLUSTER_READY_TIMEOUT", "180"))


class CommandFailed(RuntimeError):
    """kubectl or helm exited non-zero where the caller expected success; carries stdout and stderr."""

    def __init__(self, argv: list[str], done: subprocess.CompletedProcess[str]) -> None:
        super().__init__(
            f"{' '.join(argv)} exited {done.returncode}\nstderr: {done.stderr.strip()}"
            f"\nstdout: {done.stdout.strip()[-2000:]}"
        )
        self.completed = done


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclasses.dataclass
class Cluster:
    """A running test cluster. `kubeconfig` is the admin kubeconfig; `ready_seconds` the time-to-ready."""

    workdir: pathlib.Path
    bins: cluster_bins.Binaries
    pki: cluster_pki.Pki
    server: str
    kubeconfig: pathlib.Path
    gpu_nodes: list[str] = dataclasses.field(default_factory=list)
    components: list[cluster_process.Component] = dataclasses.field(default_factory=list)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    ready_seconds: float = 0.0

    def api(
        self, path: str, method: str = "GET", body: object = None, token: str | None = None
    ) -> cluster_http.Response:
        """A raw API call: as the admin user, or with a bearer `token` (then no client certificate)."""
        client_cert = None if token is not None else self.pki.admin_cert
        context = cluster_http.tls_context(self.pki.ca_cert, client_cert, self.pki.admin_key)
        return cluster_http.request(self.server + path, method, body, context, token)

    def env(self) -> dict[str, str]:
        """Environment for processes that should talk to this cluster (kubectl, helm, an operator)."""
        env = dict(os.environ)
        env.setdefault("PATH", os.defpath)
        env.update(
            KUBECONFIG=str(self.kubeconfig),
            KUBECACHEDIR=str(self.workdir / "kubecache"),
            HELM_CACHE_HOME=str(self.workdir / "helm" / "cache"),
            HELM_CONFIG_HOME=str(self.workdir / "helm" / "config"),
            HELM_DATA_HOME=str(self.workdir / "helm" / "data"),
            PATH=os.pathsep.join([str(self.bins.kubectl.parent), str(self.bins.helm.parent), env["PATH"]]),
        )
        return env

    def _run(
        self, binary: pathlib.Path, args: tuple[str, ...], input: str | None, check: bool, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(binary), *args]
        done = subprocess.run(
            argv, input=input, capture_output=True, text=True, env=self.env(), timeout=timeout
        )
        if check and done.returncode != 0:
            raise CommandFailed(argv, done)
        return done

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against this cluster; raises CommandFailed on a non-zero exit if `check`."""
        return self._run(self.bins.kubectl, args, input, check, timeout)

    def helm(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run the real helm against this cluster; raises CommandFailed on a non-zero exit if `check`."""
        return self._run(self.bins.helm, args, input, check, timeout)

    def privileged_pod_refusal(self, namespace: str) -> str:
        """What the API server says to a privileged pod in ``namespace`` (server-side dry run: admission
        runs, nothing is stored): proof that the PodSecurity admission plugin enforces the namespace's
        `pod-security.kubernetes.io/enforce` label. Fails if the pod is admitted."""
        done = self.kubectl(
            "run", "privileged", "-n", namespace, "--image=busybox:1.36", "--privileged", "--dry-run=server",
            check=False,
        )  # fmt: skip
        assert done.returncode != 0, "a privileged pod was admitted: the namespace enforces no PSS level"
        return done.stderr

    def stop(self) -> None:
        """Stop every component, last started first. Safe to call more than once."""
        errors = []
        for component in reversed(self.components):
            try:
                component.stop()
            except Exception as exc:  # keep stopping the others
                errors.append(f"{component.name}: {exc}")
        self.components.clear()
        if errors:
            raise RuntimeError("teardown failed: " + "; ".join(errors))


def _start(c: Cluster, name: str, argv: list[str], probe: Callable[[], bool], die_with_parent: bool) -> None:
    component = cluster_process.Component(
        name, argv, c.workdir / "logs" / f"{name}.log", c.workdir, die_with_parent
    )
    c.components.append(component)
    c.timings[name] = component.wait_ready(probe, READY_TIMEOUT_S)


def _healthz(url: str, context: ssl.SSLContext | None) -> Callable[[], bool]:
    return lambda: cluster_http.request(url, context=context).status == 200


def _boot(c: Cluster, gpu_nodes: int, die_with_parent: bool) -> None:
    b, pki, w = c.bins, c.pki, c.workdir
    insecure = cluster_http.tls_context(None)
    etcd_port, etcd_peer = free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    _start(
        c,
        "etcd",
        [
            str(b.etcd),
            "--name=asyncrl",
            f"--data-dir={w / 'etcd'}",
            "--log-level=warn",
            "--unsafe-no-fsync",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=asyncrl=http://127.0.0.1:{etcd_peer}",
        ],
        lambda: cluster_http.request(etcd_url + "/health").json().get("health") == "true",
        die_with_parent,
    )

    _start(
        c,
        "kube-apiserver",
        [
            str(b.kube_apiserver),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={c.server.rsplit(':', 1)[1]}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--profiling=false",
            "--endpoint-reconciler-type=none",
        ],
        lambda: c.api("/readyz").status == 200,
        die_with_parent,
    )

    for name, binary, extra in (
        (
            "kube-controller-manager",
            b.kube_controller_manager,
            [
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_cert}",
                f"--cluster-signing-cert-file={pki.ca_cert}",
                f"--cluster-signing-key-file={pki.ca_key}",
                "--use-service-account-credentials=false",
            ],
        ),
        ("kube-scheduler", b.kube_scheduler, []),
    ):
        port = free_port()
        _start(
            c,
            name,
            [
                str(binary),
                f"--kubeconfig={c.kubeconfig}",
                f"--authentication-kubeconfig={c.kubeconfig}",
                f"--authorization-kubeconfig={c.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--leader-elect=false",
                "--profiling=false",
                *extra,
            ],
            _healthz(f"https://127.0.0.1:{port}/healthz", insecure),
            die_with_parent,
        )

    kwok_port = free_port()
    stages = cluster_bins.write_kwok_stages(w / "kwok-stages.yaml")
    _start(
        c,
        "kwok",
        [
            str(b.kwok),
            f"--kubeconfig={c.kubeconfig}",
            f"--config={stages}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={cluster_nodes.MANAGED_ANNOTATION}",
            "--manage-nodes-with-label-selector=",
            "--manage-single-node=",
            f"--cidr={POD_CIDR}",
            "--node-ip=10.0.0.2",
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{kwok_port}",
        ],
        _healthz(f"http://127.0.0.1:{kwok_port}/healthz", None),
        die_with_parent,
    )

    start = time.monotonic()
    kwok = c.components[-1]
    for index in range(gpu_nodes):
        node = cluster_nodes.gpu_node(f"gpu-{index}")
        created = c.api("/api/v1/nodes", "POST", node)
        if created.status != 201:
            raise kwok.fail(f"node create answered {created.status}: {created.body[:300]!r}")
        c.gpu_nodes.append(node["metadata"]["name"])
    kwok.wait_ready(
        lambda: cluster_nodes.all_ready(c.api("/api/v1/nodes").json(), c.gpu_nodes), READY_TIMEOUT_S
    )
    kcm = c.components[2]
    kcm.wait_ready(
        lambda: (
            c.api("/api/v1/namespaces/default/serviceaccounts/default").status == 200
            and c.api("/api/v1/namespaces/default/configmaps/kube-root-ca.crt").status == 200
        ),
        READY_TIMEOUT_S,
    )
    c.timings["nodes+serviceaccounts"] = time.monotonic() - start


@contextlib.contextmanager
def start_cluster(
    workdir: pathlib.Path | str | None = None,
    gpu_nodes: int = 2,
    die_with_parent: bool = True,
    quiet: bool = False,
) -> Iterator[Cluster]:
    """Start a cluster, yield it ready, and tear it down on exit (normal or not).

    `workdir=None` uses a fresh temp dir that is removed afterwards; a given workdir keeps its logs and
    kubeconfig, and only the etcd data is removed. Raises cluster_bins.MissingBinaries (naming the build
    command) or cluster_process.ComponentNotReady (naming the component, with its log tail).
    """
    bins = cluster_bins.find_binaries()
    owned = workdir is None
    path = pathlib.Path(tempfile.mkdtemp(prefix="asyncrl-cluster-") if workdir is None else workdir).resolve()
    path.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    try:
        pki = cluster_pki.make_pki(path / "pki")
        kubeconfig = path / "admin.kubeconfig"
        for attempt in range(1, BOOT_ATTEMPTS + 1):
            server = f"https://127.0.0.1:{free_port()}"
            cluster_pki.write_kubeconfig(kubeconfig, server, pki)
            c = Cluster(workdir=path, bins=bins, pki=pki, server=server, kubeconfig=kubeconfig)
            try:
                _boot(c, gpu_nodes, die_with_parent)
                break
            except BaseException as exc:
                c.stop()
                shutil.rmtree(path / "etcd", ignore_errors=True)
                # A free-picked port can be taken by someone else before the component binds it: retry.
                if attempt == BOOT_ATTEMPTS or PORT_TAKEN not in str(exc):
                    raise
        try:
            c.ready_seconds = time.monotonic() - began
            if not quiet:
                print(
                    f"asyncrl test cluster ready in {c.ready_seconds:.1f}s ({len(c.gpu_nodes)} GPU nodes); "
                    f"KUBECONFIG={kubeconfig}",
                    file=sys.stderr,
                )
            yield c
        finally:
            c.stop()
    finally:
        shutil.rmtree(path if owned else path / "etcd", ignore_errors=True)
