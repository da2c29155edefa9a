"""The trainer on real torch (gloo) and a real nats-server: FSDP2 across processes, checkpoints, crash/resume.

Uses the `tiny_model` and `nats_server` fixtures (tests/dataplane/conftest.py).
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import signal
import subprocess
import sys
import time

import nats
import pytest
import torch
from asyncrl_api import config
from asyncrl_testing import jobs
from asyncrl_testing.ranks import env_for, free_port
from asyncrl_workloads.bus import jetstream, trajectory
from asyncrl_workloads.trainer import checkpoint

pytestmark = pytest.mark.dataplane
HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]


def run_fsdp_step(
    model: pathlib.Path, out: pathlib.Path, world: int, micro_tokens: int = 8192, *extra: str
) -> dict:
    port = free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "fsdp_step_worker.py"),
                str(model),
                str(out),
                str(micro_tokens),
                *extra,
            ],
            env=env_for(rank, world, port),
        )
        for rank in range(world)
    ]
    for p in procs:
        assert p.wait(timeout=300) == 0
    return torch.load(out)


def test_a_two_process_fsdp2_step_equals_the_single_process_step(tiny_model, tmp_path):
    one = run_fsdp_step(tiny_model, tmp_path / "one.pt", 1)
    two = run_fsdp_step(tiny_model, tmp_path / "two.pt", 2)
    import transformers

    before = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
    moved = max(float((one["weights"][k] - before[k]).abs().max()) for k in before)
    diff = max(float((one["weights"][k] - two["weights"][k]).abs().max()) for k in before)
    assert moved > 1e-3  # the step changed the weights (lr 1e-2 Adam: ~1e-2 per element)
    assert diff < 1e-4  # equal up to float reduction order
    assert one["weights"].keys() == two["weights"].keys() == before.keys()
    # two updates: the first mini-batch's proximal is its own forward; only the second needs a no-grad pass
    assert one["forwards"] == two["forwards"] == [False, True, True]


def test_micro_batches_accumulate_to_the_same_step_on_one_and_two_ranks(tiny_model, tmp_path):
    whole = run_fsdp_step(tiny_model, tmp_path / "whole.pt", 1)
    # 24 padded tokens per rank: the batch's 6-12 token sequences go 2-3 per micro-batch per rank
    one = run_fsdp_step(tiny_model, tmp_path / "one.pt", 1, micro_tokens=24)
    two = run_fsdp_step(tiny_model, tmp_path / "two.pt", 2, micro_tokens=24)
    for run in (one, two):
        diff = max(float((run["weights"][k] - whole["weights"][k]).abs().max()) for k in whole["weights"])
        assert diff < 1e-4  # the same gradient, summed in another order
        assert run["metrics"]["grad_norm"] == pytest.approx(whole["metrics"]["grad_norm"], rel=1e-4)
    for key in ("loss", "clip_fraction", "is_weight_mean", "logprob_abs_diff"):  # rank-local: one rank only
        assert one["metrics"][key] == pytest.approx(whole["metrics"][key], rel=1e-4, abs=1e-6), key
    # several forwards per mini-batch now (no-grad ones for the second mini-batch's proximal, then one
    # with grad per micro-batch); two ranks split each micro-batch, so each rank's share is within budget
    # with fewer micro-batches. Ranks with different counts would hang in FSDP2's collectives.
    assert len(one["forwards"]) > len(two["forwards"]) > len(whole["forwards"]) == 3
    assert one["forwards"] == sorted(one["forwards"]) and two["forwards"] == sorted(two["forwards"])
    # the global gradient norm (before clipping) is the same: each rank's loss is scaled to a global mean
    assert two["metrics"]["grad_norm"] == pytest.approx(one["metrics"]["grad_norm"], rel=1e-4)


def test_the_reference_stays_frozen_while_the_policy_moves_on_one_and_two_ranks(tiny_model, tmp_path):
    """RLOO with a KL to the reference in the reward (its logprobs gathered from both ranks before the
    advantages) and in the loss, an entropy bonus and dual-clip, three steps: the reference is the
    initial model to the bit, the policy moved, the KL in the loss grows as the policy leaves the
    reference, the reward's KL (the fixed behaviour logprobs against the reference's) stays the same
    step after step, and two ranks take the same steps as one."""
    import transformers

    one = run_fsdp_step(tiny_model, tmp_path / "one.pt", 1, 24, "--reference")
    two = run_fsdp_step(tiny_model, tmp_path / "two.pt", 2, 24, "--reference")
    initial = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
    for run in (one, two):
        assert all(torch.equal(run["reference"][k], initial[k]) for k in initial)
        assert max(float((run["weights"][k] - initial[k]).abs().max()) for k in initial) > 1e-3
        kl = [s["kl_loss"] for s in run["steps"]]
        reward_kl = [s["reward_kl"] for s in run["steps"]]
        assert kl[0] < kl[1] < kl[2], kl
        assert reward_kl[0] == pytest.approx(reward_kl[1], rel=1e-6) == pytest.approx(reward_kl[2], rel=1e-6)
        assert all(s["entropy"] > 0 for s in run["steps"])
    diff = max(float((one["weights"][k] - two["weights"][k]).abs().max()) for k in initial)
    assert diff < 1e-4
    assert one["steps"][2]["reward_kl"] == pytest.approx(two["steps"][2]["reward_kl"], rel=1e-4)


def test_ppo_with_a_critic_fits_its_values_and_resumes_it_from_a_checkpoint(tiny_model, tmp_path):
    """name gae with an adaptive KL penalty in the reward: the critic (the tiny model with a new value
    head) trains on the clipped value loss toward the GAE returns (its loss falls over four steps on the
    same batch), checkpoints with the policy, and a backend resumed from that checkpoint holds the same
    critic and KL coefficient and takes the same next step (its AdamW moments came back too); two ranks
    agree with one."""
    one = run_fsdp_step(tiny_model, tmp_path / "one.pt", 1, 24, "--critic", str(tmp_path / "c1"))
    two = run_fsdp_step(tiny_model, tmp_path / "two.pt", 2, 24, "--critic", str(tmp_path / "c2"))
    for run in (one, two):
        losses = [s["value_loss"] for s in run["steps"]]
        assert losses[-1] < 0.5 * losses[0], losses
        saved, resumed = run["critics"]
        assert saved.keys() == resumed.keys() and "score.weight" in saved
        assert all(torch.equal(saved[k], resumed[k]) for k in saved)
        saved_coef, resumed_coef = run["kl_coefs"]
        assert (
            saved_coef == resumed_coef and saved_coef != 0.05
        )  # the adaptive coefficient moved and came back
        after_saved, after_resumed = run["last"]
        for key in ("value_loss", "loss", "grad_norm", "critic_grad_norm"):
            assert after_resumed[key] == pytest.approx(after_saved[key], rel=1e-5), key
    # The global gradient norm is the same on every rank (value_loss is rank-local: its own rows), and
    # the weights agree up to float reduction order, with one exception Adam makes. A parameter whose
    # gradient was exactly 0 until now moves by about lr/2 in the sign of its first nonzero gradient,
    # whatever its size; here one embedding element's first gradient, in step 4, is a cancellation
    # (-6.8e-7 on one rank, +1.0e-7 on two, with x - logsumexp(x) for the head's log-softmax;
    # -1.1e-6 and -6.2e-7 with torch.log_softmax), so the two runs may step it ~lr/2 apart and the
    # fourth step's norms differ by ~1e-4: that element ends at most one Adam step (lr, 1e-2) apart, and
    # everything else agrees to ~1e-4.
    for a, b in zip(one["steps"][:3], two["steps"][:3], strict=True):
        assert a["critic_grad_norm"] == pytest.approx(b["critic_grad_norm"], rel=1e-5)
    assert one["steps"][3]["critic_grad_norm"] == pytest.approx(two["steps"][3]["critic_grad_norm"], rel=1e-3)
    diffs = torch.cat(
        [(one["critics"][0][k] - two["critics"][0][k]).abs().flatten() for k in one["critics"][0]]
    )
    assert int((diffs > 1e-3).sum()) <= 2 and float(diffs.max()) < 1e-2, sorted(diffs.tolist())[-4:]


# --- the trainer process: crash between step and ack, resume, nothing trained twice -------------


MEGATRON_TP2 = {"replicas": 2, "backend": "megatron", "parallelism": {"tp": 2}}
"""trainer patch: megatron-core, tensor parallel over two processes (CPU: one per pod, gloo)."""


def job_config(
    tmp_path: pathlib.Path, model: pathlib.Path, nats_url: str, max_steps: int, trainer: dict | None = None
) -> pathlib.Path:
    spec = jobs.deep_merge(
        jobs.BASE_SPEC,
        {
            "model": {"path": str(model)},
            "mode": "async",
            "rollout": {
                "replicas": 1,
                "gpusPerReplica": 0,
                "sampling": {"n": 2, "maxTokens": 8},
                "engine": {"maxModelLen": 64},
            },
            "trainer": {
                "replicas": 1,
                "gpusPerReplica": 0,
                "batch": {"prompts": 2, "miniBatches": 1},
                "optimizer": {"lr": 1e-3},
                "checkpoint": {"path": str(tmp_path / "ckpt"), "everySteps": 2},
            },
            "async": {"maxStaleness": 100, "syncEverySteps": 1, "queue": {"maxSize": 100}},
            "weightSync": {"backend": "gloo", "timeoutSeconds": 5},
            "maxSteps": max_steps,
            "progress": {"reportIntervalSeconds": 1},
        },
    )
    spec = jobs.deep_merge(spec, {"trainer": trainer or {}})
    cfg = config.JobConfig(
        name="crash",
        namespace="test",
        spec=spec,
        endpoints=config.Endpoints(
            nats_url=nats_url,
            trainer_host="127.0.0.1",
            weight_sync_port=free_port(),
            torch_master_port=free_port(),
        ),
    )
    path = tmp_path / "job.json"
    path.write_text(config.dumps(cfg))
    return path


def publish_groups(nats_url: str, groups: int) -> None:
    async def go():
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        settings = jetstream.StreamSettings("test", "crash", max_size=100)
        await jetstream.ensure_stream(js, settings)
        pub = jetstream.Publisher(js, settings)
        for g in range(groups):
            for s in range(2):
                await pub.publish(
                    trajectory.Trajectory(
                        id=trajectory.trajectory_id("crash", 0, str(g), s),
                        job="crash",
                        replica=0,
                        group_id=f"crash:p{g}",
                        group_size=2,
                        sample_index=s,
                        prompt_ids=[1, 10 + g % 7],
                        response_ids=[20 + s, 21],
                        behaviour_logprobs=[-4.6, -4.6],
                        versions=[0, 0],
                        mask=[1, 1],
                        reward=float(s),
                        created_at=time.time(),
                    )
                )
        await nc.close()

    asyncio.run(go())


def run_trainer(
    cfg: pathlib.Path, tmp_path: pathlib.Path, extra_env: dict[str, str], world: int = 1
) -> subprocess.CompletedProcess:
    """The trainer's entry point as its pods run it, `world` ranks (a lone process sets its own ranks).
    Rank 0's outcome; when rank 0 dies the others are killed, as the operator recreates the whole gang
    (a follower would otherwise wait in its next collective for gloo's timeout)."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = env_for(rank, world, port)
        if world == 1:
            env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env.update(
            ASYNCRL_STEP_LOG=str(tmp_path / "steps.jsonl"),
            ASYNCRL_PROGRESS_FILE=str(tmp_path / "progress.json"),
            ASYNCRL_METRICS_PORT="0",
            **extra_env,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "asyncrl_workloads.entrypoints.trainer", "--config", str(cfg)],
                env=env,
                stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                stderr=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                text=True,
            )
        )
    try:
        out, err = procs[0].communicate(timeout=300)
        for follower in procs[1:]:
            if procs[0].returncode != 0:
                follower.kill()
            # after rank 0 died a follower may have left on its own first: its next collective with rank 0
            # fails (gloo: connection reset) and it exits 1 (CI saw it beat the kill)
            allowed = (0,) if procs[0].returncode == 0 else (0, 1, -signal.SIGKILL)
            assert follower.wait(timeout=60) in allowed
    finally:
        for proc in procs:
            proc.kill()
    return subprocess.CompletedProcess(procs[0].args, procs[0].returncode, out, err)


