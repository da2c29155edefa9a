"""The real `asyncrl-operator` as a subprocess against a test cluster (operator engineer's addition).

Used by tests/cluster/test_operator*.py and the reconcile benchmark (with the small kubectl helpers at the
end, bind_storage among them):

    with operator_proc.running(cluster, workdir) as op:
        ...            # op.metrics_url, op.log_path; op.kill() / op.start() to simulate a crash

The CRD is applied (server-side) before the operator starts. Logs go to a file whose tail is shown when
the operator dies early. The process is its own process group and is stopped by its pid only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

from asyncrl_testing import cluster as cluster_mod
from asyncrl_testing import cluster_wait

REPO = pathlib.Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "asyncrl.dev_asyncrljobs.yaml"


def install_crd(c: cluster_mod.Cluster) -> None:
    c.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # `kubectl wait` errors out while the CRD has no status yet
        crd = get_json(c, "crd", "asyncrljobs.asyncrl.dev")
        conditions = (crd.get("status") or {}).get("conditions") or []
        if any(x["type"] == "Established" and x["status"] == "True" for x in conditions):
            return
        time.sleep(0.2)
    raise RuntimeError("the AsyncRLJob CRD was not Established within 60s")


def _entry_point() -> list[str]:
    script = pathlib.Path(sys.executable).parent / "asyncrl-operator"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "asyncrl_operator.main"]


@dataclasses.dataclass
class OperatorProcess:
    cluster: cluster_mod.Cluster
    log_path: pathlib.Path
    resync_seconds: float = 3.0
    extra_args: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    liveness_port: int = 0

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self) -> None:
        self.metrics_port = cluster_mod.free_port()
        self.liveness_port = cluster_mod.free_port()
        argv = [
            *_entry_point(),
            "--metrics-port",
            str(self.metrics_port),
            "--liveness-port",
            str(self.liveness_port),
            "--resync-seconds",
            str(self.resync_seconds),
            *self.extra_args,
        ]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.cluster.env(),
            cwd=REPO,
            start_new_session=True,
        )
        log.close()
        self._wait_live(timeout=60)

    def _wait_live(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"asyncrl-operator exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"asyncrl-operator not live after {timeout}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL, as a crash would (no cleanup handlers run)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
            return str(response.read().decode())


@contextlib.contextmanager
def running(
    c: cluster_mod.Cluster,
    workdir: pathlib.Path,
    resync_seconds: float = 3.0,
    extra_args: tuple[str, ...] = (),
) -> Iterator[OperatorProcess]:
    install_crd(c)
    op = OperatorProcess(c, workdir / "asyncrl-operator.log", resync_seconds, extra_args)
    op.start()
    try:
        yield op
    finally:
        op.stop()


# ---- small kubectl helpers the operator tests share -------------------------------------------------


def get_json(c: cluster_mod.Cluster, *args: str) -> Any:
    """`kubectl get ... -o json` parsed, or {} when the object does not exist."""
    done = c.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def job_status(c: cluster_mod.Cluster, namespace: str, name: str) -> Any:
    return get_json(c, "asyncrljob", name, "-n", namespace).get("status") or {}


def pods(c: cluster_mod.Cluster, namespace: str, job: str, role: str | None = None) -> list[Any]:
    selector = f"asyncrl.dev/job={job}" + (f",asyncrl.dev/role={role}" if role else "")
    items: list[Any] = get_json(c, "pods", "-n", namespace, "-l", selector).get("items") or []
    return items


def condition(status: Any, kind: str) -> Any:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def bind_storage(cluster: cluster_mod.Cluster, namespace: str, claim: str) -> None:
    """A statically bound PV/PVC pair (the scheduler needs bound claims; kwok mounts nothing)."""
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{namespace}-{claim}"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "manual",
            "hostPath": {"path": f"/tmp/{namespace}"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "manual",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    for obj in (pv, pvc):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))
    cluster_wait.wait_until(
        lambda: get_json(cluster, "pvc", claim, "-n", namespace).get("status", {}),
        lambda st: st.get("phase") == "Bound",
        f"claim {claim} Bound",
        timeout=60,
    )
