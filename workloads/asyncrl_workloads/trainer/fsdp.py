"""The trainer's default process group and FSDP2 sharding.

Called by trainer/backend.py (FSDP2Backend) and the trainer entry point. The default group comes from
torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; LOCAL_RANK for the GPU): gloo on
CPU, nccl on GPU. A single process without those variables still gets a world of one, so the same code
path (DTensor parameters, collectives) runs in a plain `asyncrl-trainer` process and under torchrun.
The weight-sync group (weightsync/) is a separate group and never touches this one.

FSDP2 (`torch.distributed.fsdp.fully_shard`) shards every decoder layer, then the root module (embeddings,
final norm, lm head), each with the mixed-precision policy trainer/precision.py chose (None: float32).
The NCCL path is the same code with device "cuda"; it is only exercised on GPUs.

The memory settings (spec.trainer.memory, ``Memory``) are applied here, where the model is wrapped:
activation checkpointing wraps each decoder layer's forward in torch.utils.checkpoint (inside its FSDP
unit: the recompute in backward runs after FSDP's pre-backward all-gather, torchtitan's arrangement),
offload gives every unit torch's CPUOffloadPolicy, and ``token_logprobs`` is a second forward method
of the root unit (torch's register_fsdp_forward_method: the root's parameters, the language-model head
among them, are all-gathered for it and its gradients reduce-scattered as for forward) that applies
the head to the final hidden states in chunks (trainer/chunked.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import socket
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.device_mesh
import torch.distributed.fsdp
import torch.distributed.tensor
import torch.utils.checkpoint

from asyncrl_workloads.trainer import chunked, packing

log = logging.getLogger(__name__)

LOGPROB_METHOD = "asyncrl_token_logprobs"
"""The root unit's second forward method (``token_logprobs``), set on the model by ``shard``."""


@dataclasses.dataclass(frozen=True)
class Memory:
    """spec.trainer.memory (asyncrl_api/roles.py MemorySpec); none of these changes the loss."""

    activation_checkpointing: bool = True
    """Recompute each decoder layer in backward instead of keeping its activations."""
    logprob_chunk_tokens: int | None = None
    """Tokens per language-model-head chunk in ``token_logprobs``; 0: all at once; None: sized for the
    vocabulary (chunked.chunk_tokens)."""
    packing: bool = False
    """One unpadded row per micro-batch, position ids restarting per sequence (backend.py)."""
    offload: bool = False
    """CPUOffloadPolicy on every unit (GPU only: admission refuses it for a CPU trainer)."""


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


GPU_BACKEND = "cpu:gloo,cuda:nccl"
"""The default group's backends on GPUs: NCCL for CUDA tensors, gloo for CPU ones. FSDP2's CPU offload
(spec.trainer.memory.offload) keeps the shards and their gradients on the CPU, so the gradient norm
(clip_grad_norm_) and a weight sync's full_tensor() run collectives on CPU tensors, which an NCCL-only
group refuses ("No backend type associated with device type cpu", pytorch/pytorch#148532). Object
collectives (the step hand-out) then go over gloo too (torch picks the CPU backend for them)."""


def init_world(timeout_s: float = 1800.0) -> World:
    """Join (or create, for a lone process) the default process group."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device, backend = torch.device("cuda", local_rank), GPU_BACKEND
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return World(dist.get_rank(), dist.get_world_size(), local_rank, device)


def shard(
    model: torch.nn.Module,
    world: World,
    mp_policy: torch.distributed.fsdp.MixedPrecisionPolicy | None = None,
    memory: Memory | None = None,
) -> torch.nn.Module:
    """Apply FSDP2 in place: each decoder layer is one unit, the rest of the model is the root unit.

    ``mp_policy``: the parameters (float32) stay the sharded master weights; forward and backward run
    in its param_dtype. None: FSDP2's default, compute in the parameters' own dtype. ``memory``:
    checkpointing and offload as above (None: neither); a causal LM also gets ``token_logprobs``."""
    memory = memory or Memory(activation_checkpointing=False)
    mesh = torch.distributed.device_mesh.init_device_mesh(world.device.type, (world.size,))
    policy = mp_policy or torch.distributed.fsdp.MixedPrecisionPolicy()
    offload: Any = (
        torch.distributed.fsdp.CPUOffloadPolicy()
        if memory.offload
        else torch.distributed.fsdp.OffloadPolicy()
    )
    layers = getattr(getattr(model, "model", model), "layers", [])
    config = getattr(model, "config", None)
    if memory.activation_checkpointing and config is not None:
        config.use_cache = False  # a KV cache filled in forward would be filled again by the recompute
    for layer in layers:
        if memory.activation_checkpointing:
            checkpoint_forward(layer)
        torch.distributed.fsdp.fully_shard(layer, mesh=mesh, mp_policy=policy, offload_policy=offload)
    torch.distributed.fsdp.fully_shard(model, mesh=mesh, mp_policy=policy, offload_policy=offload)
    if getattr(model, "lm_head", None) is not None and getattr(model, "model", None) is not None:
        setattr(model, LOGPROB_METHOD, types.MethodType(_token_logprobs_method(memory), model))
        torch.distributed.fsdp.register_fsdp_forward_method(model, LOGPROB_METHOD)
    return model


def checkpoint_forward(layer: torch.nn.Module) -> None:
    """Run ``layer``'s forward under torch.utils.checkpoint (non-reentrant): forward keeps its inputs
    only, backward recomputes it. Set on the instance, so parameter names and hooks stay as they were."""
    inner = layer.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return inner(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(inner, *args, use_reentrant=False, **kwargs)

    layer.forward = forward


def _token_logprobs_method(memory: Memory) -> Any:
    def method(
        self: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        temperature: float,
        entropy: bool,
        position_ids: torch.Tensor | None = None,
        lengths: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, L-1) logprob of token i+1 at position i, and with ``entropy`` the (B, L-1) entropy,
        from the base model's final hidden states and the head applied chunk by chunk. A packed row
        (B = 1): no attention mask, ``position_ids`` restarting at each sequence, ``lengths`` its
        sequences' lengths (trainer/packing.py: attention per sequence, no (L, L) mask)."""
        row = packing.row_kwargs(lengths, input_ids.device) if lengths else {}
        hidden = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **row,
        )
        states = hidden.last_hidden_state[:, :-1]  # (B, L-1, H)
        softcap = getattr(self.config, "final_logit_softcapping", None)
        return chunked.token_logprobs(
            states,
            self.lm_head,
            input_ids[:, 1:],
            temperature,
            chunked.chunk_tokens(memory.logprob_chunk_tokens, self.config.vocab_size),
            entropy,
            softcap,
        )

    return method


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    temperature: float,
    entropy: bool,
    position_ids: torch.Tensor | None = None,
    lengths: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The model's (B, L-1) token logprobs (and entropy) through its ``token_logprobs`` method."""
    method = getattr(model, LOGPROB_METHOD)
    out: tuple[torch.Tensor, torch.Tensor | None] = method(
        input_ids, attention_mask, temperature, entropy, position_ids, lengths
    )
    return out


