"""spec.model.dtype on a real GPU: the FSDP2 backend computes in bf16/fp16 over float32 shards.

Marked gpu and skipped without CUDA. On a GPU machine, one command:

    pytest -m gpu tests/dataplane/test_trainer_gpu.py

A one-rank NCCL world in this process, the tiny model (tests/dataplane/conftest.py), one training step
of the real backend. The choice itself and FSDP2's policy on CPU are tests/unit/test_trainer_precision.py.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.tensor
from asyncrl_workloads.bus import trajectory
from asyncrl_workloads.trainer import backend, fsdp

pytestmark = [
    pytest.mark.dataplane,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture
def world() -> Iterator[fsdp.World]:
    torch.cuda.set_device(0)
    store = dist.HashStore()  # type: ignore[attr-defined]
    dist.init_process_group(fsdp.GPU_BACKEND, store=store, rank=0, world_size=1)  # as the trainer's
    try:
        yield fsdp.World(rank=0, size=1, local_rank=0, device=torch.device("cuda", 0))
    finally:
        dist.destroy_process_group()


def batch() -> list[trajectory.Trajectory]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for s in range(4):
        n = 3 + s
        out.append(
            trajectory.Trajectory(
                id=f"t{s}",
                job="j",
                replica=0,
                group_id="g",
                group_size=4,
                sample_index=s,
                prompt_ids=[1, *torch.randint(4, 90, (4,), generator=gen).tolist()],
                response_ids=torch.randint(4, 90, (n,), generator=gen).tolist(),
                behaviour_logprobs=(-4.0 - torch.rand(n, generator=gen)).tolist(),
                versions=[0] * n,
                mask=[1] * n,
                reward=float(s % 2),
                created_at=0.0,
            )  # fmt: skip
        )
    return out


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
# float16's ShardedGradScaler: torch's DTensor dispatch warns about the scaler's one-element found-inf tensor
@pytest.mark.filterwarnings("ignore:Found a non-scalar tensor with numel=1:UserWarning")
def test_the_backend_computes_in_model_dtype_over_float32_shards(
    tiny_model: pathlib.Path, world: fsdp.World, dtype: str
) -> None:
    compute = getattr(torch, dtype)
    settings = backend.TrainSettings(model_path=str(tiny_model), lr=1e-2, dtype=dtype, rollout_gpus=1)
    b = backend.FSDP2Backend(settings, world)
    assert b.precision.compute == compute and b.precision.loss_scaling is (dtype == "float16")
    seen: list[torch.dtype] = []
    model: Any = b.model
    model.model.layers[0].register_forward_pre_hook(
        lambda mod, args: seen.append(next(mod.parameters()).dtype)
    )
    before = {name: t.float().clone() for name, t in b.full_tensors()}

    for _ in range(8):  # float16: the loss scale starts at 2**16 and halves on each overflowing step
        metrics = b.step(batch())
        if metrics["skipped_updates"] == 0.0:
            break

    assert seen and set(seen) == {compute}  # the all-gathered parameters of every forward
    for p in b.model.parameters():  # master weights: float32 DTensor shards on the GPU
        assert isinstance(p, torch.distributed.tensor.DTensor)
        assert (p.dtype, p.device.type) == (torch.float32, "cuda")
    assert math.isfinite(metrics["grad_norm"]) and metrics["skipped_updates"] == 0.0  # it updated
    sent = dict(b.full_tensors())  # weight sync: the engine's dtype (model.dtype on GPU rollouts)
    assert {t.dtype for t in sent.values()} == {compute}
    assert max(float((sent[k].float() - before[k]).abs().max()) for k in before) > 1e-3  # it trained
    assert b.logprob_gap  # the trainer-vs-engine logprob comparison ran on the bf16/fp16 forward
    assert all(math.isfinite(v) for v in b.logprob_gap.values())


def test_cpu_offload_takes_the_same_step_with_the_shards_on_the_cpu(
    tiny_model: pathlib.Path, world: fsdp.World
) -> None:
    # spec.trainer.memory.offload on fsdp2: torch's CPUOffloadPolicy on every unit
    after = {}
    for offload in (False, True):
        memory = fsdp.Memory(offload=offload)
        settings = backend.TrainSettings(model_path=str(tiny_model), lr=1e-2, rollout_gpus=1, memory=memory)
        b = backend.FSDP2Backend(settings, world)
        metrics = b.step(batch())
        assert math.isfinite(metrics["grad_norm"]) and metrics["skipped_updates"] == 0.0
        device = "cpu" if offload else "cuda"
        assert {p.device.type for p in b.model.parameters()} == {device}  # the float32 master shards
        after[offload] = {name: t.float().cpu() for name, t in b.full_tensors()}
    for name, tensor in after[False].items():
        torch.testing.assert_close(after[True][name], tensor, rtol=1e-4, atol=1e-5, msg=name)
