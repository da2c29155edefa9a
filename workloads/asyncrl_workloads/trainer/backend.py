"""Trainer backends: the abstract interface the loop drives, FSDP2, and the map from spec.trainer.backend.

Called by trainer/loop.py (step, full_tensors) and trainer/checkpoint.py (state). Every rank holds the
same list of trajectories for a step; each rank trains its slice (rank::world) of every mini-batch, and
FSDP2 averages gradients across ranks. A rank whose slice is empty trains a copy of another sample with
an all-zero mask, so every rank makes the same collective calls.

One step (as in PPO's "old policy" scheme; the math is trainer/algorithms/, composed by trainer/loss.py):
  1. with spec.trainer.algorithm.kl > 0, the reference policy's logprobs (a frozen copy of the initial
     model, sharded like the policy - with spec.trainer.lora the policy under peft's disable_adapter(),
     no copy; no grad): per micro-batch beside the policy's forward when the KL
     is in the loss, or over the whole step first (gathered from all ranks) when it is in the reward;
  2. advantages over the whole step (trainer/advantage.py: overlong shaping, KL in the reward, the
     estimator - for name gae over the critic's values before the step, computed like the reference's
     logprobs in the reward -, batch normalisation);
  3. proximal logprobs = the current policy before any update: the first mini-batch's own forward,
     detached (it trains on that policy), and one no-grad forward for each later mini-batch (none for
     correction none) - so the usual single update per step costs one forward, not two;
  4. for each of `updates` mini-batches: forward, loss.policy_objective and backward (and, for PPO with
     a critic, the critic's clipped value loss toward the step's returns) over its length-sorted
     micro-batches (``micro_batches``: gradients accumulate), clip the gradient norm,
     optimizer step - skipped (and counted) when the norm is not finite, so one bad batch cannot poison
     the weights every rollout then receives.
With spec.teacher each micro-batch's loss also gets loss.teacher_kl_loss on the teacher logprobs the
batch carries (rank 0 fetched them, trainer/teacher.py); its token-weighted mean is `teacher_kl`.
Log-probabilities come from transformers' LlamaForCausalLM (any AutoModelForCausalLM),
log_softmax(logits / temperature) in float32, matching what the rollout engine sampled from; the entropy
(entropyCoef > 0) from the same logits. The logits are made from the final hidden states a chunk of
spec.trainer.memory.logprobChunkTokens tokens at a time (fsdp.token_logprobs, trainer/chunked.py), and
the memory settings (checkpointing, offload) are applied where the model is sharded (fsdp.shard).
The model runs in spec.model.dtype on GPU over float32 master weights, in float32 on CPU
(trainer/precision.py); float16 gradients get dynamic loss scaling.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed.fsdp.sharded_grad_scaler

from asyncrl_workloads.bus import trajectory as trajectory_mod
from asyncrl_workloads.trainer import advantage, fsdp, loss, packing, precision
from asyncrl_workloads.trainer import lora as lora_mod
from asyncrl_workloads.trainer.algorithms import aggregation, regularizers, shaping
from asyncrl_workloads.trainer.algorithms import value as value_mod

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CriticSettings:
    path: str
    """Where the critic's weights start (spec critic.path or spec.model.path); its value head is new."""
    lr: float = 1e-5
    value_clip: float = 0.5


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    model_path: str
    advantage: advantage.AdvantageSettings = dataclasses.field(default_factory=advantage.AdvantageSettings)
    """How rewards become advantages (spec.trainer.algorithm: estimator, normalisation, shaping)."""
    objective: loss.Objective = dataclasses.field(default_factory=loss.Objective)
    """The micro-batch loss (spec.trainer.algorithm: policy loss, aggregation, correction, KL, entropy)."""
    kl: float = 0.0
    """spec.trainer.algorithm.kl: > 0 builds the reference policy (in the loss or the reward)."""
    kl_target: float | None = None
    """The adaptive reward-KL controller's target (None: a fixed coefficient)."""
    kl_horizon: int = 10000
    critic: CriticSettings | None = None
    """spec.trainer.algorithm.critic with name gae: the value model PPO trains beside the policy."""
    loss_scale_factor: float = 1.0
    """seq-mean-token-sum-norm's divisor (spec lossScaleFactor, default rollout.sampling.maxTokens)."""
    lr: float = 1e-6
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    warmup_steps: int = 0
    updates_per_step: int = 1
    """Optimizer updates per step: batch.miniBatches * async.requireBatches."""
    micro_batch_tokens: int = 8192
    """Padded tokens per rank in one forward/backward (batch.microBatchTokens): each mini-batch is
    split into length-sorted micro-batches of at most this size, gradients accumulated."""
    temperature: float = 1.0
    seed: int = 0
    teacher_kl_coef: float | None = None
    """spec.teacher.klCoef; None when the job has no teacher (then no distillation term)."""
    dtype: str = "float32"
    """spec.model.dtype: what the model computes in on GPU (precision.choose; float32 on CPU)."""
    tp: int = 1
    """spec.trainer.parallelism.tp: tensor-parallel size (megatron only; fsdp2 admits 1)."""
    rollout_gpus: int = 0
    """spec.rollout.gpusPerReplica: 0 means CPU engines, which hold float32 weights; weight sync sends
    the engines' dtype (precision.engine_dtype)."""
    memory: fsdp.Memory = dataclasses.field(default_factory=fsdp.Memory)
    """spec.trainer.memory: activation checkpointing, chunked log-probabilities, offload."""
    lora: lora_mod.LoraSettings | None = None
    """spec.trainer.lora: train peft adapters only (trainer/lora.py); None: the whole policy."""

    @property
    def sync_tied_once(self) -> bool:
        """Weight sync sends a tied embedding once: CPU engines' gloo receiver gives the head its copy
        (weightsync/tied.py); vLLM's NCCL receive has no such hook, so GPU rollouts get both names."""
        return self.rollout_gpus == 0


