"""`asyncrl import`'s jobs on the real apiserver: the AsyncRLJobs translated from a verl fully_async
agent-loop config and an AReaL async agent config pass a server-side dry run (the CRD's schema, bounds
and CEL rules), as the unit tests check them against the operator's admission."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from asyncrl_testing import migration, operator_proc
from asyncrl_workloads.importer import translate

pytestmark = pytest.mark.cluster

IMPORTS = {
    "verl": (migration.VERL_FULLY_ASYNC_AGENT, {"env": {"DATA_ROOT": "/data"}, "tools": ["my_tools:search"]}),
    "areal": (migration.AREAL_AGENT_ASYNC, {"reward": "agent.reward:score"}),
}


@pytest.mark.parametrize("kind", IMPORTS)
def test_an_imported_job_passes_a_server_side_dry_run(cluster: Any, namespace: str, kind: str) -> None:
    operator_proc.install_crd(cluster)
    text, options = IMPORTS[kind]
    job = translate.translate(kind, yaml.safe_load(text), **options).job
    job["metadata"]["namespace"] = namespace
    done = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(job), check=False)
    assert done.returncode == 0, done.stderr
    assert "(server dry run)" in done.stdout
    job["spec"]["trainer"]["batch"]["miniBatches"] = 0  # the same path refuses what the CRD refuses
    done = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(job), check=False)
    assert done.returncode != 0 and "spec.trainer.batch.miniBatches" in done.stderr
