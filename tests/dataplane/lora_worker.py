"""Helper process for test_lora.py (not a test): LoRA steps on the FSDP2 backend.

    python lora_worker.py MODEL_DIR OUT_FILE CHECKPOINT_ROOT   (env: RANK, WORLD_SIZE, MASTER_ADDR, ...)

Every rank builds the FSDP2 backend with spec.trainer.lora (rank 8 on q/v/down projections) and a KL
to the reference in the loss, on the tiny model; takes one step on fsdp_step_worker's batch; writes the
step's checkpoint as the trainer does (meta.json with the LoRA settings); builds a second backend,
resumes it from that checkpoint, and takes one more step on both. Rank 0 saves to OUT_FILE: every full
weight before and after the first step, the weight-sync payload after it (``full_tensors``), the
optimizer's parameter count, the reference's logprobs and those of a plain backend on the base model
(no LoRA) for the same batch, the adapters of both backends after the resume, and the two last steps'
metrics.
"""

from __future__ import annotations

import pathlib
import sys

import fsdp_step_worker
import torch
from asyncrl_workloads.trainer import backend, checkpoint, fsdp, lora, loss
from asyncrl_workloads.trainer.algorithms import correction

LORA = lora.LoraSettings(rank=8, alpha=16.0, target_modules=("q_proj", "v_proj", "down_proj"))


def main() -> None:
    model_dir, out, root = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    world = fsdp.init_world()
    settings = backend.TrainSettings(
        model_path=model_dir,
        lr=1e-2,
        updates_per_step=2,
        kl=0.1,
        objective=loss.Objective(
            correction="tis", rejection=correction.Rejection(action="clamp"), kl_in_loss=0.1
        ),
        lora=LORA,
    )
    batch = fsdp_step_worker.batch()
    policy = backend.FSDP2Backend(settings, world)
    before = {name: t.clone() for name, t in fsdp.full_tensors(policy.model)}
    optimized = sum(len(g["params"]) for g in policy.optimizer.param_groups)
    metrics = policy.step(batch)
    after = {name: t.clone() for name, t in fsdp.full_tensors(policy.model)}
    payload = {name: t.clone() for name, t in policy.full_tensors()}
    rows = batch[:4]
    with torch.no_grad():
        reference = policy._response_logprobs(rows, reference=True)[0]
        moved = policy._response_logprobs(rows)[0]
    plain = backend.FSDP2Backend(backend.TrainSettings(model_path=model_dir), world)
    with torch.no_grad():
        base_logprobs = plain._response_logprobs(rows)[0]
    ck = checkpoint.Checkpointer(root, 1, 2, world, model_path=model_dir, lora=LORA.meta())
    step_dir = ck.save(1, policy, {"param_version": 1})
    resumed = backend.FSDP2Backend(settings, world)
    ck.load(step_dir, resumed)
    adapters = [dict(policy.full_tensors()), dict(resumed.full_tensors())]
    last = [policy.step(batch), resumed.step(batch)]
    if world.is_main:
        torch.save(
            {
                "before": before,
                "after": after,
                "payload": payload,
                "optimized": optimized,
                "metrics": metrics,
                "reference": reference,
                "moved": moved,
                "base": base_logprobs,
                "adapters": adapters,
                "last": last,
                "step_dir": str(step_dir),
            },
            out,
        )
    fsdp.shutdown()


if __name__ == "__main__":
    main()
