"""megatron-core's model-parallel state for this process: groups over the default process group, and seeds.

Called by the megatron backend (next) and the data-plane tests, after trainer/fsdp.py's `init_world`
joined the default group (gloo on CPU, nccl on GPU). megatron keeps its groups and RNG tracker in module
globals (megatron.core.parallel_state, tensor_parallel.random): one model-parallel layout per process.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def quiet_imports() -> Iterator[None]:
    """megatron-core warns at import that Transformer Engine and Apex are absent and it falls back to
    torch (its optimizer, norms, multi-tensor ops): expected here, and an error under pytest's
    warnings-as-errors. Only those warnings are silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", r"(Transformer Engine and )?Apex (is|are) not installed", UserWarning
        )
        yield


with quiet_imports():
    from megatron.core import parallel_state, tensor_parallel


def initialize(tp: int = 1, pp: int = 1, seed: int = 0) -> None:
    """Tensor/pipeline groups over the default group (data parallel over the rest), then the seeds.

    On CPU the RNG tracker is megatron's inference tracker, whose add() and fork() do nothing: the
    training tracker's add() reads and sets the CUDA generator (tensor_parallel/random.py:235,
    `torch.cuda.get_rng_state()`), which fails without CUDA. Nothing on the CPU path draws from the
    tracker: dropout is off (model.config_for) and weights come from the HF checkpoint."""
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    tensor_parallel.model_parallel_cuda_manual_seed(seed, inference_rng_tracker=not torch.cuda.is_available())


def tp_rank() -> int:
    return int(parallel_state.get_tensor_model_parallel_rank())


def tp_size() -> int:
    return int(parallel_state.get_tensor_model_parallel_world_size())


def tp_group() -> torch.distributed.ProcessGroup:
    group: torch.distributed.ProcessGroup = parallel_state.get_tensor_model_parallel_group()
    return group


def dp_rank() -> int:
    return int(parallel_state.get_data_parallel_rank())


def dp_size() -> int:
    return int(parallel_state.get_data_parallel_world_size())


def dp_group() -> torch.distributed.ProcessGroup:
    group: torch.distributed.ProcessGroup = parallel_state.get_data_parallel_group()
    return group


def model_parallel_group() -> torch.distributed.ProcessGroup:
    """The ranks that together hold one copy of the model (tp x pp)."""
    group: torch.distributed.ProcessGroup = parallel_state.get_model_parallel_group()
    return group


def destroy() -> None:
    parallel_state.destroy_model_parallel()
