"""MegatronBackend: the FSDP2 backend's step on a megatron-core GPTModel, tensor parallel over
parallelism.tp ranks and data parallel over the rest; checkpoints in HF layout.

Built by trainer/backend.py's BACKENDS["megatron"] (imported there only for a megatron job); what it
cannot build (an architecture, a tp that does not divide the heads or the ranks) raises
backend.Unsupported, one line in the pod's termination message. It inherits FSDP2Backend's step
unchanged - advantages, mini-batches, length-sorted micro-batches, proximal logprobs, the losses
(loss.policy_objective, the teacher term, the reference's KL), the metrics, skip-on-non-finite, the
warmup schedule - and replaces what touches the model:
  - the forward: model.token_logprobs_entropy (vocabulary-parallel, float32 log_softmax(logits /
    temperature), and the entropy reduced over TP when entropyCoef asks for it), the output layer over
    spec.trainer.memory.logprobChunkTokens tokens at a time; the reference policy
    (spec.trainer.algorithm.kl > 0) is a second GPTModel loaded from the same weights, frozen;
  - activation checkpointing (spec.trainer.memory.activationCheckpointing): megatron's recompute on
    CUDA, torch's checkpoint around each layer on CPU (model.recompute_for); packing is refused at
    admission (asyncrl_api/roles.py), offload is MegatronDDPBackend's (GPU only, as admission requires);
  - the shard of each micro-batch: data-parallel rank dp_rank::dp_size (TP ranks of one replica see the
    same rows), micro-batches sized per data-parallel rank;
  - backward and update: each DP rank's share times dp, gradients averaged over the DP group
    (grads.average_data_parallel), the global norm over all shards clipped (grads.clip_grad_norm), a
    plain torch.optim.AdamW with the job's hyper-parameters. megatron's own DDP and distributed
    optimizer allocate on CUDA (distributed/param_and_grad_buffer.py:806, optimizer/optimizer.py:907),
    so this is the CPU path; on CUDA `create` builds megatron/ddp.py's MegatronDDPBackend, which uses
    them and writes the same checkpoints.
  - full_tensors: model.hf_state (all-gather over TP, convert.to_hf), in HF names as the FSDP2 backend
    yields them (a tied model's matrix once for CPU rollouts), cast to the engines' dtype.
  - state/load_state: the checkpoint in HF layout (weights and AdamW's moments through the same
    conversion), so a resume may change TP and DP and `asyncrl export` reads it as FSDP2's.
Precision: float32 throughout (on CPU precision.choose trains in float32 and its note says why;
spec.model.dtype on GPU is MegatronDDPBackend's, through megatron's Float16Module).
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import safetensors.torch
import torch

from asyncrl_workloads.bus import trajectory as trajectory_mod
from asyncrl_workloads.trainer import backend, chunked, fsdp, precision
from asyncrl_workloads.trainer.algorithms import shaping
from asyncrl_workloads.trainer.megatron import architecture, convert, grads, parallel
from asyncrl_workloads.trainer.megatron import model as megatron_model

log = logging.getLogger(__name__)


def read_architecture(model_path: str, tp: int) -> architecture.Architecture:
    """The architecture config.json describes, checked buildable at tensor-parallel size ``tp``."""
    transformers: Any = importlib.import_module("transformers")  # heavy and untyped: only here
    try:
        arch = architecture.from_hf(transformers.AutoConfig.from_pretrained(model_path))
    except architecture.UnsupportedModel as exc:
        raise backend.Unsupported(f"spec.model.path: {model_path}: {exc} (backend megatron)") from exc
    try:
        arch.check_tp(tp)
    except architecture.UnsupportedModel as exc:
        raise backend.Unsupported(f"spec.trainer.parallelism.tp: {exc}") from exc
    return arch


def read_weights(model_path: str) -> dict[str, torch.Tensor]:
    """The float32 weights of every *.safetensors file of a HF model directory."""
    files = sorted(pathlib.Path(model_path).glob("*.safetensors"))
    if not files:
        raise backend.Unsupported(f"spec.model.path: no *.safetensors weights in {model_path}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update({k: v.float() for k, v in safetensors.torch.load_file(str(f)).items()})
    return weights


class MegatronBackend(backend.FSDP2Backend):
    def __init__(self, settings: backend.TrainSettings, world: fsdp.World) -> None:
        if world.size % settings.tp:
            raise backend.Unsupported(
                f"spec.trainer.parallelism.tp: {settings.tp} does not divide the {world.size} trainer ranks"
            )
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # the pod sets it (render/trainer.py)
        # its own model and optimizer: FSDP2Backend.__init__ is not called
        torch.manual_seed(settings.seed)
        self.settings = settings
        self.world = world
        self.logprob_gap: dict[str, float] = {}
        self.arch = read_architecture(settings.model_path, settings.tp)  # refused before any collective
        model_dtype = precision.config_dtype(settings.model_path)
        self.precision = precision.choose(settings.dtype, world.device.type, model_dtype)
        self.sync_dtype = precision.engine_dtype(settings.dtype, settings.rollout_gpus, model_dtype)
        hf = read_weights(settings.model_path)
        parallel.initialize(tp=settings.tp, seed=settings.seed)
        recompute = (
            megatron_model.recompute_for(world.device) if settings.memory.activation_checkpointing else None
        )
        self.model = megatron_model.build(
            self.arch, settings.tp, self._param_dtype(), recompute=recompute
        ).to(world.device)
        megatron_model.load_hf(self.model, hf, self.arch, settings.tp, parallel.tp_rank())
        self.reference: torch.nn.Module | None = None
        if settings.kl > 0.0:  # the frozen initial model, split over TP like the policy
            self.reference = megatron_model.build(self.arch, settings.tp, self._param_dtype()).to(
                world.device
            )
            megatron_model.load_hf(self.reference, hf, self.arch, settings.tp, parallel.tp_rank())
            self.reference.requires_grad_(False).eval()
        self.kl_control = shaping.AdaptiveKL(settings.kl, settings.kl_target, settings.kl_horizon)
        self.critic = None  # PPO with a critic is fsdp2's (admission refuses name gae with megatron)
        self.lora_dropouts = []  # LoRA is fsdp2's (admission refuses trainer.lora with megatron)
        if settings.critic is not None:
            raise backend.Unsupported(
                "spec.trainer.algorithm.name: gae (a critic) needs trainer.backend fsdp2"
            )
        del hf
        if world.is_main:
            log.info(
                "megatron%s: tp %d x dp %d, computing in %s on float32 master weights%s; syncing %s",
                " (its DDP and distributed optimizer)" if type(self) is not MegatronBackend else "",
                parallel.tp_size(), parallel.dp_size(), self.precision.compute,
                f" ({self.precision.note})" if self.precision.note else "", self.sync_dtype,
            )  # fmt: skip
        self._make_optimizer()  # FSDP2Backend's scaler, AdamW and schedule, over this model

    def _param_dtype(self) -> torch.dtype:
        """The model's parameters: float32 (the CPU path computes in float32, precision.choose)."""
        return torch.float32

    # --- what differs from FSDP2: forward, data-parallel shard, backward, update -----------------

    def _response_logprobs(
        self, trajs: list[trajectory_mod.Trajectory], reference: bool = False, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, R) logprobs of each response token (R = longest response) and, with `entropy`, the
        policy's (B, R) entropy, as FSDP2Backend's; `reference`: under the frozen reference model."""
        module = self.reference if reference else self._forward_module()
        assert module is not None
        seqs = [t.prompt_ids + t.response_ids for t in trajs]
        longest = max(len(s) for s in seqs)
        padded = [s + [0] * (longest - len(s)) for s in seqs]
        input_ids = torch.tensor(padded, device=self.world.device)  # (B, L), right-padded with 0
        token_logp, token_entropy = megatron_model.token_logprobs_entropy(
            module,
            input_ids,
            self.arch.vocab_size,
            self.settings.temperature,
            entropy,
            chunked.chunk_tokens(
                self.settings.memory.logprob_chunk_tokens, self.arch.vocab_size // self.settings.tp
            ),
        )  # (B, L-1) each; right padding never reaches a real token (causal attention)
        if token_entropy is None:
            return backend.response_logprobs(token_logp.float(), trajs), None
        return (
            backend.response_logprobs(token_logp.float(), trajs),
            backend.response_logprobs(token_entropy.float(), trajs),
        )

    def _forward_module(self) -> torch.nn.Module:
        """What the forward calls: the GPTModel here, megatron's DDP wrapper in MegatronDDPBackend."""
        return self.model

    def _data_parallel(self) -> tuple[int, int]:
        """Megatron's DP rank and size: the TP ranks of one replica see the same rows."""
        return parallel.dp_rank(), parallel.dp_size()

    def _backward(self, part: torch.Tensor) -> None:
        # averaging over DP (in _update) turns dp x each rank's share into the global sum
        self.scaler.scale(part * parallel.dp_size()).backward()  # type: ignore[no-untyped-call]

    def _update(self) -> float:
        self.scaler.unscale_(self.optimizer)  # float16's loss scale; a no-op otherwise
        grads.average_data_parallel(self.model)
        norm = grads.clip_grad_norm(self.model, self.settings.grad_clip)  # the same on every rank
        if math.isfinite(norm):  # all ranks skip or all step
            self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    # --- weights and state ----------------------------------------------------------------------

    def _hf_weights(self) -> dict[str, torch.Tensor]:
        """hf_state with the names transformers' state dict has: a tied model's matrix named twice
        (model.embed_tokens and lm_head), as FSDP2's state dict has it and trainer/export.py expects."""
        return self._named_like_transformers(megatron_model.hf_state(self.model, self.arch))

    def _named_like_transformers(self, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.arch.tied_embeddings:
            hf["lm_head.weight"] = hf["model.embed_tokens.weight"]
        return hf

    def _gather(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This TP rank's tensors under GPTModel names -> the whole set in HF layout (collective)."""
        return megatron_model.gather_hf({n: t.detach() for n, t in local.items()}, self.arch)

    def _load_weights(self, hf: dict[str, torch.Tensor]) -> None:
        megatron_model.load_hf(self.model, hf, self.arch, self.settings.tp, parallel.tp_rank())

    def full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective over the TP group: every rank gathers the whole model a part at a time (hf_parts:
        the embedding and head, then each layer), so it holds one part in HF layout. A tied model's
        matrix once, as model.embed_tokens.weight, where settings.sync_tied_once (as FSDP2's backend)."""
        for part in megatron_model.hf_parts(self.model, self.arch):
            for name, value in self._sync_names(part).items():
                yield name, value.to(self.sync_dtype).detach()

    def sync_metas(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]] | None:
        """full_tensors' names and shapes from the same parts on the meta device: no gather."""
        return [
            (name, self.sync_dtype, tuple(value.shape))
            for part in megatron_model.hf_parts(self.model, self.arch, gather=False)
            for name, value in self._sync_names(part).items()
        ]

    def _sync_names(self, part: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A part of the sync payload; a tied model's head named beside its embedding unless sent once."""
        if not self.settings.sync_tied_once and "model.embed_tokens.weight" in part:
            return self._named_like_transformers(part)
        return part

    def state(self) -> dict[str, Any]:
        """The checkpoint in HF layout, independent of TP and DP (megatron's dist_checkpointing needs CUDA
        in 0.16.1, docs/megatron.md): the weights under transformers' names (what trainer/export.py
        reads), AdamW's moments gathered and converted the
        same way (zeros before the first update, which AdamW treats as fresh), its step count and the
        schedule. Every rank holds the same tensors; torch.distributed.checkpoint writes them once.
        Collective over the TP group."""
        params = dict(self.model.named_parameters())
        moments: dict[str, Any] = {}
        for key in _MOMENTS:
            local = {
                n: self.optimizer.state.get(p, {}).get(key, torch.zeros_like(p)) for n, p in params.items()
            }
            moments[key] = self._gather(local)
        first = self.optimizer.state.get(next(iter(params.values())), {})
        moments["step"] = first.get("step", torch.zeros(())).detach().clone().float()
        state = {
            "model": self._hf_weights(),
            "optim": moments,
            "scheduler": self.scheduler.state_dict(),
            "algorithm": self.algorithm_state(),
        }
        if self.precision.loss_scaling:  # float16's loss scale, as FSDP2Backend keeps it
            state["scaler"] = self.scaler.state_dict()
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        """Apply a state() loaded from a checkpoint, whatever TP and DP wrote it."""
        tp, rank = self.settings.tp, parallel.tp_rank()
        self._load_weights(state["model"])
        optim = state["optim"]
        local = {key: convert.to_megatron(optim[key], self.arch, tp, rank) for key in _MOMENTS}
        for name, p in self.model.named_parameters():
            self.optimizer.state[p] = {
                "step": optim["step"].detach().clone().float(),
                **{key: local[key][name].to(p.device).clone() for key in _MOMENTS},
            }
        self._load_schedule(state["scheduler"])
        if "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        self.load_algorithm_state(state)

    def _load_schedule(self, saved: dict[str, Any]) -> None:
        """The schedule's position, and the learning rate it had set: LambdaLR.load_state_dict leaves
        the optimizer at the rate of step 0 until its next step(), which during warmup is the wrong rate
        for the first step after a resume (FSDP2's optimizer state carries its rate instead)."""
        self.scheduler.load_state_dict(saved)
        for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr(), strict=True):
            group["lr"] = lr


def create(settings: backend.TrainSettings, world: fsdp.World) -> MegatronBackend:
    """BACKENDS["megatron"]: on CUDA megatron's own DDP and distributed optimizer (megatron/ddp.py, which
    needs CUDA), elsewhere this module's plain-torch path. Both write the same checkpoints."""
    if world.device.type == "cuda":
        from asyncrl_workloads.trainer.megatron import ddp  # noqa: PLC0415  # imports this module

        return ddp.MegatronDDPBackend(settings, world)
    return MegatronBackend(settings, world)


_MOMENTS = ("exp_avg", "exp_avg_sq")
"""AdamW's per-parameter state tensors, shaped like their parameters (torch.optim.AdamW, amsgrad off)."""
