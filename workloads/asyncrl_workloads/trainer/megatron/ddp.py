"""MegatronDDPBackend: MegatronBackend on megatron-core's own DistributedDataParallel and distributed
optimizer (the GPU path; trainer/megatron/backend.py's `create` picks it when the world is on CUDA).

What it changes from MegatronBackend (whose step, forward, shards and weight sync it keeps):
  - the model's parameters are in spec.model.dtype (bfloat16/float16 wrapped in megatron's
    Float16Module; float32 as is), inside megatron's DistributedDataParallel: gradients accumulate in its
    float32 grad buffer (grad_reduce_in_fp32) across micro-batches and are reduce-scattered over the DP
    group, averaged, in finish_grad_sync (no overlap: one synchronous collective per update);
  - get_megatron_optimizer with use_distributed_optimizer: float32 main weights and Adam's moments sharded
    over the DP ranks (the ZeRO-1 layout), the updated shards all-gathered back into the model after each
    step. Adam's hyper-parameters are the FSDP2 backend's torch.optim.AdamW (lr, weight decay on every
    parameter - config_overrides={} turns off megatron's default of none on biases and norms -, betas
    0.9/0.999, eps 1e-8); the learning rate is FSDP2Backend's warmup schedule over the inner optimizer;
  - an update: megatron's prepare_grads (float16: unscale and its dynamic loss scale, which backs off on
    inf/nan), its global grad norm (each shard and each TP-replicated parameter counted once), and - as
    FSDP2Backend's rule - a non-finite norm skips the update on every rank; otherwise megatron's clip
    (clip_grad_by_total_norm_fp32: max_norm / (norm + 1e-6), as torch's) and step_with_ready_grads;
  - the checkpoint is MegatronBackend's, in HF layout: each rank's shard of the float32 main weights and
    of both moments put back in its place in a zeroed tensor per parameter and summed over the DP group,
    then gathered over TP and converted (megatron_model.gather_hf); loading slices them again. So a
    checkpoint moves between this path and the CPU path, and between TP/DP sizes, both ways.
    megatron's own dist_checkpointing is the way for models one node cannot gather (docs/megatron.md).
    With spec.trainer.memory.offload a checkpoint is written but resuming from it is refused (load_state
    says why).

It reads two of the DistributedOptimizer's attributes that are not in its public API (megatron-core
0.16.1, optimizer/distrib_optimizer.py): `gbuf_ranges` (which slice of which parameter this DP rank owns,
:551) and `model_param_group_index_map` (the main-weight shard that slice is, :587); megatron's own
sharded_param_state_fs_model_space (:1689) walks the same two.

Only on CUDA in production: megatron allocates these on `torch.cuda.current_device()` and `"cuda"`
(distributed/param_and_grad_buffer.py:806, optimizer/optimizer.py:473-485, optimizer/clip_grads.py:90).
tests/dataplane/test_megatron.py rehearses this module on CPU with those allocations redirected to the
CPU in the test's processes only (tools/asyncrl_testing/cuda_on_cpu.py), and runs it unredirected on a
GPU (`pytest -m gpu tests/dataplane/test_megatron.py`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from asyncrl_workloads.trainer import backend
from asyncrl_workloads.trainer.megatron import backend as megatron_backend
from asyncrl_workloads.trainer.megatron import convert, parallel
from asyncrl_workloads.trainer.megatron import model as megatron_model

with parallel.quiet_imports():
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer
    from megatron.core.transformer.module import Float16Module

_MOMENTS = megatron_backend._MOMENTS


class MegatronDDPBackend(megatron_backend.MegatronBackend):
    def _param_dtype(self) -> torch.dtype:
        """spec.model.dtype's compute dtype: megatron keeps the float32 copy in its optimizer."""
        return self.precision.compute

    def _make_optimizer(self) -> None:
        s = self.settings
        config: Any = self.model.config  # the GPTModel's TransformerConfig
        module = Float16Module(config, self.model) if config.bf16 or config.fp16 else self.model
        self.ddp = DistributedDataParallel(
            config=config,
            ddp_config=DistributedDataParallelConfig(
                grad_reduce_in_fp32=True, use_distributed_optimizer=True
            ),
            module=module,
        )
        opt_config = OptimizerConfig(
            optimizer="adam",
            lr=s.lr,
            weight_decay=s.weight_decay,
            adam_beta1=0.9,
            adam_beta2=0.999,
            adam_eps=1e-8,  # torch.optim.AdamW's defaults, as FSDP2Backend's
            clip_grad=s.grad_clip,
            bf16=config.bf16,
            fp16=config.fp16,
            params_dtype=config.params_dtype,
            use_distributed_optimizer=True,
            # float16's dynamic loss scale as FSDP2Backend's ShardedGradScaler (torch's defaults): from
            # 2**16, halved at each overflow, doubled after 2000 clean updates. megatron's defaults
            # (2**32, hysteresis 2) skip the first ~32 updates of every job while the scale comes down.
            initial_loss_scale=2.0**16,
            loss_scale_window=2000,
            hysteresis=1,
            # spec.trainer.memory.offload: the distributed optimizer's float32 shards and Adam's moments
            # live and step on the CPU (megatron's HybridDeviceOptimizer, all of it offloaded)
            optimizer_cpu_offload=s.memory.offload,
            optimizer_offload_fraction=1.0 if s.memory.offload else 0.0,
        )
        chained = get_megatron_optimizer(opt_config, [self.ddp], config_overrides={})
        optimizers = getattr(chained, "chained_optimizers", [chained])
        if len(optimizers) != 1:  # a dense model has one (experts would add a second: ep is refused)
            raise backend.Unsupported(f"megatron built {len(optimizers)} optimizers; expected 1")
        self.dist_optimizer: Any = optimizers[0]
        self.optimizer = self.dist_optimizer.optimizer  # the inner torch (or TE/Apex) Adam over the shards
        self.scheduler = self._schedule(self.optimizer)

    def _forward_module(self) -> torch.nn.Module:
        module: torch.nn.Module = self.ddp
        return module

    def _backward(self, part: torch.Tensor) -> None:
        # the DDP averages over DP in finish_grad_sync: dp x each rank's share is the global sum, as on CPU;
        # float16 multiplies by megatron's loss scale (1 otherwise), prepare_grads divides it out
        scale = self.dist_optimizer.get_loss_scale().reshape(())
        (part * parallel.dp_size() * scale).backward()

    def _update(self) -> float:
        self.ddp.finish_grad_sync()  # reduce-scatter: this rank's shard of the averaged gradient
        found_inf = self.dist_optimizer.prepare_grads()  # to the float32 shards; float16: unscale, check
        norm = math.inf if found_inf else float(self.dist_optimizer.get_grad_norm())
        if math.isfinite(norm):  # the same global norm on every rank: all skip or all step
            clip_grad_by_total_norm_fp32(
                self.dist_optimizer.get_parameters(), max_norm=self.settings.grad_clip, total_norm=norm
            )
            self.dist_optimizer.step_with_ready_grads()  # Adam on the shards, all-gathered into the model
        self.ddp.zero_grad_buffer()
        self.dist_optimizer.zero_grad()
        return norm

    # --- checkpoint: the distributed optimizer's shards in HF layout ---------------------------

    def _shards(self) -> dict[int, tuple[Any, dict[str, Any]]]:
        """id(model parameter) -> (the slice of its flattened values this DP rank owns, the optimizer
        state of that slice: its float32 main weight under "param", Adam's moments once it has stepped)."""
        owned: dict[int, tuple[Any, dict[str, Any]]] = {}
        for per_dtype in self.dist_optimizer.gbuf_ranges:  # one per grad buffer
            for buckets in per_dtype.values():
                for bucket in buckets:
                    for param, ranges in bucket["param_map"].items():
                        index, order = self.dist_optimizer.model_param_group_index_map[param]
                        main = self.optimizer.param_groups[index]["params"][order]
                        owned[id(param)] = (ranges["param"], {"param": main, **self.optimizer.state[main]})
        return owned

    def _adam_step(self) -> float:
        """Adam's step count: per parameter in torch's AdamW, per group in TE's and Apex's FusedAdam."""
        steps = [float(st["step"]) for st in self.optimizer.state.values() if "step" in st]
        steps += [float(g["step"]) for g in self.optimizer.param_groups if "step" in g]
        local = torch.tensor(max(steps, default=0.0), device=self.world.device)
        torch.distributed.all_reduce(local, torch.distributed.ReduceOp.MAX)  # a rank may own no slice
        return float(local)

    def state(self) -> dict[str, Any]:
        """MegatronBackend's checkpoint (HF layout) from the distributed optimizer's shards. Collective
        over the DP group (a sum per tensor) and the TP group (gather_hf)."""
        owned = self._shards()
        full: dict[str, dict[str, torch.Tensor]] = {key: {} for key in ("param", *_MOMENTS)}
        for name, p in self.model.named_parameters():
            piece, tensors = owned.get(id(p), (None, {}))
            for key, into in full.items():
                flat = torch.zeros(p.numel(), dtype=torch.float32, device=p.device)
                if piece is not None and key in tensors:
                    flat[piece.start : piece.end] = tensors[key].detach().float()
                torch.distributed.all_reduce(flat, group=self.dist_optimizer.data_parallel_group)
                into[name] = flat.view(p.shape)
        weights = self._named_like_transformers(self._gather(full["param"]))
        optim: dict[str, Any] = {key: self._gather(full[key]) for key in _MOMENTS}
        optim["step"] = torch.tensor(self._adam_step())
        state = {
            "model": weights,
            "optim": optim,
            "scheduler": self.scheduler.state_dict(),
            "algorithm": self.algorithm_state(),
        }
        if self.dist_optimizer.grad_scaler is not None:  # float16's dynamic loss scale (megatron's)
            state["megatron_grad_scaler"] = self.dist_optimizer.grad_scaler.state_dict()
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        """A checkpoint of either megatron path, whatever TP and DP wrote it: the model's weights (in
        its dtype), then each owned slice of the float32 main weights and of the moments, and Adam's
        step. An FSDP2 float16 loss scale ("scaler") is another scaler's: megatron's starts afresh.

        Not with spec.trainer.memory.offload: megatron's HybridDeviceOptimizer steps CPU copies of the
        main weights with CPU AdamWs that hold the moments, none of which this writes (it writes the GPU
        main weights and HybridDeviceOptimizer's own state, which its next step overwrites): the resumed
        job would train on from the initial weights with fresh moments. Refused instead of that; the
        checkpoint is in HF layout, so the job resumes with offload off."""
        if isinstance(self.optimizer, HybridDeviceOptimizer):
            raise backend.Unsupported(
                "spec.trainer.memory.offload: a megatron job with offload cannot resume from its checkpoint"
                " yet (the CPU-offloaded optimizer's weights and moments are not reloaded); set offload"
                " false to resume from it"
            )
        tp, rank = self.settings.tp, parallel.tp_rank()
        local = {"param": convert.to_megatron(state["model"], self.arch, tp, rank)}
        megatron_model.load_local(self.model, local["param"])  # the model's own (compute-dtype) copy
        local.update({key: convert.to_megatron(state["optim"][key], self.arch, tp, rank) for key in _MOMENTS})
        step = float(state["optim"]["step"])
        per_group = not isinstance(self.optimizer, torch.optim.Adam | torch.optim.AdamW)
        owned = self._shards()
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if id(p) not in owned:
                    continue
                piece, tensors = owned[id(p)]
                main = tensors["param"]
                main.copy_(local["param"][name].flatten()[piece.start : piece.end])
                slot = self.optimizer.state[main]
                for key in _MOMENTS:
                    slot[key] = local[key][name].flatten()[piece.start : piece.end].to(main).clone()
                if not per_group:
                    slot["step"] = torch.tensor(step)
        if per_group:
            for group in self.optimizer.param_groups:
                group["step"] = int(step)
        self._load_schedule(state["scheduler"])
        self.load_algorithm_state(state)
        if "megatron_grad_scaler" in state and self.dist_optimizer.grad_scaler is not None:
            self.dist_optimizer.grad_scaler.load_state_dict(state["megatron_grad_scaler"])
