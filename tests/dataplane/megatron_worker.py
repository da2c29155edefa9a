"""Helper process for test_megatron.py (not a test): the megatron-core GPTModel against transformers.

    python megatron_worker.py LLAMA_DIR OUT_FILE      (env: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)

At TP=1 and then at TP=WORLD_SIZE (megatron's parallel state torn down and made again in between: one
set of processes, one set of imports), for two models - the tiny Llama at LLAMA_DIR (untied, MHA) and a
Qwen2 made here (GQA 4 heads / 2 KV heads, tied embeddings, random q/k/v biases) - every rank loads the
HF weights into its GPTModel shard and computes the per-token logprobs of one right-padded batch, then
takes one training step: a fixed-advantage policy-gradient loss over the response mask, each
data-parallel rank on its own rows (at TP=1 the two processes are DP=2), backward, gradients averaged
over DP, the global grad norm clipped, torch.optim.SGD; then gathers the TP shards in HF names. The same
step on the whole batch on the transformers model is the reference. Rank 0 saves {1: .., WORLD_SIZE: ..,
"hf": ..}, per model: the logprobs, the loss, the grad norm before clipping, the HF-layout weights after
the step, the largest difference of a replicated parameter across TP ranks before and after it, and
(hf) the weights before it. Beside each step, spec.trainer.memory against the plain model: activation
checkpointing of both kinds ("recompute": megatron's, torch's) and chunked log-probs ("chunking").

Then the trainer backends on the tiny Llama: one step (two AdamW updates over length-sorted
micro-batches, the tis loss) of MegatronBackend at TP=WORLD_SIZE and of FSDP2Backend over the same
processes (data parallel), and of MegatronBackend at TP=1 (data parallel), on fsdp_step_worker's batch,
all with activation checkpointing and 16-token log-prob chunks; saved under "backend": {WORLD_SIZE: ..,
1: .., "fsdp2": ..} (by TP size), each the whole batch's loss, the metrics and the weights full_tensors
yields after it. Megatron's TP=WORLD_SIZE run then writes its checkpoint (trainer/checkpoint.py, beside
OUT_FILE; "state"), the TP=1 run loads it ("resumed": weights, "resumed_state"), and both take a second
step ("second": weights). The Qwen2 (saved beside OUT_FILE) takes the one step through MegatronBackend
at TP=WORLD_SIZE and FSDP2Backend too ("backend_qwen2").

Then MegatronDDPBackend (megatron's own DDP and distributed optimizer, the GPU path) on CPU through
asyncrl_testing.cuda_on_cpu: the same step and checkpoint flow for both models ("backend_ddp",
"backend_ddp_qwen2"; its TP=1 run resumes from the plain path's TP=2 checkpoint), and at TP=1 x DP=2 in
bfloat16 and float16 ("backend_ddp_bfloat16", "backend_ddp_float16": its state loaded back, a second
step). On one GPU (WORLD_SIZE=1, the gpu test) it runs unredirected: "backend_ddp" in float32 beside
FSDP2, and "backend_ddp_bfloat16".
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import sys
from collections.abc import Iterator
from typing import Any

import fsdp_step_worker  # this script's directory is on sys.path
import torch
import torch.distributed as dist
import transformers
from asyncrl_testing import cuda_on_cpu
from asyncrl_workloads.trainer import backend, checkpoint, fsdp, loss, precision
from asyncrl_workloads.trainer.algorithms import correction
from asyncrl_workloads.trainer.megatron import architecture, grads, parallel
from asyncrl_workloads.trainer.megatron import backend as megatron_backend
from asyncrl_workloads.trainer.megatron import ddp as megatron_ddp
from asyncrl_workloads.trainer.megatron import model as megatron_model

LR = 0.5
CLIP = 2.0
"""Gradient-norm clip, below both models' norms on this batch (4.8 and 3.5): the step is a clipped one."""
DEVICE = torch.device("cpu")
TIS_KL_ENTROPY = loss.Objective(
    correction="tis", rejection=correction.Rejection(action="clamp"), kl_in_loss=0.05, entropy_coef=0.01
)
"""The backends' comparison objective: truncated IS, a k3 KL to the reference in the loss (kl 0.05 in
the settings builds the reference on both sides) and an entropy bonus (vocabulary-parallel at TP > 1)."""
"""The world's device (trainer/fsdp.py): cuda:LOCAL_RANK with nccl on a GPU machine."""


def to_cpu(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    return value.cpu() if isinstance(value, torch.Tensor) else value


def qwen2() -> Any:
    config = transformers.Qwen2Config(
        vocab_size=104,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=128,
        rope_theta=1e6,
    )
    torch.manual_seed(3)
    hf = transformers.Qwen2ForCausalLM(config).float()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)  # HF initialises them to zero: make the fused layout matter
    return hf


def batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T) ids right-padded with 0, (B, T-1) mask of the scored next tokens, (B, 1) advantages."""
    gen = torch.Generator().manual_seed(1)
    lengths = [17, 9, 12, 5]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros(len(lengths), max(lengths) - 1)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(4, vocab, (n,), generator=gen)
        mask[row, n // 2 : n - 1] = 1.0  # "response" tokens: the second half
    return ids, mask, torch.tensor([[1.0], [-1.0], [0.5], [-0.5]])


def pg_loss(
    logprobs: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, tokens: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, T-1) -> (): minus the advantage-weighted logprob summed over the mask, over `tokens`
    (default: the mask's own count; a data-parallel rank passes the whole batch's)."""
    return -(advantages * logprobs * mask).sum() / (mask.sum() if tokens is None else tokens)


def hf_logprobs(hf: Any, ids: torch.Tensor) -> torch.Tensor:
    logits = hf(input_ids=ids, attention_mask=(ids != 0).long()).logits.float()  # (B, T, V)
    return torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def replicated_spread(model: torch.nn.Module, group: dist.ProcessGroup) -> float:
    """Largest |difference| of any replicated parameter (the norms) between this rank and the others."""
    worst = 0.0
    for name, p in model.named_parameters():
        if "layernorm" not in name:
            continue
        copies = [torch.empty_like(p) for _ in range(dist.get_world_size(group))]
        dist.all_gather(copies, p.detach().contiguous(), group=group)
        worst = max([worst, *(float((c - p.detach()).abs().max()) for c in copies)])
    return worst


def megatron_step(hf: Any) -> dict[str, Any]:
    """Logprobs and one step of this rank's GPTModel shard, loaded from `hf`'s weights (left as they are).
    Each data-parallel rank trains its own rows of the batch; the gradients are averaged over DP."""
    group, tp, rank = parallel.tp_group(), parallel.tp_size(), parallel.tp_rank()
    arch = architecture.from_hf(hf.config)
    model = megatron_model.build(arch, tp)
    megatron_model.load_hf(model, hf.state_dict(), arch, tp, rank)
    ids, mask, advantages = (t.to(DEVICE) for t in batch(arch.vocab_size))
    spread_before = replicated_spread(model, group)
    with torch.no_grad():
        logprobs = megatron_model.token_logprobs(model, ids, arch.vocab_size)  # (B, T-1), whole batch
    rows = slice(parallel.dp_rank(), None, parallel.dp_size())  # this data-parallel rank's rows
    own = megatron_model.token_logprobs(model, ids[rows], arch.vocab_size)  # (B/dp, T-1)
    # its share of the whole batch's loss, times dp: averaging the gradients over DP sums the shares
    share = parallel.dp_size() * pg_loss(own, mask[rows], advantages[rows], tokens=mask.sum())
    share.backward()
    mine = (ids[rows], mask[rows], advantages[rows], mask.sum(), own, model)
    recompute = {kind: recompute_difference(hf, arch, *mine, kind) for kind in ("megatron", "torch")}
    chunking = chunking_difference(model, arch, ids)
    grads.average_data_parallel(model)
    norm = grads.clip_grad_norm(model, CLIP)
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return {
        "tp": tp,
        "dp": parallel.dp_size(),
        "modules": [
            type(m).__name__
            for m in (model.decoder.layers[0].self_attention.core_attention, model.rotary_pos_emb)
        ],  # fmt: skip
        "logprobs": logprobs,
        "loss": float(pg_loss(logprobs, mask, advantages)),
        "grad_norm": norm,
        "weights": megatron_model.hf_state(model, arch),
        "spread_before": spread_before,
        "spread_after": replicated_spread(model, group),
        "recompute": recompute,
        "chunking": chunking,
    }


