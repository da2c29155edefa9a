"""The operator image against the real test cluster: started with podman (or docker) as the chart's
Deployment runs it (uid 65532, read-only root filesystem, tmpfs /tmp; host network here, and the test
cluster's kubeconfig mounted read-only where a pod would have its ServiceAccount token), it reconciles
examples/tiny-cpu.yaml to phase Running (kwok runs the pods). A container that dies fails the test with
its log tail; it is removed in teardown whatever happened."""

from __future__ import annotations

import json
import pathlib
import secrets
import shutil
import subprocess
import time
import urllib.request

import pytest
from asyncrl_testing import cluster as cluster_mod
from asyncrl_testing import cluster_wait, jobs, operator_proc

pytestmark = pytest.mark.images

KUBECONFIG = "/etc/asyncrl-test/kubeconfig"
LOG_TAIL_LINES = 40


class OperatorContainer:
    """`run` of the operator image, attached, its output in a log file."""

    def __init__(self, engine, kubeconfig: pathlib.Path, log_path: pathlib.Path) -> None:
        self.engine = engine
        self.name = f"asyncrl-test-operator-{secrets.token_hex(3)}"
        self.liveness_port = cluster_mod.free_port()
        self.log_path = log_path
        args = ["--metrics-port", str(cluster_mod.free_port()), "--liveness-port", str(self.liveness_port)]
        argv = engine.hardened(
            "operator",
            [*args, "--resync-seconds", "3"],
            name=self.name,
            volumes=[f"{kubeconfig}:{KUBECONFIG}:ro"],
            env={"KUBECONFIG": KUBECONFIG},
        )
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=engine.env)

    def tail(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-LOG_TAIL_LINES:])

    def alive(self) -> None:
        if self.proc.poll() is not None:
            pytest.fail(f"the operator container exited with code {self.proc.returncode}:\n{self.tail()}")

    def live(self) -> bool:
        self.alive()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2):
                return True
        except OSError:
            return False

    def remove(self) -> None:
        self.engine.remove(self.name)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def operator_container(engine, built, cluster, tmp_path):
    built("operator")
    operator_proc.install_crd(cluster)
    kubeconfig = tmp_path / "kubeconfig"  # the admin kubeconfig is root's 0600: uid 65532 reads a copy
    shutil.copyfile(cluster.kubeconfig, kubeconfig)
    kubeconfig.chmod(0o644)
    container = OperatorContainer(engine, kubeconfig, tmp_path / "operator.log")
    try:
        started = time.monotonic()
        while not container.live():
            if time.monotonic() - started > 60:
                pytest.fail(f"the operator container was not live within 60s:\n{container.tail()}")
            time.sleep(0.3)
        yield container
    finally:
        container.remove()
    left = engine("ps", "-a", "--filter", f"name=^{container.name}$", "--format", "{{.Names}}")
    assert left.returncode == 0 and left.stdout.split() == [], f"{container.name} left behind: {left}"


def test_the_operator_image_reconciles_the_tiny_cpu_job_to_running(cluster, operator_container):
    namespace = f"images-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", namespace)
    try:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(jobs.load_example("tiny-cpu.yaml", namespace)))

        def status():
            operator_container.alive()
            return operator_proc.job_status(cluster, namespace, "tiny")

        def ready(st):  # Running comes with the trainer and one rollout; the second's readiness may follow
            kinds = ("TrainerReady", "RolloutReady", "BusReady")
            return st.get("phase") == "Running" and all(
                operator_proc.condition(st, kind).get("status") == "True" for kind in kinds
            )

        try:
            cluster_wait.wait_until(status, ready, "tiny Running with every role ready", timeout=120)
        except cluster_wait.WaitTimeout as exc:
            seen = cluster.kubectl("get", "arj,sts,pods", "-n", namespace, "-o", "wide", check=False).stdout
            pytest.fail(f"{exc}\n{seen}\noperator log:\n{operator_container.tail()}")
        assert len(operator_proc.pods(cluster, namespace, "tiny", "rollout")) == 2
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found")
