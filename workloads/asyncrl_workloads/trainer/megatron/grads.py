"""Gradients of a megatron GPTModel on the plain-torch path: data-parallel averaging and the global norm.

Called by the megatron backend (next) between backward and the optimizer step, on CPU, where megatron's
own DistributedDataParallel and grad-norm allocate on CUDA (distributed/param_and_grad_buffer.py:806,
optimizer/clip_grads.py:90); on GPU megatron's DDP and optimizer do both. One all-reduce per parameter:
fine for the models CPU runs, not meant for large ones.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from asyncrl_workloads.trainer.megatron import parallel


def average_data_parallel(model: torch.nn.Module) -> None:
    """Every gradient averaged over the data-parallel group (the ranks holding the same shard)."""
    if parallel.dp_size() == 1:
        return
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=parallel.dp_group())
            p.grad /= parallel.dp_size()


def _counted_once(p: torch.nn.Parameter) -> bool:
    """A TP-sharded parameter (megatron marks it `tensor_model_parallel`) is counted on every TP rank, its
    shards being disjoint; a replicated one (the norms) only on TP rank 0, as megatron's
    param_is_not_tensor_parallel_duplicate (tensor_parallel/layers.py:89)."""
    return bool(getattr(p, "tensor_model_parallel", False)) or parallel.tp_rank() == 0


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """The L2 norm of the whole model's gradient (all shards, each parameter once), and the gradients
    scaled by max_norm / (norm + 1e-6) when that is below 1, as torch.nn.utils.clip_grad_norm_ does on an
    unsharded model. A non-finite norm is returned with the gradients left alone: the caller skips the
    step."""
    grads = [p.grad for p in model.parameters() if p.grad is not None and _counted_once(p)]
    squares = (
        torch.stack([g.detach().float().pow(2).sum() for g in grads]).sum() if grads else torch.zeros(())
    )
    dist.all_reduce(squares, group=parallel.model_parallel_group())
    norm = float(squares.sqrt())
    scale = max_norm / (norm + 1e-6)
    if math.isfinite(norm) and scale < 1.0:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(scale)
    return norm