def recompute_difference(
    hf: Any,
    arch: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    tokens: torch.Tensor,
    logprobs: torch.Tensor,
    plain: torch.nn.Module,
    kind: megatron_model.Recompute,
) -> dict[str, float]:
    """The same forward and backward on a GPTModel built with activation checkpointing
    (spec.trainer.memory.activationCheckpointing) of `kind`: megatron's full uniform recompute (the GPU
    path, its CUDA RNG state stood in for by the CPU one) or torch's checkpoint around each layer (the
    CPU path). "difference": the largest |difference| of its logprobs and of any local gradient from the
    plain model's (before DP averaging); "attention_calls": how often the first layer's attention ran
    (1 without recompute, 2 with)."""
    tp, rank = parallel.tp_size(), parallel.tp_rank()
    model = megatron_model.build(arch, tp, recompute=kind)
    megatron_model.load_hf(model, hf.state_dict(), arch, tp, rank)
    assert model.config.recompute_granularity == ("full" if kind == "megatron" else None)
    calls = [0]
    model.decoder.layers[0].self_attention.register_forward_hook(
        lambda *_: calls.__setitem__(0, calls[0] + 1)
    )
    with cuda_on_cpu.rng_on_cpu() if kind == "megatron" else contextlib.nullcontext():
        own = megatron_model.token_logprobs(model, ids, arch.vocab_size)
        (parallel.dp_size() * pg_loss(own, mask, advantages, tokens=tokens)).backward()
    worst = float((own.detach() - logprobs.detach()).abs().max())
    theirs = dict(plain.named_parameters())
    for name, p in model.named_parameters():
        assert p.grad is not None and theirs[name].grad is not None, name
        worst = max(worst, float((p.grad - theirs[name].grad).abs().max()))
    return {"difference": worst, "attention_calls": calls[0]}


CHUNK = 7
"""logprobChunkTokens for chunking_difference: 64 scored tokens in 10 chunks, the last one a single token."""


def chunking_difference(model: torch.nn.Module, arch: Any, ids: torch.Tensor) -> dict[str, Any]:
    """spec.trainer.memory.logprobChunkTokens on megatron: the logprobs and entropy (temperature 0.7)
    and the gradients of a loss on both, with the output layer over CHUNK tokens at a time against the
    whole batch at once. The largest |difference| of each ("logprobs", "entropy", "grads"), the largest
    gradient ("grad_scale"), and the most tokens the output layer projected at once in each ("rows")."""
    rows: list[int] = []

    def count(_: Any, inputs: tuple[Any, ...], out: tuple[torch.Tensor, Any]) -> None:
        if out[0] is not inputs[0]:  # not megatron_model.hidden_states's pass-through
            rows.append(out[0].shape[0] * out[0].shape[1])  # (s, b, V/tp)

    hook = model.output_layer.register_forward_hook(count)
    gen = torch.Generator().manual_seed(2)
    weights = torch.randn(ids.shape[0], ids.shape[1] - 1, 2, generator=gen).to(ids.device)  # (B, T-1, 2)
    params = [p for p in model.parameters() if p.requires_grad]
    runs = []
    for chunk in (0, CHUNK):
        rows.clear()
        logp, ent = megatron_model.token_logprobs_entropy(
            model, ids, arch.vocab_size, temperature=0.7, entropy=True, chunk_tokens=chunk
        )
        assert ent is not None
        loss = (weights[..., 0] * logp + weights[..., 1] * ent).sum()
        runs.append((logp.detach(), ent.detach(), torch.autograd.grad(loss, params), max(rows)))
    hook.remove()
    (whole_logp, whole_ent, whole_grads, whole_rows), (logp, ent, chunk_grads, chunk_rows) = runs
    return {
        "logprobs": float((logp - whole_logp).abs().max()),
        "entropy": float((ent - whole_ent).abs().max()),
        "grads": max(float((a - b).abs().max()) for a, b in zip(chunk_grads, whole_grads, strict=True)),
        "grad_scale": max(float(g.abs().max()) for g in whole_grads),
        "rows": {0: whole_rows, CHUNK: chunk_rows},
    }


def hf_step(hf: Any) -> dict[str, Any]:
    """The reference: the same logprobs and step on the transformers model (which it updates)."""
    ids, mask, advantages = (t.to(DEVICE) for t in batch(hf.config.vocab_size))
    initial = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    logprobs = hf_logprobs(hf, ids)  # (B, T-1)
    loss = pg_loss(logprobs, mask, advantages)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(hf.parameters(), CLIP)
    torch.optim.SGD(hf.parameters(), lr=LR).step()
    return {
        "logprobs": logprobs.detach(),
        "loss": float(loss.detach()),
        "grad_norm": float(norm),
        "initial": initial,
        "weights": {k: v.detach().clone() for k, v in hf.state_dict().items()},
        "real": ids[:, 1:] != 0,
    }


def teacher_logprobs() -> dict[str, list[float]]:
    """A teacher's logprob of each response token of fsdp_step_worker.batch() (fixed, distinct)."""
    return {t.id: [-3.0 - 0.25 * j - 0.01 * i for j in range(len(t.response_ids))]
            for i, t in enumerate(fsdp_step_worker.batch())}  # fmt: skip