class Unsupported(ValueError):
    """The job asks a backend for what it cannot build (a model architecture, a parallel layout); the
    message starts with the spec field. trainer/main.py reports it in one line (the pod's termination
    message, so `kubectl describe arj` shows it) instead of a traceback."""


class TrainerBackend(abc.ABC):
    """What the loop needs from a training backend; built as `BACKENDS[name](settings, world)`."""

    @abc.abstractmethod
    def __init__(self, settings: TrainSettings, world: fsdp.World) -> None: ...

    @abc.abstractmethod
    def step(
        self, batch: list[trajectory_mod.Trajectory], teacher: Mapping[str, Sequence[float]] | None = None
    ) -> dict[str, float]:
        """One training step on the (same, on every rank) batch; returns metrics (rank-local). `teacher`:
        trajectory id -> (R,) teacher logprobs of its response tokens, for every sample of a teacher job."""

    @abc.abstractmethod
    def full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights under Hugging Face names, for weight sync, in the rollout engines' dtype; a tied
        embedding once, as ``model.embed_tokens.weight``, where ``TrainSettings.sync_tied_once``.
        Collective: all ranks iterate fully."""

    def sync_metas(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]] | None:
        """(name, dtype, shape) of what ``full_tensors`` will yield, known without gathering, so that
        weight sync sends each bucket as it is gathered (rank 0 then holds about one bucket of full
        tensors, not the model); None where it is not known in advance: the tensors are gathered into a
        list first. Rank 0 only, not a collective."""
        return None

    @abc.abstractmethod
    def state(self) -> dict[str, Any]:
        """Sharded model + optimizer state for torch.distributed.checkpoint."""

    @abc.abstractmethod
    def load_state(self, state: dict[str, Any]) -> None:
        """Apply a state loaded by torch.distributed.checkpoint."""


def _pad(rows: list[list[float]], value: float, dtype: torch.dtype) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=dtype)


def micro_batches(
    trajs: list[trajectory_mod.Trajectory], tokens_per_rank: int, world_size: int, packed: bool = False
) -> list[list[trajectory_mod.Trajectory]]:
    """Split a mini-batch into length-sorted micro-batches whose padded size per rank (rows per rank x
    longest sequence) stays within ``tokens_per_rank``; a sequence longer than that gets one of its own.
    ``packed`` (spec.trainer.memory.packing): the size per rank is its rows' real tokens instead.

    Padding to the longest sequence of a long-tailed batch wastes most of a step (a 256-token tail
    pads 80-token rows 3x); sorted micro-batches pad each row only to its neighbours, as verl's
    dynamic batch size does. The split depends only on the batch, so every rank runs the same number
    of forwards and backwards (FSDP2's collectives line up); each rank takes ``rank::world`` of each.
    """

    def size(t: trajectory_mod.Trajectory) -> int:
        return len(t.prompt_ids) + len(t.response_ids)

    order = sorted(trajs, key=size, reverse=True)  # stable
    out: list[list[trajectory_mod.Trajectory]] = []
    for t in order:
        if out:
            grown = [*out[-1], t]
            if packed:  # the fullest rank's share: rank::world of the rows
                per_rank = max(sum(size(r) for r in grown[rank::world_size]) for rank in range(world_size))
            else:  # rows per rank x the longest (sorted: the first row)
                per_rank = math.ceil(len(grown) / world_size) * size(grown[0])
            if per_rank <= tokens_per_rank:
                out[-1].append(t)
                continue
        out.append([t])
    return out


class FSDP2Backend(TrainerBackend):
    def __init__(self, settings: TrainSettings, world: fsdp.World) -> None:
        transformers: Any = importlib.import_module("transformers")  # heavy and untyped: only here

        transformers.utils.logging.disable_progress_bar()  # keep the pod log to log lines

        torch.manual_seed(settings.seed)
        self.settings = settings
        self.world = world
        self.logprob_gap: dict[str, float] = {}
        """Per sample of the last step (this rank's share): mean |log pi_trainer - log pi_engine| before
        the update. For samples of the trainer's current version this is ~0 iff the rollout engine holds
        exactly the trainer's weights (the loop logs it as fresh_logprob_gap)."""
        model_dtype = precision.config_dtype(settings.model_path)
        self.precision = precision.choose(settings.dtype, world.device.type, model_dtype)
        self.sync_dtype = precision.engine_dtype(settings.dtype, settings.rollout_gpus, model_dtype)
        if world.is_main and self.precision.note:
            log.info("%s", self.precision.note)
        elif world.is_main:
            log.info(
                "training in %s on float32 master weights (float32 gradient reduction); weight sync sends %s",
                self.precision.compute, self.sync_dtype,
            )  # fmt: skip
        self.model = self._load_model(transformers)
        self.reference: torch.nn.Module | None = None
        """The frozen initial model, sharded like the policy: only with spec.trainer.algorithm.kl > 0 (a
        LoRA job's reference is its policy with the adapters off: no copy)."""
        if settings.kl > 0.0 and settings.lora is None:
            self.reference = self._load_model(transformers).requires_grad_(False).eval()
        self.lora_dropouts = lora_mod.dropouts(self.model) if settings.lora and settings.lora.dropout else []
        """The adapters' dropout modules, in train mode for the training forward alone."""
        self.kl_control = shaping.AdaptiveKL(settings.kl, settings.kl_target, settings.kl_horizon)
        self.critic: torch.nn.Module | None = None
        """PPO's value model (name gae): the policy's architecture with a one-output token head."""
        if settings.critic is not None:
            self.critic = self._load_model(transformers, critic=settings.critic.path)
        self._make_optimizer()

    def _load_model(self, transformers: Any, critic: str | None = None) -> torch.nn.Module:
        """spec.model.path as float32 master weights sharded by FSDP2 (the shards keep the loaded dtype;
        the mixed-precision policy casts for compute): the policy, and the reference built the same way;
        with `critic` (a model directory), that model with a new one-output token head (transformers'
        *ForTokenClassification, verl's critic) instead of the language-model head."""
        if critic is None:
            # Packed rows need attention that takes the sequences' lengths instead of a dense mask.
            attention = (
                {"attn_implementation": packing.implementation(self.world.device)}
                if self.settings.memory.packing
                else {}
            )
            model = transformers.AutoModelForCausalLM.from_pretrained(
                self.settings.model_path, dtype=torch.float32, **attention
            )
        else:
            model = transformers.AutoModelForTokenClassification.from_pretrained(
                critic, num_labels=1, dtype=torch.float32
            )
        if not self.settings.memory.offload:  # offloaded shards live on the CPU: fully_shard moves them
            model.to(self.world.device)
        if critic is None and self.settings.lora is not None:
            # The adapters go in before sharding, so FSDP2 shards them too. peft's wrapper holds no
            # parameters of its own: the causal LM inside is the root unit.
            wrapped = lora_mod.apply(model, self.settings.lora)
            fsdp.shard(model, self.world, self.precision.policy, self.settings.memory)
            return wrapped
        sharded: torch.nn.Module = fsdp.shard(model, self.world, self.precision.policy, self.settings.memory)
        return sharded

    def _make_optimizer(self) -> None:
        """The loss scaler, AdamW over self.model's parameters and the warmup schedule, from settings."""
        s = self.settings
        self.scaler = torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler(
            device=self.world.device.type, enabled=self.precision.loss_scaling
        )  # float16 only; disabled it passes every call through. All ranks share found-inf (all-reduced).
        trainable = [p for p in self.model.parameters() if p.requires_grad]  # a LoRA job: the adapters
        self.optimizer = torch.optim.AdamW(trainable, lr=s.lr, weight_decay=s.weight_decay)
        self.scheduler = self._schedule(self.optimizer)
        if self.critic is not None and s.critic is not None:  # its own AdamW and loss scale, no schedule
            self.critic_scaler = torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler(
                device=self.world.device.type, enabled=self.precision.loss_scaling
            )
            self.critic_optimizer = torch.optim.AdamW(
                self.critic.parameters(), lr=s.critic.lr, weight_decay=s.weight_decay
            )

    def _schedule(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        """The learning rate: linear warmup over settings.warmup_steps steps, then constant."""
        warmup = max(self.settings.warmup_steps, 0)
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )

    # --- log-probabilities ----------------------------------------------------------------------

    def _response_logprobs(
        self, trajs: list[trajectory_mod.Trajectory], reference: bool = False, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, R) logprobs of each response token under the current model (the reference with
        `reference`), R = the longest response, and with `entropy` the (B, R) entropy of the policy's
        distribution at each response position (else None)."""
        if reference and self.settings.lora is not None:
            with self.model.disable_adapter():  # type: ignore[operator]  # peft: the base model
                return self._response_logprobs(trajs, entropy=entropy)
        module = self.reference if reference else self.model
        assert module is not None
        seqs = [t.prompt_ids + t.response_ids for t in trajs]
        if self.settings.memory.packing and hasattr(module, fsdp.LOGPROB_METHOD):
            return self._packed_logprobs(module, trajs, entropy)
        input_ids = _pad([list(map(float, s)) for s in seqs], 0.0, torch.long).to(self.world.device)  # (B, L)
        attention = _pad([[1.0] * len(s) for s in seqs], 0.0, torch.long).to(self.world.device)  # (B, L)
        if hasattr(module, fsdp.LOGPROB_METHOD):  # a causal LM: the head in chunks (spec.trainer.memory)
            token_logp, token_entropy = fsdp.token_logprobs(
                module, input_ids, attention, self.settings.temperature, entropy
            )  # (B, L-1) each
            return response_logprobs(token_logp, trajs), (
                response_logprobs(token_entropy, trajs) if token_entropy is not None else None
            )
        logits = module(input_ids=input_ids, attention_mask=attention, use_cache=False).logits.float()
        scaled = logits[:, :-1] / self.settings.temperature  # (B, L-1, V)
        logp = torch.log_softmax(scaled, dim=-1)  # (B, L-1, V)
        token_logp = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (B, L-1)
        if not entropy:
            return response_logprobs(token_logp, trajs), None
        token_entropy = regularizers.entropy_from_logits(scaled)  # (B, L-1)
        return response_logprobs(token_logp, trajs), response_logprobs(token_entropy, trajs)

    def _packed_logprobs(
        self, module: torch.nn.Module, trajs: list[trajectory_mod.Trajectory], entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """_response_logprobs with the sequences packed into one row (spec.trainer.memory.packing): no
        padding, no attention mask; position ids restart at each sequence, and the sequences' lengths
        split the row for attention (trainer/packing.py: flash-attention's varlen kernel or one sdpa
        call per sequence, never a (T, T) mask). Positions across a boundary predict the next
        sequence's first token and are never read."""
        seqs = [t.prompt_ids + t.response_ids for t in trajs]
        dev = self.world.device
        flat = [tok for s in seqs for tok in s]
        input_ids = torch.tensor(flat, dtype=torch.long, device=dev)[None]  # (1, T)
        positions = torch.cat([torch.arange(len(s)) for s in seqs]).to(dev)[None]  # (1, T)
        token_logp, token_entropy = fsdp.token_logprobs(
            module, input_ids, None, self.settings.temperature, entropy, positions, [len(s) for s in seqs]
        )  # (1, T-1) each
        width = max(len(t.response_ids) for t in trajs)
        rows, start = [], 0
        for t, s in zip(trajs, seqs, strict=True):
            last = start + len(s) - 2  # the position that predicts this sequence's last token
            rows.append([min(start + len(t.prompt_ids) - 1 + j, last) for j in range(width)])
            start += len(s)
        index = torch.tensor(rows, device=dev)  # (B, R): position in token_logp of response token j
        logp = token_logp[0][index]  # (B, R)
        return logp, (token_entropy[0][index] if token_entropy is not None else None)

    def _data_parallel(self) -> tuple[int, int]:
        """(this rank's index, the number of ranks) among those that split each micro-batch's rows."""
        return self.world.rank, self.world.size

    def _shard(self, trajs: list[trajectory_mod.Trajectory]) -> tuple[list[trajectory_mod.Trajectory], bool]:
        rank, size = self._data_parallel()
        mine = trajs[rank::size]
        return (mine, True) if mine else ([trajs[0]], False)

    def _micro(self, chunk: list[trajectory_mod.Trajectory]) -> list[list[trajectory_mod.Trajectory]]:
        return micro_batches(
            chunk, self.settings.micro_batch_tokens, self._data_parallel()[1], self.settings.memory.packing
        )

    # --- the step -------------------------------------------------------------------------------

    def _critic_values(self, trajs: list[trajectory_mod.Trajectory]) -> torch.Tensor:
        """(B, R) the critic's value of the state before each response token (verl's values: the head's
        output at the position that predicts the token)."""
        assert self.critic is not None
        seqs = [t.prompt_ids + t.response_ids for t in trajs]
        input_ids = _pad([list(map(float, s)) for s in seqs], 0.0, torch.long).to(self.world.device)  # (B, L)
        attention = _pad([[1.0] * len(s) for s in seqs], 0.0, torch.long).to(self.world.device)  # (B, L)
        out = self.critic(input_ids=input_ids, attention_mask=attention).logits.float()  # (B, L, 1)
        return response_logprobs(out[:, :-1, 0], trajs)  # (B, R): position i values the state before i+1

    def _gathered_pass(
        self,
        batch: list[trajectory_mod.Trajectory],
        forward: Callable[[list[trajectory_mod.Trajectory]], torch.Tensor],
    ) -> dict[str, torch.Tensor]:
        """id -> (R,) of `forward` (no grad) for every sample of the step: each rank computes its share of
        each micro-batch, then all ranks exchange them (the reference's logprobs for the KL in the reward,
        the critic's old values: every sample's advantage depends on them, and every rank computes all)."""
        mine: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for micro in self._micro(batch):
                rows, real = self._shard(micro)
                out = forward(rows)  # an empty slice still runs the collective forward, and keeps nothing
                if not real:
                    continue
                for t, row in zip(rows, out, strict=True):
                    mine[t.id] = row[: len(t.response_ids)].cpu()
        merged: dict[str, torch.Tensor] = {}
        for part in fsdp.all_gather_object(mine, self.world):
            merged.update(part)  # type: ignore[call-overload]
        return merged

    def step(
        self, batch: list[trajectory_mod.Trajectory], teacher: Mapping[str, Sequence[float]] | None = None
    ) -> dict[str, float]:
        s = self.settings
        obj = s.objective
        if s.teacher_kl_coef is not None and teacher is None:
            raise ValueError("a teacher job's batch came without teacher logprobs")
        reference = None
        if s.advantage.kl_in_reward:
            reference = self._gathered_pass(
                batch, lambda rows: self._response_logprobs(rows, reference=True)[0]
            )
        values = self._gathered_pass(batch, self._critic_values) if self.critic is not None else None
        step_adv = advantage.compute(batch, s.advantage, reference, self.kl_control.value, values)
        if s.advantage.kl_in_reward:
            self.kl_control.update(step_adv.metrics["reward_kl"], len(batch))
        adv_of = step_adv.per_sample
        updates = max(1, min(s.updates_per_step, len(batch)))
        chunks = [batch[i::updates] for i in range(updates)]  # every chunk mixes groups and replicas
        proximal: dict[str, torch.Tensor] = {}
        by_id = {t.id: t for t in batch}
        if obj.correction != "none":
            # The policy before this step's first update. The first chunk trains on exactly that policy,
            # so its own forward (detached) is its proximal: only later chunks need a no-grad pass now.
            with torch.no_grad():
                for chunk in chunks[0 if self.lora_dropouts else 1 :]:  # dropout: chunk 0's own is noisy
                    for micro in self._micro(chunk):
                        mine, _ = self._shard(micro)
                        for t, row in zip(mine, self._response_logprobs(mine)[0], strict=True):
                            proximal[t.id] = row[: len(t.response_ids)].cpu()
        totals: dict[str, float] = {}
        for index, chunk in enumerate(chunks):
            info = aggregation.BatchInfo(
                tokens=float(sum(sum(t.mask) for t in chunk)),
                sequences=float(sum(1 for t in chunk if any(t.mask))),
                scale=s.loss_scale_factor,
            )
            value = 0.0
            weighted: dict[str, float] = {}  # masked-mean metrics x this rank's tokens, summed over micros
            local_tokens = 0.0
            for micro in self._micro(chunk):  # gradients accumulate; the loss is a sum over tokens
                mine, real = self._shard(micro)
                mask = _pad([list(map(float, t.mask)) for t in mine], 0.0, torch.float32)  # (B, R)
                if not real:
                    mask.zero_()
                behaviour = _pad([t.behaviour_logprobs for t in mine], 0.0, torch.float32)  # (B, R)
                dev = self.world.device
                ref_logprobs = None
                if obj.kl_in_loss > 0.0:
                    with torch.no_grad():
                        ref_logprobs = self._response_logprobs(mine, reference=True)[0]  # (B, R)
                with lora_mod.training(self.lora_dropouts):  # (B, R) each
                    logprobs, entropy = self._response_logprobs(mine, entropy=obj.entropy_coef > 0.0)
                if obj.correction == "none":
                    prox = behaviour
                elif index == 0 and not self.lora_dropouts:
                    prox = logprobs.detach().cpu()  # (B, R), the same padding as behaviour
                    for t, row in zip(mine, prox, strict=True):
                        proximal[t.id] = row[: len(t.response_ids)]
                else:
                    prox = _pad([proximal[t.id].tolist() for t in mine], 0.0, torch.float32)  # (B, R)
                inputs = loss.LossInputs(
                    logprobs=logprobs,
                    proximal_logprobs=prox.to(dev),
                    behaviour_logprobs=behaviour.to(dev),
                    advantages=_pad([adv_of[t.id].tolist() for t in mine], 0.0, torch.float32).to(dev),
                    mask=mask.to(dev),
                    batch=info,
                    reference_logprobs=ref_logprobs,
                    entropy=entropy,
                )
                part, metrics = loss.policy_objective(inputs, obj)
                if s.teacher_kl_coef is not None and teacher is not None:
                    rows = [list(teacher[t.id]) for t in mine]
                    teacher_logprobs = _pad(rows, 0.0, torch.float32).to(dev)  # (B, R)
                    kl_part, kl_metrics = loss.teacher_kl_loss(
                        inputs, teacher_logprobs, s.teacher_kl_coef, obj.is_cap
                    )
                    part = part + kl_part
                    metrics.update(kl_metrics)
                self._backward(part)
                value += float(part.detach())
                if self.critic is not None and values is not None:
                    metrics.update(self._critic_backward(mine, mask.to(dev), info, values, step_adv.returns))
                tokens = float(mask.sum())
                with torch.no_grad():
                    metrics["logprob_abs_diff"] = float(
                        ((prox - behaviour).abs() * mask).sum() / mask.sum().clamp(min=1.0)
                    )
                for key, val in metrics.items():
                    weighted[key] = weighted.get(key, 0.0) + val * tokens
                local_tokens += tokens
            norm = self._update()
            chunk_metrics = {key: val / max(local_tokens, 1.0) for key, val in weighted.items()}
            if self.critic is not None:
                chunk_metrics["critic_grad_norm"] = self._critic_update()
            chunk_metrics["skipped_updates"] = 0.0 if math.isfinite(norm) else float(len(chunks))
            chunk_metrics["loss"] = value
            chunk_metrics["grad_norm"] = norm
            for key, val in chunk_metrics.items():
                totals[key] = totals.get(key, 0.0) + val / len(chunks)
        self.scheduler.step()
        if proximal:
            self.logprob_gap = {  # this rank's samples: mean |trainer - engine| over generated tokens
                tid: _masked_gap(lp, by_id[tid]) for tid, lp in proximal.items()
            }
        totals.update(step_adv.metrics)
        totals["samples"] = float(len(batch))
        totals["lr"] = float(self.scheduler.get_last_lr()[0])
        return totals

    def _critic_backward(
        self,
        mine: list[trajectory_mod.Trajectory],
        mask: torch.Tensor,
        info: aggregation.BatchInfo,
        old: Mapping[str, torch.Tensor],
        returns: Mapping[str, torch.Tensor],
    ) -> dict[str, float]:
        """The critic's share of the clipped value loss on one micro-batch (aggregated like the policy's
        loss, verl's critic loss_agg_mode), backward; gradients accumulate until _critic_update."""
        dev = self.world.device
        predicted = self._critic_values(mine)  # (B, R)
        target = _pad([returns[t.id].tolist() for t in mine], 0.0, torch.float32).to(dev)  # (B, R)
        before = _pad([old[t.id].tolist() for t in mine], 0.0, torch.float32).to(dev)  # (B, R)
        assert self.settings.critic is not None
        per_token, clipped = value_mod.value_loss(predicted, target, before, self.settings.critic.value_clip)
        part = aggregation.AGGREGATIONS[self.settings.objective.aggregation](per_token, mask, info)
        self.critic_scaler.scale(part * self.world.size).backward()  # type: ignore[no-untyped-call]
        count = mask.sum().clamp(min=1.0)
        return {
            "value_loss": float((per_token.detach() * mask).sum() / count),
            "value_clip_fraction": float((clipped * mask).sum() / count),
        }

    def _critic_update(self) -> float:
        """Clip and apply the critic's accumulated gradients (skipped when not finite); its norm."""
        assert self.critic is not None
        self.critic_scaler.unscale_(self.critic_optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.critic.parameters(), self.settings.grad_clip)
        norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        if math.isfinite(norm):
            self.critic_scaler.step(self.critic_optimizer)
        self.critic_scaler.update()
        self.critic_optimizer.zero_grad(set_to_none=True)
        return norm

    def _backward(self, part: torch.Tensor) -> None:
        """Backward of one micro-batch's share of the loss; gradients accumulate."""
        # FSDP2 averages gradients over ranks; scaling by world size turns that into the global sum
        self.scaler.scale(part * self.world.size).backward()  # type: ignore[no-untyped-call]

    def _update(self) -> float:
        """Clip the accumulated gradients to settings.grad_clip, step the optimizer unless their global
        norm is not finite, clear them; returns the norm before clipping (the same on every rank)."""
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        if math.isfinite(norm):  # the same global norm on every rank: all skip or all step
            self.scaler.step(self.optimizer)
        self.scaler.update()  # float16: a skipped update halves the loss scale
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    # --- weights and state ----------------------------------------------------------------------

    def full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.settings.lora is not None:  # the LoRA payload: the adapters alone, peft's saved names
            return lora_mod.adapter_tensors(self.model, self.sync_dtype)
        return fsdp.full_tensors(self.model, self.sync_dtype, tied_once=self.settings.sync_tied_once)

    def sync_metas(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]] | None:
        if self.settings.lora is not None:  # the adapters: a few MB, gathered first
            return None
        return fsdp.full_metas(self.model, self.sync_dtype, tied_once=self.settings.sync_tied_once)

    def state(self) -> dict[str, Any]:
        import torch.distributed.checkpoint.state_dict as dcp_state

        model_sd, optim_sd = dcp_state.get_state_dict(self.model, self.optimizer, options=self._dcp_options())
        state = {
            "model": model_sd,
            "optim": optim_sd,
            "scheduler": self.scheduler.state_dict(),
            "algorithm": self.algorithm_state(),
        }
        if self.precision.loss_scaling:  # float16's loss scale (a disabled scaler has no state)
            state["scaler"] = self.scaler.state_dict()
        if self.critic is not None:
            critic_sd, critic_optim_sd = dcp_state.get_state_dict(self.critic, self.critic_optimizer)
            state["critic"] = {"model": critic_sd, "optim": critic_optim_sd}
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        import torch.distributed.checkpoint.state_dict as dcp_state

        dcp_state.set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=self._dcp_options(),
        )
        self.scheduler.load_state_dict(state["scheduler"])
        if "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        self.load_algorithm_state(state)
        if self.critic is not None:
            critic = state["critic"]
            dcp_state.set_state_dict(
                self.critic,
                self.critic_optimizer,
                model_state_dict=critic["model"],
                optim_state_dict=critic["optim"],
            )

    def _dcp_options(self) -> Any:
        """A LoRA job checkpoints its adapters (and their optimizer state) alone: the base is frozen and
        comes from spec.model.path again on resume and export."""
        import torch.distributed.checkpoint.state_dict as dcp_state

        frozen = self.settings.lora is not None
        return dcp_state.StateDictOptions(ignore_frozen_params=frozen, strict=not frozen)

    def algorithm_state(self) -> dict[str, Any]:
        """What the algorithm carries from step to step: the adaptive reward-KL coefficient."""
        return {"kl_coef": torch.tensor(self.kl_control.value, dtype=torch.float64)}

    def load_algorithm_state(self, state: dict[str, Any]) -> None:
        """Apply algorithm_state() from a checkpoint."""
        self.kl_control.value = float(state["algorithm"]["kl_coef"])


