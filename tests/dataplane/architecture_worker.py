"""Helper process for test_architectures.py (not a test): for each created architecture, one FSDP2 step,
the step's checkpoint and `asyncrl export` of it, and (where asked) one LoRA step, all in one process
(rank 0 of a world of one, one torch import for every architecture).

    python architecture_worker.py WORK ARCH=MODEL_DIR[:lora] [ARCH=MODEL_DIR[:lora] ...]

For each ARCH it writes under WORK/ARCH: `ckpt/` (the checkpoint as the trainer writes it), `hf/` (the
export of that checkpoint) and, last, `trained.pt`: the trainer's full weights after the step under the
names it sends to the rollouts, the step's metrics and, with `:lora`, the LoRA step's sync payload
(`adapter`: peft's saved names, the adapters alone; `lora`: `LORA.meta()`). `trained.pt` is
renamed into place, so a reader that sees it sees every file of its architecture (the test starts its
vLLM engines while this runs). The steps are fsdp_step_worker.py's fixed batch.
"""

from __future__ import annotations

import os
import pathlib
import sys

import torch
from asyncrl_workloads.local import process
from asyncrl_workloads.trainer import backend, checkpoint, export, fsdp, lora, loss
from asyncrl_workloads.trainer.algorithms import correction

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import fsdp_step_worker  # noqa: E402  (its fixed batch)

LORA = lora.LoraSettings(
    rank=8,
    alpha=16.0,
    target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
)
"""spec.trainer.lora's default targets (all seven projections); rank 8 is vLLM's max_lora_rank 8."""


def settings(model_dir: str, lora_settings: lora.LoraSettings | None = None) -> backend.TrainSettings:
    return backend.TrainSettings(
        model_path=model_dir,
        lr=1e-2,
        updates_per_step=2,
        objective=loss.Objective(correction="tis", rejection=correction.Rejection(action="clamp")),
        lora=lora_settings,
    )


def main() -> None:
    work = pathlib.Path(sys.argv[1])
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"})
    os.environ.setdefault("MASTER_PORT", str(process.free_port()))
    world = fsdp.init_world()
    batch = fsdp_step_worker.batch()
    for item in sys.argv[2:]:
        arch, target = item.split("=", 1)
        model_dir, _, with_lora = target.partition(":")
        out = work / arch
        out.mkdir(parents=True, exist_ok=True)
        b = backend.FSDP2Backend(settings(model_dir), world)
        saved = {"metrics": b.step(batch), "weights": {name: t.clone() for name, t in b.full_tensors()}}
        saver = checkpoint.Checkpointer(out / "ckpt", 1, 1, world, model_path=model_dir)
        saver.save(1, b, {"param_version": 1})
        export.export(out / "ckpt", out / "hf")
        del b
        if with_lora:
            adapted = backend.FSDP2Backend(settings(model_dir, LORA), world)
            adapted.step(batch)
            saved["adapter"] = {name: t.clone() for name, t in adapted.full_tensors()}
            saved["lora"] = LORA.meta()
            del adapted
        torch.save(saved, out / "trained.pt.tmp")
        os.replace(out / "trained.pt.tmp", out / "trained.pt")
        print(f"{arch}: step, checkpoint, export{' and LoRA step' if with_lora else ''} done", flush=True)
    fsdp.shutdown()


if __name__ == "__main__":
    main()