def full_tensors(
    model: torch.nn.Module, dtype: torch.dtype | None = None, tied_once: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for every state-dict entry, in a fixed order, Hugging Face names; floating
    point entries cast to ``dtype`` when given (the float32 master weights rounded once, for weight sync).

    ``tied_once``: a parameter registered under two names yields under its first only. Tied input and
    output embeddings are one parameter that transformers' state dict lists twice (``lm_head.weight``
    beside ``model.embed_tokens.weight``); weight sync to CPU rollouts sends it once and their receiver
    hands the head the same tensor (weightsync/tied.py): 0.77 GB, not 1.24, for the 192M Qwen3 of the
    memory benchmark. Every rank skips the same names, so the gathers stay matched.

    Collective: every rank must iterate to the end (each DTensor is all-gathered on demand, so memory
    holds one full tensor at a time).
    """
    for name, value in _payload(model, tied_once):
        if isinstance(value, torch.distributed.tensor.DTensor):
            value = value.full_tensor()
        yield name, value.to(_sent_dtype(value, dtype)).detach()


def full_metas(
    model: torch.nn.Module, dtype: torch.dtype | None = None, tied_once: bool = False
) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """(name, dtype, full shape) of what ``full_tensors`` yields, in its order, without gathering (a
    DTensor knows its global shape): the weight-sync plan, made before the first tensor is gathered so
    rank 0 sends each bucket as it is gathered instead of holding the whole model. Local, not a
    collective."""
    return [
        (name, _sent_dtype(value, dtype), tuple(value.shape)) for name, value in _payload(model, tied_once)
    ]


def _payload(model: torch.nn.Module, tied_once: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """The state-dict entries full_tensors sends, in its order, sharded as they are."""
    aliases = tied_aliases(model) if tied_once else set()
    return ((name, value) for name, value in model.state_dict().items() if name not in aliases)


def _sent_dtype(value: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """``dtype`` for a floating point entry when given, else the entry's own."""
    return dtype if dtype is not None and value.is_floating_point() else value.dtype


def tied_aliases(model: torch.nn.Module) -> set[str]:
    """The names under which a parameter already registered under an earlier name appears again."""
    first: set[int] = set()
    aliases: set[str] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            aliases.add(name)
        first.add(id(param))
    return aliases


def broadcast_object(obj: object, world: World) -> object:
    """Rank 0's `obj` on every rank (other ranks pass anything)."""
    if world.size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_object(obj: object, world: World) -> list[object]:
    """Every rank's `obj`, in rank order, on every rank (a collective: all ranks call it)."""
    if world.size == 1:
        return [obj]
    out: list[object] = [None] * world.size
    dist.all_gather_object(out, obj)
    return out


def shutdown(finished: bool = True, barrier_timeout_s: float = 15.0) -> None:
    """Leave the default group.

    ``finished``: every rank reached this point on the normal path, so the ranks first wait for each
    other (a bounded barrier) and then tear down together. Without it a rank that is done early
    destroys its gloo pairs, and rank 0 the TCPStore it hosts, while a peer is still in its last
    collective or store call. After a failure the barrier is skipped: a dead peer would hold it until
    the timeout. The timeout is short: ranks reach this point seconds apart (rank 0's "stop" ends the
    others' loops), and a pod being deleted has a grace period to finish in.
    """
    if not dist.is_initialized():
        return
    if finished and dist.get_world_size() > 1:
        try:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=barrier_timeout_s))
            else:
                dist.barrier()
        except RuntimeError as exc:  # a peer died on its way out: still leave the group
            log.warning("shutdown: ranks did not meet before leaving (%s)", str(exc)[:200])
    dist.destroy_process_group()