def backend_step(
    model_dir: str | pathlib.Path,
    world: fsdp.World,
    checkpoints: pathlib.Path | None = None,
    teacher: bool = False,
    ddp: bool = False,
    resume_from: pathlib.Path | None = None,
    dtype: str = "float32",
) -> dict[str, Any]:
    """One step of each backend on the same batch, from the same weights. With `checkpoints`, megatron
    also at TP=1, its checkpoint written at TP=world after its step and resumed at TP=1 (after its own
    step), then a second step on each. `teacher`: the loss is `correction: none` plus the teacher's
    reverse-KL term (coefficient 0.5) instead of tis alone, megatron at TP=1 only: the term's baseline
    is the mean over each rank's share of a micro-batch (loss.teacher_kl_loss), so only the same
    data-parallel split as FSDP2's gives the same gradient. `ddp`: MegatronDDPBackend (megatron's own
    DDP and distributed optimizer) instead, on CPU through asyncrl_testing.cuda_on_cpu (the GPU path's
    rehearsal): with `checkpoints` at TP=world and TP=1 (no FSDP2 run; the TP=1 run resumes from
    `resume_from`'s checkpoint, the plain path's); without, at TP=1 beside FSDP2 (one GPU), or alone when
    `dtype` is not float32 (spec.model.dtype: its state() loaded back into it, then a second step)."""
    saver = (
        checkpoint.Checkpointer(checkpoints, 1, 1, world, model_path=str(model_dir)) if checkpoints else None
    )
    settings = backend.TrainSettings(
        model_path=str(model_dir),
        lr=1e-2,
        updates_per_step=2,
        objective=TIS_KL_ENTROPY,
        kl=0.05,
        micro_batch_tokens=40,
        grad_clip=0.5,
        dtype=dtype,
        warmup_steps=4,
        memory=fsdp.Memory(logprob_chunk_tokens=16),
    )  # 40 tokens: several micro-batches per update; clip 0.5: below the norms, so both updates clip;
    # warmup: the step after a resume must run at the schedule's rate, not step 0's; memory: both
    # backends checkpoint every layer (megatron on CPU: torch's) and project 16 tokens at a time
    if teacher:
        settings = dataclasses.replace(
            settings, objective=loss.Objective(correction="none"), kl=0.0, teacher_kl_coef=0.5
        )
    logprobs = teacher_logprobs() if teacher else None
    out: dict[str, Any] = {}
    tps: tuple[int | None, ...]  # megatron at TP=world (DP=1), TP=1 (DP=world); None: fsdp2
    if ddp:
        tps = (world.size, 1) if saver else (1, None) if dtype == "float32" else (1,)
    else:
        tps = (world.size, 1, None) if saver else (1, None) if teacher else (world.size, None)
    rehearse = ddp and world.device.type == "cpu"
    for tp in tps:
        with contextlib.ExitStack() as stack:
            if rehearse and tp is not None:
                stack.enter_context(cuda_on_cpu.redirect())
                if dtype != "float32":
                    stack.enter_context(gpu_precision(dtype))
            out[tp or "fsdp2"] = one_backend(settings, world, tp, ddp, saver, resume_from, logprobs)
        if tp is not None:
            parallel.destroy()
    if checkpoints:
        out["checkpoints"] = str(checkpoints)
    return out


@contextlib.contextmanager
def gpu_precision(dtype: str) -> Iterator[None]:
    """precision.choose as on a GPU for spec.model.dtype `dtype`: on CPU it trains in float32 (its note
    says why), which would leave MegatronDDPBackend's Float16Module path and float16's loss scale unrun
    in the CPU rehearsal. bfloat16 and float16 arithmetic work on CPU, slowly."""
    real = precision.choose
    wanted = precision.resolve(dtype, None)
    precision.choose = lambda *_: precision.Precision(wanted, None, wanted == torch.float16, None)  # type: ignore[assignment]
    try:
        yield
    finally:
        precision.choose = real


