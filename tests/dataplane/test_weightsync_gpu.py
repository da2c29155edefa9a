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

A LoRA job's two rounds (spec.trainer.lora over weightSync.backend nccl): the trainer (``LORA_SENDER``, a
process on the second GPU) sends peft adapters with seeded random weights through the same sender, and
the engine's workers receive them through vLLM's NCCL engine into the adapter directory
(``weightsync/nccl.py``'s ``receive_adapter``), which vLLM then loads in place. Each round: the directory
holds exactly what the trainer sent (``checksum.of``), vLLM lists the adapter and every request names it,
its outputs differ from the base model's, and the base weights are the ones the engine started with.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import subprocess
import textwrap
import time
from typing import TYPE_CHECKING

import pytest
import torch
from asyncrl_testing import ncclround
from asyncrl_testing.ncclround import GPUS_NEEDED, job_config, next_event, order, port_pair

if TYPE_CHECKING:
    from asyncrl_api import config

pytestmark = [
    pytest.mark.dataplane,
    pytest.mark.gpu,
    pytest.mark.skipif(
        torch.cuda.device_count() < GPUS_NEEDED,
        reason=f"needs {GPUS_NEEDED} CUDA GPUs (found {torch.cuda.device_count()}): NCCL refuses the trainer "
        "and the engine worker on one GPU in one communicator (Duplicate GPU detected)",
    ),
]
ROUND_S = 300.0
LORA = {"rank": 8, "alpha": 16.0, "targetModules": ["q_proj", "v_proj", "down_proj"]}

LORA_SENDER = textwrap.dedent("""
    import json, pathlib, sys, time

    import torch, transformers
    from asyncrl_api import config as config_mod
    from asyncrl_workloads.trainer import lora as lora_mod
    from asyncrl_workloads.weightsync import checksum, nccl

    def adapters(model_dir, settings, seed):
        # peft's adapters on the tiny model, every weight seeded (lora_B too: not the identity)
        model = lora_mod.apply(transformers.AutoModelForCausalLM.from_pretrained(model_dir), settings)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".lora_" in name:
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
        return [(n, t.to("cuda")) for n, t in lora_mod.adapter_tensors(model, torch.bfloat16)]

    def main(job_json, model_dir):
        torch.cuda.set_device(0)
        cfg = config_mod.JobConfig.model_validate_json(pathlib.Path(job_json).read_text())
        spec = cfg.spec.trainer.lora
        settings = lora_mod.LoraSettings(spec.rank, spec.alpha, tuple(spec.target_modules))
        trainer = nccl.NcclWeightSender(cfg)  # its plans carry the adapter (cfg's trainer.lora)
        print(json.dumps({"event": "listening"}), flush=True)
        for line in sys.stdin:
            order = json.loads(line)
            while not trainer.members():
                time.sleep(0.05)
            named = adapters(model_dir, settings, order["seed"])
            report = trainer.sync(order["version"], named)
            print(json.dumps({"event": "synced", "version": report.version, "members": report.members,
                              "dropped": report.dropped, "generation": report.generation,
                              "nbytes": report.nbytes, "checksum": checksum.of(named)}), flush=True)
        trainer.close()

    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2])
""")
"""Trainer rank 0 of a LoRA job, in a process of its own: ``python -c LORA_SENDER JOB_JSON MODEL_DIR``,
driven like weightsync_peer.py's sender role (orders on stdin, JSON events on stdout)."""


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
                order(trainer, version, dtype="bfloat16")
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


async def _two_lora_rounds(cfg: config.JobConfig, trainer: subprocess.Popen[str]) -> None:
    import safetensors.torch
    import transformers
    from asyncrl_testing import vllm_round
    from asyncrl_workloads.rollout import engine as engine_mod
    from asyncrl_workloads.rollout import main as rollout_main
    from asyncrl_workloads.weightsync import adapter, checksum

    tok = transformers.AutoTokenizer.from_pretrained(cfg.spec.model.path)

    def tokenize(text: str) -> list[int]:
        return list(tok(text)["input_ids"])

    engine = await engine_mod.RolloutEngine.start(rollout_main.engine_settings(cfg))
    try:
        base_weights = await vllm_round.engine_checksum(engine.llm)
        prompt = tokenize("abc")
        greedy = engine.sampling(n=1, max_tokens=16, temperature=0.0, top_p=1.0)
        base_out = (await engine.generate(prompt, greedy))[0]
        await asyncio.wait_for(asyncio.to_thread(next_event, trainer, "listening"), ROUND_S)
        port = cfg.endpoints.weight_sync_port
        async with vllm_round.serving(engine, "127.0.0.1", port, tokenize, job="nccl-lora") as worker:
            synced = []
            for version in (1, 2):
                order(trainer, version)
                report = await asyncio.wait_for(asyncio.to_thread(next_event, trainer, "synced"), ROUND_S)
                assert report["members"] == [0] and report["dropped"] == {}, report
                deadline = time.monotonic() + 30
                while len(worker.stats.updates) < version:  # recorded just after the ack
                    assert time.monotonic() < deadline, "the replica acked but recorded no update"
                    await asyncio.sleep(0.01)
                assert engine.version == version and await engine.llm.get_weight_version() == str(version)
                # The adapter directory holds what the trainer sent, and vLLM serves it.
                assert engine.lora is not None and engine.lora.lora_int_id == adapter.LORA_ID
                directory = pathlib.Path(engine.lora.lora_path)
                written = safetensors.torch.load_file(str(directory / adapter.WEIGHTS))
                assert checksum.of(written.items()) == report["checksum"]
                assert json.loads((directory / adapter.CONFIG).read_text())["r"] == LORA["rank"]
                assert adapter.LORA_ID in await engine.llm.list_loras()
                served = (await engine.generate(prompt, greedy))[0]
                assert served.logprobs != base_out.logprobs, "the adapter changed nothing"
                # Only the adapter moved: the base model never left the GPU.
                assert await vllm_round.engine_checksum(engine.llm) == base_weights
                synced.append({**report, "nbytes_written": sum(t.nbytes for t in written.values())})
        assert synced[1]["generation"] == synced[0]["generation"]  # same member: the group was reused
        assert synced[1]["checksum"] != synced[0]["checksum"]
        assert all(r["nbytes"] == r["nbytes_written"] for r in synced)  # the adapters alone crossed
    finally:
        engine.shutdown()


def start_sender(
    cfg: config.JobConfig, tmp_path: pathlib.Path, model: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> subprocess.Popen[str]:
    """Trainer rank 0 on the second GPU: the LoRA script for a LoRA job, else weightsync_peer.py's sender."""
    from asyncrl_testing import vllm_round  # not at import: the skipped module stays cheap to collect

    monkeypatch.setenv(vllm_round.INSECURE_SERIALIZATION, "1")  # for engine_checksum's collective_rpc
    # The skip check initialised CUDA here: the engine's processes must not be forked from this one.
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    role = ["-c", LORA_SENDER] if cfg.spec.trainer.lora is not None else None
    return ncclround.start_sender(cfg, tmp_path, model, role)


def test_an_nccl_round_loads_into_a_cuda_engine_what_the_trainer_sent(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = job_config(tiny_model, port_pair())
    trainer = start_sender(cfg, tmp_path, tiny_model, monkeypatch)
    try:
        asyncio.run(_two_rounds(cfg, trainer))
    finally:
        trainer.kill()
        trainer.wait(timeout=30)


def test_a_lora_round_over_nccl_writes_the_adapter_the_trainer_sent_and_vllm_serves_it(
    tiny_model: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = job_config(tiny_model, port_pair(), lora=LORA)
    trainer = start_sender(cfg, tmp_path, tiny_model, monkeypatch)
    try:
        asyncio.run(_two_lora_rounds(cfg, trainer))
    finally:
        trainer.kill()
        trainer.wait(timeout=30)
