"""Helper process for test_architectures.py (not a test): for each created architecture, one FSDP2 step,
the step's checkpoint and `asyncrl export` of it, all in one process (rank 0 of a world of one).

    python architecture_worker.py WORK ARCH=MODEL_DIR [ARCH=MODEL_DIR ...]

For each ARCH it writes under WORK/ARCH: `trained.pt` (the trainer's full weights after the step, under
the names it sends to the rollouts, and the step's metrics), `ckpt/` (the checkpoint as the trainer
writes it) and `hf/` (the export of that checkpoint). The step is fsdp_step_worker.py's fixed batch.
"""

from __future__ import annotations

import os
import pathlib
import sys

import torch
from asyncrl_workloads.local import process
from asyncrl_workloads.trainer import backend, checkpoint, export, fsdp, loss
from asyncrl_workloads.trainer.algorithms import correction

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import fsdp_step_worker  # noqa: E402  (its fixed batch)


def main() -> None:
    work = pathlib.Path(sys.argv[1])
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"})
    os.environ.setdefault("MASTER_PORT", str(process.free_port()))
    world = fsdp.init_world()
    for item in sys.argv[2:]:
        arch, model_dir = item.split("=", 1)
        out = work / arch
        out.mkdir(parents=True, exist_ok=True)
        settings = backend.TrainSettings(
            model_path=model_dir,
            lr=1e-2,
            updates_per_step=2,
            objective=loss.Objective(correction="tis", rejection=correction.Rejection(action="clamp")),
        )
        b = backend.FSDP2Backend(settings, world)
        metrics = b.step(fsdp_step_worker.batch())
        weights = {name: t.clone() for name, t in b.full_tensors()}
        torch.save({"weights": weights, "metrics": metrics}, out / "trained.pt")
        saver = checkpoint.Checkpointer(out / "ckpt", 1, 1, world, model_path=model_dir)
        saver.save(1, b, {"param_version": 1})
        export.export(out / "ckpt", out / "hf")
        print(f"{arch}: step, checkpoint and export done", flush=True)
    fsdp.shutdown()


if __name__ == "__main__":
    main()
