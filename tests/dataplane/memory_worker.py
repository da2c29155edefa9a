"""Helper process for test_memory.py (not a test): the FSDP2 backend under each spec.trainer.memory setting.

    python memory_worker.py MODEL_DIR OUT_FILE     (env: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)

Every rank builds the backend under each setting of SETTINGS (activation checkpointing, log-probs
chunked 7 tokens at a time, packing, and combinations) and, on its share of a fixed batch, computes
the response log-probs and entropy, then the full gradients of a fixed weighting of both; it counts
how often the first decoder layer's attention and the language-model head run and the most rows the
head saw at once, and records each of torch's attention calls' query length and mask shape.
Then one full step (two optimizer updates, micro-batches of 64 tokens) with every setting off and
every setting on. Rank 0 saves
all of it to OUT_FILE.
"""

from __future__ import annotations

import sys
from typing import Any

import fsdp_step_worker
import torch
from asyncrl_workloads.trainer import backend, fsdp, loss
from asyncrl_workloads.trainer.algorithms import correction

SETTINGS = {
    "plain": fsdp.Memory(activation_checkpointing=False, logprob_chunk_tokens=0),
    "checkpointed": fsdp.Memory(activation_checkpointing=True, logprob_chunk_tokens=0),
    "chunked": fsdp.Memory(activation_checkpointing=False, logprob_chunk_tokens=7),
    "both": fsdp.Memory(activation_checkpointing=True, logprob_chunk_tokens=7),
    "packed": fsdp.Memory(activation_checkpointing=False, logprob_chunk_tokens=0, packing=True),
    "all": fsdp.Memory(activation_checkpointing=True, logprob_chunk_tokens=7, packing=True),
}


def settings(model_dir: str, memory: fsdp.Memory) -> backend.TrainSettings:
    return backend.TrainSettings(
        model_path=model_dir,
        lr=1e-2,
        updates_per_step=2,
        objective=loss.Objective(correction="tis", rejection=correction.Rejection(action="clamp")),
        micro_batch_tokens=64,
        temperature=0.7,
        memory=memory,
    )


def gradients(b: backend.FSDP2Backend) -> dict[str, Any]:
    counts = {"attention": 0, "head": 0, "head_rows": 0}

    def on_attention(*_: Any) -> None:
        counts["attention"] += 1

    def on_head(_module: Any, args: Any) -> None:
        counts["head"] += 1
        counts["head_rows"] = max(counts["head_rows"], args[0].shape[:-1].numel())

    base: Any = b.model.model
    base.layers[0].self_attn.register_forward_pre_hook(on_attention)
    head: Any = b.model.lm_head
    head.register_forward_pre_hook(on_head)
    mine, _ = b._shard(fsdp_step_worker.batch())
    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls: list[tuple[int, tuple[int, ...] | None]] = []  # (query length, the mask's shape or None)

    def recording(query: torch.Tensor, *args: Any, attn_mask: Any = None, **kwargs: Any) -> torch.Tensor:
        calls.append((query.shape[-2], tuple(attn_mask.shape) if attn_mask is not None else None))
        return sdpa(query, *args, attn_mask=attn_mask, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = recording
    try:
        logp, entropy = b._response_logprobs(mine, entropy=True)  # (B, R) each
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa
    assert entropy is not None
    weights = torch.linspace(-1.0, 1.0, logp.numel()).reshape(logp.shape)  # (B, R)
    ((logp * weights).sum() + 0.3 * entropy.sum()).backward()
    counts["sdpa"] = calls
    counts["lengths"] = [len(t.prompt_ids) + len(t.response_ids) for t in mine]
    grads = {}
    for name, p in b.model.named_parameters():
        assert p.grad is not None, name
        grad: Any = p.grad
        grads[name] = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
    return {"logprobs": logp.detach(), "entropy": entropy.detach(), "grads": grads, "counts": counts}


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    world = fsdp.init_world()
    result: dict[str, Any] = {}
    for name, memory in SETTINGS.items():
        result[name] = gradients(backend.FSDP2Backend(settings(model_dir, memory), world))
    for name in ("plain", "all"):
        b = backend.FSDP2Backend(settings(model_dir, SETTINGS[name]), world)
        metrics = b.step(fsdp_step_worker.batch())
        result[f"step_{name}"] = {"metrics": metrics, "weights": dict(b.full_tensors())}
    if world.is_main:
        torch.save(result, out)
    fsdp.shutdown()


if __name__ == "__main__":
    main()
