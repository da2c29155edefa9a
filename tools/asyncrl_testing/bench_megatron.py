"""Megatron benchmark (a script, not a test): MegatronBackend's trainer step ÷ FSDP2Backend's, and what a
weight sync costs each backend before the first byte is sent.

    .venv/bin/python tools/asyncrl_testing/bench_megatron.py --rounds 9 --json /tmp/megatron.json

One process, one thread (OMP_NUM_THREADS=1, as a trainer rank on a CPU core), gloo world of one, so
megatron runs TP=1 and FSDP2 shards over one rank: the same tiny model (examples/tiny-cpu.yaml's
`create`: 2 layers, hidden 128, 2 heads), the same settings (lr 1e-3, two mini-batches, the decoupled
loss, microBatchTokens 1024) and, in each round, the same batch (16 prompts x 8 samples, prompts of 6-12
tokens, responses of 1-8, as the say_char job's) for both backends, in alternating order (ABBA) so drift
on the shared machine falls on both sides. Per round: ``step_ratio`` = megatron step seconds ÷ FSDP2
step seconds; ``gather_ratio`` the same for ``full_tensors`` (what the trainer does for a sync before the
sender broadcasts: FSDP2 all-gathers its shards, megatron gathers its TP shards and converts q/k/v and
gate/up back to the Hugging Face layout). The broadcast itself and the rollout's pause are the same
GlooWeightSender / NcclWeightSender on the same tensors for both backends, so P3 (pause ÷ transfer,
bench_weightsync.py) does not depend on the backend; the gather is what the megatron sender adds.
Reported: the medians and each round's ratios. The first round (warm-up) is left out.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from asyncrl_workloads import tinymodel  # noqa: E402
from asyncrl_workloads.bus import trajectory  # noqa: E402
from asyncrl_workloads.trainer import backend, fsdp  # noqa: E402


def make_batch(seed: int, prompts: int = 16, n: int = 8) -> list[trajectory.Trajectory]:
    rng = random.Random(seed)
    out = []
    for g in range(prompts):
        prompt = [1] + [rng.randrange(4, 90) for _ in range(rng.randrange(5, 12))]
        for s in range(n):
            length = rng.randrange(1, 9)
            out.append(
                trajectory.Trajectory(
                    id=f"r{seed}-g{g}-s{s}",
                    job="bench",
                    replica=0,
                    group_id=f"g{g}",
                    group_size=n,
                    sample_index=s,
                    prompt_ids=prompt,
                    response_ids=[rng.randrange(4, 90) for _ in range(length)],
                    behaviour_logprobs=[-4.0 - rng.random() for _ in range(length)],
                    versions=[0] * length,
                    mask=[1] * length,
                    reward=float(rng.random() < 0.3),
                    created_at=0.0,
                )
            )
    return out


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    world = fsdp.init_world()
    with tempfile.TemporaryDirectory() as tmp:
        model = tinymodel.create_tiny_model(pathlib.Path(tmp) / "tiny", seed=0)  # the e2e tests' model
        settings = backend.TrainSettings(
            model_path=str(model), lr=1e-3, updates_per_step=2, micro_batch_tokens=1024, tp=1
        )
        sides = {"fsdp2": backend.BACKENDS["fsdp2"](settings, world)}
        sides["megatron"] = backend.BACKENDS["megatron"](settings, world)
        rounds: list[dict[str, Any]] = []
        for r in range(args.rounds + 1):
            batch = make_batch(r)
            order = ["fsdp2", "megatron"] if r % 2 == 0 else ["megatron", "fsdp2"]
            step = {name: timed(lambda b=sides[name], x=batch: b.step(x)) for name in order}
            gather = {name: timed(lambda b=sides[name]: list(b.full_tensors())) for name in order}
            row = {
                "step_s": {k: round(v, 4) for k, v in step.items()},
                "gather_ms": {k: round(v * 1000, 2) for k, v in gather.items()},
                "step_ratio": round(step["megatron"] / step["fsdp2"], 3),
                "gather_ratio": round(gather["megatron"] / gather["fsdp2"], 3),
            }
            print(f"round {r}{' (warm-up)' if r == 0 else ''}: {row}", flush=True)
            if r:
                rounds.append(row)
        sent = sum(t.numel() * t.element_size() for _, t in sides["megatron"].full_tensors())
    fsdp.shutdown()
    result: dict[str, Any] = {
        "settings": {"rounds": args.rounds, "samples": 128, "model_bytes": sent, "threads": 1},
        "rounds": rounds,
        "step_ratio": round(statistics.median(r["step_ratio"] for r in rounds), 3),
        "gather_ratio": round(statistics.median(r["gather_ratio"] for r in rounds), 3),
        "step_s": {
            k: round(statistics.median(r["step_s"][k] for r in rounds), 4) for k in ("fsdp2", "megatron")
        },
        "gather_ms": {
            k: round(statistics.median(r["gather_ms"][k] for r in rounds), 2) for k in ("fsdp2", "megatron")
        },
    }
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
