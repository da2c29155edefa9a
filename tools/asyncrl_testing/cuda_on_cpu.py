"""A CPU rehearsal of megatron-core's CUDA-only training path, for tests only (never imported by asyncrl).

megatron's DistributedDataParallel and distributed optimizer (the trainer's GPU path,
workloads/asyncrl_workloads/trainer/megatron/ddp.py) allocate their buffers and flags on
`torch.cuda.current_device()` or `device="cuda"` and check `tensor.type() == "torch.cuda.FloatTensor"`
(megatron-core 0.16.1: distributed/param_and_grad_buffer.py:806, optimizer/optimizer.py:473-485,
optimizer/distrib_optimizer.py:431, optimizer/clip_grads.py:90/167). Their arithmetic - the grad buffer,
the reduce-scatter over the DP group, the sharded float32 main weights, Adam on the shards, the grad norm,
the clip, the all-gather back - is device-independent. Inside `redirect()`:
  - a TorchFunctionMode rewrites every `device=` that names CUDA to the CPU, and `.cuda()` / `.to("cuda")`
    to no-ops, for each torch call in this thread;
  - `tensor.type()` answers with the CUDA name of the CPU type ("torch.FloatTensor" ->
    "torch.cuda.FloatTensor"), so megatron's type checks pass on CPU tensors of the same dtype;
  - `torch.cuda.current_device()` returns "cpu".
No megatron module is changed; what runs is megatron's own code, with its tensors placed on the CPU. It
proves the wiring (which megatron calls, in which order, the checkpoint's shard arithmetic) and the
numbers (against the FSDP2 backend's step), not CUDA's behaviour (streams, NCCL, kernels): that is the
gpu-marked test's (`pytest -m gpu tests/dataplane/test_megatron.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


def _cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.startswith("cuda")


class _CudaOnCpu(TorchFunctionMode):
    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        if _cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to and len(args) > 1 and _cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        out = func(*args, **kwargs)
        if func is torch.Tensor.type and len(args) == 1 and not kwargs and isinstance(out, str):
            return out.replace("torch.", "torch.cuda.", 1)
        return out


@contextlib.contextmanager
def redirect() -> Iterator[None]:
    saved = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    try:
        with _CudaOnCpu():
            yield
    finally:
        torch.cuda.current_device = saved


@contextlib.contextmanager
def rng_on_cpu() -> Iterator[None]:
    """megatron's activation recompute (tensor_parallel.CheckpointFunction) saves and restores the CUDA
    RNG state with the CPU one (random.py `_get_all_rng_states`); without CUDA there is none. Inside,
    the CUDA state is the CPU generator's and setting it does nothing (dropout is off on this path, so
    no RNG is drawn between the two). For the CPU proof that recompute keeps the gradients only: the
    trainer turns recompute on for megatron on GPU only."""
    from megatron.core.tensor_parallel import random as megatron_random

    saved = megatron_random._get_cuda_rng_state, megatron_random._set_cuda_rng_state
    megatron_random._get_cuda_rng_state = lambda *_, **__: torch.get_rng_state()
    megatron_random._set_cuda_rng_state = lambda *_, **__: None
    try:
        yield
    finally:
        megatron_random._get_cuda_rng_state, megatron_random._set_cuda_rng_state = saved
