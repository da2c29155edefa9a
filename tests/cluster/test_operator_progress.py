"""Trainer rank 0's progress report, as the data plane sends it (its real ApiServerSink, in a separate
local process), authenticated with the per-job ServiceAccount's token: allowed for its own job,
403 for another job -- the Role names only its job (resourceNames)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
from asyncrl_testing import cluster_wait, jobs, operator_proc
from asyncrl_testing.operator_proc import job_status

pytestmark = pytest.mark.cluster

REPORTER = textwrap.dedent("""
    import json, pathlib, sys, urllib.error
    from asyncrl_workloads.trainer import progress
    namespace, job, host, port, sa_dir = sys.argv[1:6]
    sink = progress.ApiServerSink(namespace, job, host, port, sa_dir=pathlib.Path(sa_dir))
    try:
        sink.write({"step": 7, "paramVersion": 6, "queueDepth": 3, "staleness": {"p50": 1.0, "max": 2}}, {})
        print(200)
    except urllib.error.HTTPError as exc:
        print(exc.code)
""")


@pytest.fixture(scope="module")
def operator(
    cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_proc.OperatorProcess]:
    with operator_proc.running(cluster, tmp_path_factory.mktemp("operator-progress")) as op:
        yield op


def _report(cluster: Any, sa_dir: pathlib.Path, namespace: str, job: str) -> int:
    server = urlparse(cluster.server)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            REPORTER,
            namespace,
            job,
            server.hostname or "127.0.0.1",
            str(server.port),
            str(sa_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(done.stdout.strip().splitlines()[-1])


def test_progress_report_with_the_job_token_is_allowed_only_for_its_job(
    cluster, namespace, operator, tmp_path
):
    for name in ("mine", "other"):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(jobs.make_job(name, namespace)))
    cluster_wait.wait_until(
        lambda: (
            cluster.kubectl("get", "rolebinding", "mine-trainer", "-n", namespace, check=False).returncode
        ),
        lambda rc: rc == 0,
        "the per-job RoleBinding",
        timeout=30,
    )
    token = cluster.kubectl(
        "create", "token", "mine-trainer", "-n", namespace, "--duration=10m"
    ).stdout.strip()
    sa_dir = tmp_path / "serviceaccount"
    sa_dir.mkdir()
    (sa_dir / "token").write_text(token)
    (sa_dir / "ca.crt").write_text(cluster.pki.ca_cert.read_text())

    assert _report(cluster, sa_dir, namespace, "mine") == 200
    assert job_status(cluster, namespace, "mine")["progress"]["step"] == 7
    assert _report(cluster, sa_dir, namespace, "other") == 403
    assert "progress" not in job_status(cluster, namespace, "other")

    account = f"system:serviceaccount:{namespace}:mine-trainer"
    can = cluster.kubectl(
        "auth", "can-i", "patch", "asyncrljobs/status", "-n", namespace, "--as", account, check=False
    ).stdout.strip()
    assert can == "no"  # not for every job ...
    can_own = cluster.kubectl(
        "auth",
        "can-i",
        "patch",
        "asyncrljobs/mine",
        "--subresource=status",
        "-n",
        namespace,
        "--as",
        account,
        check=False,
    ).stdout.strip()
    assert can_own == "yes"  # ... only for its own
    # operator and trainer own disjoint status fields: both survive each other's writes
    status = cluster_wait.wait_until(
        lambda: job_status(cluster, namespace, "mine"),
        lambda st: st.get("phase") == "Running",
        "mine Running",
        timeout=90,
    )
    assert status["progress"]["paramVersion"] == 6
