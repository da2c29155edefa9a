"""NCCL weight-sync rounds on two GPUs: the parts tests/dataplane/test_weightsync_gpu.py and
tools/asyncrl_testing/bench_weightsync.py (``--backend nccl``) share.

Trainer rank 0 runs in a process of its own that sees only the second GPU (``CUDA_VISIBLE_DEVICES``;
tests/dataplane/weightsync_peer.py's sender role: orders on stdin, JSON events on stdout), the engine
on the first: NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected").

- ``job_config``: a JobConfig for weightSync backend nccl in bfloat16 (the rollout's ``engine_settings``
  and the sender's ``NcclWeightSender`` both build from it); ``port_pair`` finds its port.
- ``start_sender``: the sender process; ``order`` asks it for one round, ``next_event`` reads its answer.

Cheap to import (the GPU test imports it at collection on machines without GPUs): the standard library
only, the project's modules inside the functions.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncrl_api import config

GPUS_NEEDED = 2
"""Trainer rank 0 and the engine worker, each on a GPU of its own."""
PEER = pathlib.Path(__file__).resolve().parents[2] / "tests" / "dataplane" / "weightsync_peer.py"


def port_pair() -> int:
    """A free port whose neighbour is free too (nccl.group_port: vLLM's rendezvous listens on port + 1)."""
    while True:
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        if port < 65534:
            return port


def job_config(model: pathlib.Path, port: int, lora: dict[str, Any] | None = None) -> config.JobConfig:
    """One rollout replica and one trainer, one GPU each, weightSync nccl on ``port``, the model in bf16."""
    from asyncrl_api import config

    from asyncrl_testing import jobs

    spec = jobs.deep_merge(
        jobs.BASE_SPEC,
        {
            "model": {"path": str(model), "dtype": "bfloat16"},
            "rollout": {
                "replicas": 1,
                "gpusPerReplica": 1,
                "engine": {"gpuMemoryUtilization": 0.3, "enforceEager": True},
            },
            "trainer": {"replicas": 1, "gpusPerReplica": 1, **({"lora": lora} if lora else {})},
            "weightSync": {"backend": "nccl", "port": port, "timeoutSeconds": 120, "bucketMB": 1},
        },
    )
    endpoints = config.Endpoints(
        nats_url="nats://127.0.0.1:4222", trainer_host="127.0.0.1", weight_sync_port=port
    )
    return config.JobConfig(name="nccl", namespace="ns", spec=spec, endpoints=endpoints)


def second_gpu() -> str:
    """The second visible GPU in the names CUDA_VISIBLE_DEVICES already uses, if it is set."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[1] if visible else "1"


def start_sender(
    cfg: config.JobConfig, workdir: pathlib.Path, model: pathlib.Path, role: list[str] | None = None
) -> subprocess.Popen[str]:
    """Trainer rank 0 on the second GPU: ``role`` (default weightsync_peer.py's sender) run as
    ``python *role JOB_JSON MODEL_DIR`` with the job written to ``workdir``/job.json; it inherits this
    process's environment (set the engine's variables first) and its sys.path as PYTHONPATH."""
    from asyncrl_api import config

    job_json = workdir / "job.json"
    job_json.write_text(config.dumps(cfg))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": second_gpu(), "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, *(role or [str(PEER), "sender"]), str(job_json), str(model)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def next_event(proc: subprocess.Popen[str], kind: str) -> dict[str, Any]:
    """The sender's next JSON event of ``kind`` (vLLM's log lines on the same stdout are skipped)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith('{"event"'):
            event: dict[str, Any] = json.loads(line)
            if event["event"] == kind:
                return event
    raise AssertionError(f"the sender exited ({proc.wait()}) before {kind!r}")


def order(trainer: subprocess.Popen[str], version: int, **extra: Any) -> None:
    """Ask the sender for one round: ``version``'s weights, perturbed by seed ``version``."""
    assert trainer.stdin is not None
    trainer.stdin.write(json.dumps({"version": version, "seed": version, **extra}) + "\n")
    trainer.stdin.flush()
