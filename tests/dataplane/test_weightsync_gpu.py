"""Weight sync on GPUs: a real NCCL round from the trainer's sender into a vLLM CUDA engine.

Marked gpu and skipped unless the machine has two CUDA GPUs. On such a machine, one command:

    pytest -m gpu tests/dataplane/test_weightsync_gpu.py

Why two: the weight-sync group puts trainer rank 0 and the engine worker in one NCCL communicator, and
NCCL refuses two ranks of one communicator on the same GPU ("Duplicate GPU detected"), so a 1-GPU
machine cannot run a round. The sender (``weightsync/nccl.py``'s ``NcclWeightSender`` built from the
job's config, as ``trainer/main.py`` builds it) runs in a process of its own that sees only the second
GPU (``CUDA_VISIBLE_DEVICES``; tests/dataplane/weightsync_peer.py's sender role); the engine
(``rollout/engine.py`` with the job's own settings, ``rollout/main.py``'s ``engine_settings``: backend
nccl, bfloat16) runs on the first, and the rollout's control loop drives it as in the gloo vLLM round of
tests/dataplane/test_weightsync.py (tools/asyncrl_testing/vllm_round.py's ``serving``): pause -> ready ->
roster -> ``nccl.update_engine`` -> resume -> ack.

Two rounds: version 1 forms the group (``init_weight_transfer_engine`` with the roster's rank offset),
version 2 reuses it. Each must be acked by the replica, stamped on the engine, and what the engine then
holds, read back from vLLM's model (``vllm_round.engine_checksum``; the NCCL ack carries no checksum),
must hash to the trainer's ``checksum.of`` of what it sent.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest
import torch

if TYPE_CHECKING:
    from asyncrl_api import config

GPUS_NEEDED = 2
pytestmark = [
    pytest.mark.dataplane,
    pytest.mark.gpu,
    pytest.mark.skipif(
        torch.cuda.device_count() < GPUS_NEEDED,
        reason=f"needs {GPUS_NEEDED} CUDA GPUs (found {torch.cuda.device_count()}): NCCL refuses the trainer "
        "and the engine worker on one GPU in one communicator (Duplicate GPU detected)",
    ),
]
PEER = pathlib.Path(__file__).with_name("weightsync_peer.py")
ROUND_S = 300.0


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


def job_config(model: pathlib.Path, port: int) -> config.JobConfig:
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
            "trainer": {"replicas": 1, "gpusPerReplica": 1},
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


def next_event(proc: subprocess.Popen[str], kind: str) -> dict[str, Any]:
    """The sender's next JSON event of ``kind`` (vLLM's log lines on the same stdout are skipped)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith('{"event"'):
            event: dict[str, Any] = json.loads(line)
            if event["event"] == kind:
                return event
    raise AssertionError(f"the sender exited ({proc.wait()}) before {kind!r}")


async def _two_rounds(cfg: config.JobConfig, trainer: subprocess.Popen[str]) -> None:
    import transformers
    from asyncrl_testing import vllm_round
    from asyncrl_workloads.rollout import engine as engine_mod
    from asyncrl_workloads.rollout import main as rollout_main

    tok = transformers.AutoTokenizer.from_pretrained(cfg.spec.model.path)
    engine = await engine_mod.RolloutEngine.start(rollout_main.engine_settings(cfg))
    try:
        await asyncio.wait_for(asyncio.to_thread(next_event, trainer, "listening"), ROUND_S)
        tokenize = lambda text: list(tok(text)["input_ids"])  # noqa: E731
        port = cfg.endpoints.weight_sync_port
        async with vllm_round.serving(engine, "127.0.0.1", port, tokenize, job="nccl") as worker:
            synced = []
            for version in (1, 2):
                assert trainer.stdin is not None
                trainer.stdin.write(
                    json.dumps({"version": version, "seed": version, "dtype": "bfloat16"}) + "\n"
                )
                trainer.stdin.flush()
                report = await asyncio.wait_for(asyncio.to_thread(next_event, trainer, "synced"), ROUND_S)
                assert report["members"] == [0] and report["dropped"] == {}, report
                deadline = time.monotonic() + 30
                while len(worker.stats.updates) < version:  # recorded just after the ack
                    assert time.monotonic() < deadline, "the replica acked but recorded no update"
                    await asyncio.sleep(0.01)
                assert engine.version == version and await engine.llm.get_weight_version() == str(version)
                assert await vllm_round.engine_checksum(engine.llm) == report["checksum"]
                synced.append(report)
        assert synced[1]["generation"] == synced[0]["generation"]  # same member: the group was reused
        assert synced[1]["checksum"] != synced[0]["checksum"]
    finally:
        engine.shutdown()


def test_an_nccl_round_loads_into_a_cuda_engine_what_the_trainer_sent(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncrl_api import config
    from asyncrl_testing import vllm_round  # not at import: the skipped module stays cheap to collect

    monkeypatch.setenv(vllm_round.INSECURE_SERIALIZATION, "1")  # for engine_checksum's collective_rpc
    # The skip check initialised CUDA here: the engine's processes must not be forked from this one.
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    cfg = job_config(tiny_model, port_pair())
    job_json = tmp_path / "job.json"
    job_json.write_text(config.dumps(cfg))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": second_gpu(), "PYTHONPATH": os.pathsep.join(sys.path)}
    trainer = subprocess.Popen(
        [sys.executable, str(PEER), "sender", str(job_json), str(tiny_model)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        asyncio.run(_two_rounds(cfg, trainer))
    finally:
        trainer.kill()
        trainer.wait(timeout=30)