def _megatron(settings: TrainSettings, world: fsdp.World) -> TrainerBackend:
    """trainer/megatron/backend.py's `create` (megatron's own DDP on CUDA), imported only for a megatron
    job: megatron-core is pyproject's `megatron` extra, and that module builds on this one (FSDP2Backend's
    step)."""
    try:
        module: Any = importlib.import_module("asyncrl_workloads.trainer.megatron.backend")
    except ImportError as exc:
        raise Unsupported(
            f"spec.trainer.backend: megatron needs megatron-core in the trainer image (asyncrl's"
            f" `megatron` extra): {exc}"
        ) from exc
    built: TrainerBackend = module.create(settings, world)
    return built


BACKENDS: dict[str, Callable[[TrainSettings, fsdp.World], TrainerBackend]] = {
    "fsdp2": FSDP2Backend,
    "megatron": _megatron,
}
"""spec.trainer.backend -> the backend's constructor (raises Unsupported for what it cannot build)."""


def response_logprobs(token_logp: torch.Tensor, trajs: Sequence[trajectory_mod.Trajectory]) -> torch.Tensor:
    """(B, R) logprobs of each row's response tokens (R = the longest response; a shorter row repeats
    its last token's, masked later) from ``token_logp`` (B, L-1): position i holds the logprob of token
    i + 1 of prompt + response."""
    width = max(len(t.response_ids) for t in trajs)
    rows = [
        [min(len(t.prompt_ids) - 1 + j, len(t.prompt_ids) + len(t.response_ids) - 2) for j in range(width)]
        for t in trajs
    ]  # position in token_logp of response token j
    index = torch.tensor(rows, device=token_logp.device)  # (B, R)
    return token_logp.gather(1, index)


def _masked_gap(logprobs: torch.Tensor, traj: trajectory_mod.Trajectory) -> float:
    """Mean |log pi_trainer - log pi_engine| over the tokens the engine generated (mask 1): tool output
    and template tokens of agent episodes carry no engine logprob."""
    mask = torch.tensor(traj.mask, dtype=torch.bool)  # (R,)
    gap = (logprobs - torch.tensor(traj.behaviour_logprobs)).abs()  # (R,)
    return float(gap[mask].mean())