@pytest.mark.parametrize(("trainer", "world"), [({}, 1), (MEGATRON_TP2, 2)], ids=["fsdp2", "megatron-tp2"])
def test_sigkill_between_step_and_ack_then_resume_trains_no_id_twice(
    tiny_model, nats_server, tmp_path, trainer, world
):
    cfg = job_config(tmp_path, tiny_model, nats_server.url, max_steps=6, trainer=trainer)
    publish_groups(nats_server.url, 14)  # 28 samples = 7 steps of 2 groups x 2 samples
    crashed = run_trainer(cfg, tmp_path, {"ASYNCRL_FAULT_KILL_BEFORE_ACK_STEP": "3"}, world)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    first = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in first] == [1, 2]  # step 3 ran and was ledgered, but never logged/acked

    resumed = run_trainer(cfg, tmp_path, {}, world)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    second = records[len(first) :]
    assert [r["step"] for r in second] == [3, 4, 5, 6]  # resumed from the step-2 checkpoint
    ledger = checkpoint.Ledger.load(tmp_path / "ckpt" / checkpoint.LEDGER)
    trained = [i for r in records for i in r["ids"]]
    assert len(trained) == len(set(trained)) == 24
    assert second[-1]["counters"]["redeliveries_skipped"] == 4  # the crashed step's 4 samples came back
    assert ledger.consumed_total == 28  # 12 before the crash (incl. the unacked step) + 16 after
    versions = [r["version"] for r in records]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert second[-1]["counters"]["queue_depth"] == 0  # 28 published, all acked: nothing left
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["progress"]["step"] == 6 and progress["progress"]["samplesConsumed"] == 28


def test_two_trainer_ranks_run_the_loop_with_checkpoints_and_syncs(tiny_model, nats_server, tmp_path):
    """torchrun-style: rank 0 pulls and broadcasts each batch, rank 1 follows; both save checkpoints and
    gather the full weights for every sync (the collectives line up, or the run would hang). Megatron's
    two ranks do the same in the sigkill test above."""
    cfg = job_config(tmp_path, tiny_model, nats_server.url, max_steps=3)
    publish_groups(nats_server.url, 6)
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = env_for(rank, 2, port)
        env.update(ASYNCRL_STEP_LOG=str(tmp_path / "steps.jsonl"), ASYNCRL_METRICS_PORT="0")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "asyncrl_workloads.entrypoints.trainer", "--config", str(cfg)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    records = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["version"] for r in records] == [1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-00000002", "step-00000003"]
    # both ranks wrote their shard of the sharded (DCP) checkpoint
    assert len(list((tmp_path / "ckpt" / "step-00000003").glob("*.distcp"))) == 2