def one_backend(
    settings: backend.TrainSettings,
    world: fsdp.World,
    tp: int | None,
    ddp: bool,
    saver: checkpoint.Checkpointer | None,
    resume_from: pathlib.Path | None,
    logprobs: dict[str, list[float]] | None,
) -> dict[str, Any]:
    trainer: backend.TrainerBackend
    kind = megatron_ddp.MegatronDDPBackend if ddp else megatron_backend.MegatronBackend
    if tp is None:
        trainer = backend.FSDP2Backend(settings, world)
    else:
        trainer = kind(dataclasses.replace(settings, tp=tp), world)
    metrics = trainer.step(fsdp_step_worker.batch(), logprobs)
    losses = [0.0] * world.size  # each rank's loss is its rows' share of the whole batch's
    dist.all_gather_object(losses, metrics["loss"])
    dp = world.size // (tp or 1)  # the first dp ranks hold different rows (TP ranks are adjacent)
    out: dict[str, Any] = {
        "loss": sum(losses[:: world.size // dp]),
        "metrics": metrics,
        "weights": dict(trainer.full_tensors()),
        "sync_metas": trainer.sync_metas(),  # the plan of a sync, made before anything is gathered
    }
    if ddp and tp is not None:
        out["megatron"] = [type(trainer.ddp).__name__, type(trainer.dist_optimizer).__name__]  # type: ignore[attr-defined]
    if saver is None and ddp and tp is not None and settings.dtype != "float32":
        # its own checkpoint state loaded back into it, then a second step
        saved = trainer.state()
        trainer.load_state(saved)
        out["state"], out["reloaded"] = saved, trainer.state()
        out["second_metrics"] = trainer.step(fsdp_step_worker.batch(), logprobs)
        out["second"] = dict(trainer.full_tensors())
    elif saver is None:
        pass
    elif tp == world.size:  # its checkpoint, then a second step
        saver.save(1, trainer, {})
        out["state"] = trainer.state()
        trainer.step(fsdp_step_worker.batch(), logprobs)
        out["second"] = dict(trainer.full_tensors())
    elif tp == 1:  # a new backend resumed from TP=world's checkpoint (or resume_from's), then its step
        loader = checkpoint.Checkpointer(resume_from, 1, 1, world) if resume_from else saver
        directory, _ = loader.latest() or (None, None)
        assert directory is not None
        parallel.destroy()  # a restarted trainer: nothing carried over from the step above
        trainer = kind(dataclasses.replace(settings, tp=tp), world)
        loader.load(directory, trainer)
        out["resumed"] = dict(trainer.full_tensors())
        out["resumed_state"] = trainer.state()
        trainer.step(fsdp_step_worker.batch(), logprobs)
        out["second"] = dict(trainer.full_tensors())
    return out


def main() -> None:
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # megatron warns without it when tp > 1
    llama_dir, out_file = sys.argv[1], sys.argv[2]
    world = fsdp.init_world()
    global DEVICE
    DEVICE = world.device
    models = {
        "llama": transformers.AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32),
        "qwen2": qwen2(),
    }
    models = {name: hf.to(DEVICE) for name, hf in models.items()}
    qwen2_dir = pathlib.Path(out_file).parent / "qwen2"
    if world.size > 1 and world.is_main:
        models["qwen2"].save_pretrained(qwen2_dir)  # untrained yet: the backends start from it (tied: once)
    if world.size > 1:
        dist.barrier()
    results: dict[Any, Any] = {}
    for tp in sorted({1, world.size}):  # tp 1 < world: data parallel over TP=1 models
        parallel.initialize(tp=tp, seed=0)
        results[tp] = {name: megatron_step(hf) for name, hf in models.items()}
        parallel.destroy()
    results["hf"] = {name: hf_step(hf) for name, hf in models.items()}
    if world.size == 1 and world.device.type == "cuda":  # the gpu test: megatron's own DDP and optimizer
        results["backend_ddp"] = backend_step(llama_dir, world, ddp=True)
        results["backend_ddp_bfloat16"] = backend_step(llama_dir, world, ddp=True, dtype="bfloat16")
    if world.size > 1:
        results["backend"] = backend_step(llama_dir, world, pathlib.Path(out_file).parent / "checkpoints")
        results["backend_qwen2"] = backend_step(
            qwen2_dir, world, pathlib.Path(out_file).parent / "ckpt-qwen2"
        )
        results["backend_teacher"] = backend_step(llama_dir, world, teacher=True)
        results["backend_ddp"] = backend_step(
            llama_dir, world, pathlib.Path(out_file).parent / "ckpt-ddp", ddp=True,
            resume_from=pathlib.Path(results["backend"]["checkpoints"]),
        )  # fmt: skip
        results["backend_ddp_qwen2"] = backend_step(
            qwen2_dir, world, pathlib.Path(out_file).parent / "ckpt-ddp-qwen2", ddp=True,
            resume_from=pathlib.Path(results["backend_qwen2"]["checkpoints"]),
        )  # fmt: skip  # tied embeddings: one parameter used twice under megatron's DDP
        for dtype in ("bfloat16", "float16"):  # TP=1 x DP=2, as a GPU would choose
            results[f"backend_ddp_{dtype}"] = backend_step(llama_dir, world, ddp=True, dtype=dtype)
    if world.is_main:
        torch.save(to_cpu(results), out_file)
    fsdp.shutdown()


if __name__ == "__main__":
    main()
