"""Helper process for test_trainer.py (not a test): one FSDP2 training step on a fixed batch.

    python fsdp_step_worker.py MODEL_DIR OUT_FILE [MICRO_BATCH_TOKENS [CHECKPOINT_ROOT]]
                                          (env: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)

Every rank builds the FSDP2 backend on the tiny model, takes one step (two optimizer updates) on the
same deterministic batch and, on rank 0, saves the full weights after the step to OUT_FILE, with
whether grad was enabled in each forward of the model during the step. With CHECKPOINT_ROOT the ranks
also write the step's checkpoint there as the trainer does (test_export.py).
"""

from __future__ import annotations

import pathlib
import sys

import torch
from asyncrl_workloads.bus import trajectory
from asyncrl_workloads.trainer import backend, checkpoint, fsdp


def batch() -> list[trajectory.Trajectory]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for g in range(3):
        for s in range(4):
            n = 2 + (g + s) % 4
            out.append(
                trajectory.Trajectory(
                    id=f"t{g}-{s}",
                    job="j",
                    replica=0,
                    group_id=f"g{g}",
                    group_size=4,
                    sample_index=s,
                    prompt_ids=[1] + torch.randint(4, 90, (3 + g,), generator=gen).tolist(),
                    response_ids=torch.randint(4, 90, (n,), generator=gen).tolist(),
                    behaviour_logprobs=(-4.0 - torch.rand(n, generator=gen)).tolist(),
                    versions=[0] * n,
                    mask=[1] * (n - 1) + [s % 2],
                    reward=float((g + s) % 3),
                    created_at=0.0,
                )
            )
    return out


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    world = fsdp.init_world()
    micro = int(sys.argv[3]) if len(sys.argv) > 3 else backend.TrainSettings.micro_batch_tokens
    settings = backend.TrainSettings(
        model_path=model_dir, lr=1e-2, updates_per_step=2, correction="tis", micro_batch_tokens=micro
    )
    b = backend.FSDP2Backend(settings, world)
    forwards = []
    b.model.register_forward_hook(lambda module, args, output: forwards.append(torch.is_grad_enabled()))
    metrics = b.step(batch())
    weights = {name: t.clone() for name, t in b.full_tensors()}
    if world.is_main:
        torch.save({"weights": weights, "metrics": metrics, "forwards": forwards}, out)
    if len(sys.argv) > 4:
        saver = checkpoint.Checkpointer(pathlib.Path(sys.argv[4]), 1, 1, world, model_path=model_dir)
        saver.save(1, b, {"param_version": 1})
    fsdp.shutdown()


if __name__ == "__main__":
    main()
