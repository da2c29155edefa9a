"""spec.code.configMap on the real apiserver (issue 33): a verl user's reward file in a ConfigMap, the
operator's rollout StatefulSet mounting it and putting it on PYTHONPATH, and that rollout's own command
passing its start-up checks on a parquet file in verl's row layout with the verl-signature function
imported from the ConfigMap's files (placed where the kubelet would mount them). It stops only at NATS,
which is unreachable here (exit 1 with that line, not exit 2 for the job): the whole job trains in
tests/e2e/test_local_runner.py, with spec.code as a directory."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from asyncrl_testing import cluster_wait, jobs, operator_proc
from asyncrl_testing.operator_proc import get_json
from asyncrl_workloads import tinymodel

pytestmark = pytest.mark.cluster

REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
ROWS = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"What is {n} + {n}?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(2 * n)},
        "extra_info": {"split": "train", "index": n},
    }
    for n in range(4)
]


@pytest.fixture(scope="module")
def operator(
    cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_proc.OperatorProcess]:
    with operator_proc.running(cluster, tmp_path_factory.mktemp("operator-code")) as op:
        yield op


def test_a_configmap_of_python_files_reaches_the_rollouts_start_up(
    cluster: Any, namespace: str, operator: Any, tmp_path: pathlib.Path
) -> None:
    (tmp_path / "gsm8k_reward.py").write_text(REWARD)
    cluster.kubectl(
        "create", "configmap", "my-reward", "-n", namespace, f"--from-file={tmp_path / 'gsm8k_reward.py'}"
    )
    job = jobs.make_job(
        "verl", namespace, code={"configMap": "my-reward"}, reward={"function": "gsm8k_reward:compute_score"},
        data={"prompts": "/storage/gsm8k/train.parquet", "format": "chat"},
    )  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps(job))
    rollout = cluster_wait.wait_until(
        lambda: get_json(cluster, "statefulset", "verl-rollout", "-n", namespace),
        lambda sts: bool(sts),
        "the rendered rollout StatefulSet",
        timeout=30,
    )
    pod = rollout["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert {"name": "asyncrl-code", "configMap": {"name": "my-reward", "defaultMode": 420}} in pod["volumes"]
    mount = {"name": "asyncrl-code", "mountPath": "/opt/asyncrl-code", "readOnly": True}
    assert mount in container["volumeMounts"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["PYTHONPATH"] == "/opt/asyncrl-code"

    mounted = tmp_path / "opt-asyncrl-code"  # the kubelet's mount of the ConfigMap, here
    mounted.mkdir()
    for name, text in get_json(cluster, "configmap", "my-reward", "-n", namespace)["data"].items():
        (mounted / name).write_text(text)
    body = json.loads(get_json(cluster, "configmap", "verl-config", "-n", namespace)["data"]["job.json"])
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "train.parquet")
    body["spec"]["model"] = {"path": str(tinymodel.create_tiny_model(tmp_path / "model", seed=0, chat=True))}
    body["spec"]["data"]["prompts"] = str(tmp_path / "train.parquet")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    body["endpoints"]["natsUrl"] = f"nats://127.0.0.1:{closed}"
    (tmp_path / "job.json").write_text(json.dumps(body))
    command = [str(pathlib.Path(sys.executable).parent / container["command"][0]), *container["command"][1:]]
    command[command.index("--config") + 1] = str(tmp_path / "job.json")
    env = {
        **os.environ,
        **env,
        "PYTHONPATH": str(mounted),
        "ASYNCRL_REPLICA": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1, done.stderr[-3000:]
    assert last.startswith("asyncrl-rollout: endpoints.natsUrl: cannot reach NATS"), done.stderr[-3000:]
