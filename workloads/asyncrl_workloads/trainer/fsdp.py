"""The trainer's default process group and FSDP2 sharding.

Called by trainer/backend.py (FSDP2Backend) and the trainer entry point. The default group comes from
torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; LOCAL_RANK for the GPU): gloo on
CPU, nccl on GPU. A single process without those variables still gets a world of one, so the same code
path (DTensor parameters, collectives) runs in a plain `asyncrl-trainer` process and under torchrun.
The weight-sync group (weightsync/) is a separate group and never touches this one.

FSDP2 (`torch.distributed.fsdp.fully_shard`) shards every decoder layer, then the root module (embeddings,
final norm, lm head). The NCCL path is the same code with device "cuda"; it is only exercised on GPUs.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.distributed.device_mesh
import torch.distributed.fsdp
import torch.distributed.tensor


@dataclasses.dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def init_world(timeout_s: float = 1800.0) -> World:
    """Join (or create, for a lone process) the default process group."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return World(dist.get_rank(), dist.get_world_size(), local_rank, device)


def shard(model: torch.nn.Module, world: World) -> torch.nn.Module:
    """Apply FSDP2 in place: each decoder layer is one unit, the rest of the model is the root unit."""
    mesh = torch.distributed.device_mesh.init_device_mesh(world.device.type, (world.size,))
    layers = getattr(getattr(model, "model", model), "layers", [])
    for layer in layers:
        torch.distributed.fsdp.fully_shard(layer, mesh=mesh)
    torch.distributed.fsdp.fully_shard(model, mesh=mesh)
    return model


def full_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for every state-dict entry, in a fixed order, Hugging Face names.

    Collective: every rank must iterate to the end (each DTensor is all-gathered on demand, so memory
    holds one full tensor at a time).
    """
    for name, value in model.state_dict().items():
        if isinstance(value, torch.distributed.tensor.DTensor):
            value = value.full_tensor()
        yield name, value.detach()


def broadcast_object(obj: object, world: World) -> object:
    """Rank 0's `obj` on every rank (other ranks pass anything)."""
    if world.size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
