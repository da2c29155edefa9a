"""Helper process for test_trainer.py (not a test): one FSDP2 training step on a fixed batch.

    python fsdp_step_worker.py MODEL_DIR OUT_FILE [MICRO_BATCH_TOKENS [CHECKPOINT_ROOT]]
    python fsdp_step_worker.py MODEL_DIR OUT_FILE MICRO_BATCH_TOKENS --reference
    python fsdp_step_worker.py MODEL_DIR OUT_FILE MICRO_BATCH_TOKENS --critic CHECKPOINT_ROOT
                                          (env: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)

Every rank builds the FSDP2 backend on the tiny model, takes one step (two optimizer updates) on the
same deterministic batch and, on rank 0, saves the full weights after the step to OUT_FILE, with
whether grad was enabled in each forward of the model during the step. With CHECKPOINT_ROOT the ranks
also write the step's checkpoint there as the trainer does (test_export.py). With --reference: three
steps of RLOO with a KL to the reference both in the reward (k1, gathered from every rank before the
advantages) and in the loss (k3), an entropy bonus and dual-clip; OUT_FILE then also holds the
reference's full weights after them and each step's metrics. With --critic: PPO with a critic (GAE),
and an adaptive KL penalty in the reward, four steps, a checkpoint, a second backend resumed from it, and
one more step on both; OUT_FILE holds the steps' metrics, the critic's weights and the KL coefficient
after the checkpoint on both sides, and the last step of both.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import torch
from asyncrl_workloads.bus import trajectory
from asyncrl_workloads.trainer import advantage, backend, checkpoint, fsdp, loss
from asyncrl_workloads.trainer.algorithms import correction, policy_loss


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
        model_path=model_dir,
        lr=1e-2,
        updates_per_step=2,
        objective=loss.Objective(correction="tis", rejection=correction.Rejection(action="clamp")),
        micro_batch_tokens=micro,
    )
    if sys.argv[4:] == ["--reference"]:
        reference_steps(settings, world, out)
        return
    if sys.argv[4:5] == ["--critic"]:
        critic_steps(settings, world, out, pathlib.Path(sys.argv[5]))
        return
    b = backend.FSDP2Backend(settings, world)
    forwards = []
    base = b.model.model  # the decoder: runs once per forward (log-probs apply the head to its output)
    base.register_forward_hook(lambda module, args, output: forwards.append(torch.is_grad_enabled()))
    metrics = b.step(batch())
    weights = {name: t.clone() for name, t in b.full_tensors()}
    if world.is_main:
        torch.save({"weights": weights, "metrics": metrics, "forwards": forwards}, out)
    if len(sys.argv) > 4:
        saver = checkpoint.Checkpointer(pathlib.Path(sys.argv[4]), 1, 1, world, model_path=model_dir)
        saver.save(1, b, {"param_version": 1})
    fsdp.shutdown()


def reference_steps(settings: backend.TrainSettings, world: fsdp.World, out: str) -> None:
    objective = loss.Objective(
        correction="decoupled",
        loss=policy_loss.LossSettings(clip_ratio_c=3.0),
        kl_in_loss=0.05,
        kl_estimator="k3",
        entropy_coef=0.01,
    )
    rloo = advantage.AdvantageSettings(estimator="rloo", kl_in_reward=True, kl_estimator="k1")
    settings = dataclasses.replace(settings, objective=objective, advantage=rloo, kl=0.05)
    b = backend.FSDP2Backend(settings, world)
    steps = [b.step(batch()) for _ in range(3)]
    assert b.reference is not None
    reference = {name: t.clone() for name, t in fsdp.full_tensors(b.reference)}
    weights = {name: t.clone() for name, t in b.full_tensors()}
    if world.is_main:
        torch.save({"weights": weights, "reference": reference, "steps": steps}, out)
    fsdp.shutdown()


def critic_steps(settings: backend.TrainSettings, world: fsdp.World, out: str, root: pathlib.Path) -> None:
    # with an adaptive KL penalty in the reward: its coefficient is state the checkpoint must carry
    gae = advantage.AdvantageSettings(estimator="gae", lam=0.95, kl_in_reward=True, kl_estimator="k1")
    critic = backend.CriticSettings(path=settings.model_path, lr=1e-2)
    settings = dataclasses.replace(
        settings, advantage=gae, critic=critic, kl=0.05, kl_target=0.01, kl_horizon=20
    )
    b = backend.FSDP2Backend(settings, world)
    steps = [b.step(batch()) for _ in range(4)]
    saver = checkpoint.Checkpointer(root, 1, 1, world, model_path=settings.model_path)
    saved = saver.save(4, b, {"param_version": 4})
    resumed = backend.FSDP2Backend(settings, world)
    saver.load(saved, resumed)
    assert b.critic is not None and resumed.critic is not None
    critics = [{n: t.clone() for n, t in fsdp.full_tensors(c)} for c in (b.critic, resumed.critic)]
    kl_coefs = [b.kl_control.value, resumed.kl_control.value]
    last = [b.step(batch()), resumed.step(batch())]
    if world.is_main:
        torch.save({"steps": steps, "critics": critics, "last": last, "kl_coefs": kl_coefs}, out)
    fsdp.shutdown()


if __name__ == "__main__":
    main()
