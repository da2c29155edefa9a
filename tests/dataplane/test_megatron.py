"""megatron-core's GPTModel on CPU under gloo against transformers: logprobs and one training step, at TP=1
and TP=2 (two processes), for the tiny Llama and a GQA, tied, q/k/v-biased Qwen2; activation checkpointing
and chunked log-probs (spec.trainer.memory) against the plain model.

The worker (megatron_worker.py) does the work in two fresh processes: megatron keeps its parallel state
in module globals, and this process's default group must stay untouched for the other tests.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch
from asyncrl_workloads.local import process

pytestmark = pytest.mark.dataplane
HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]


def start_worker(model: pathlib.Path, out: pathlib.Path, world: int) -> list[subprocess.Popen[bytes]]:
    port = str(process.free_port())
    paths = os.pathsep.join(str(REPO / p) for p in ("operator", "workloads", "tools"))
    return [
        subprocess.Popen(
            [sys.executable, str(HERE / "megatron_worker.py"), str(model), str(out)],
            env={
                **os.environ,
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "LOCAL_RANK": "0",
                "OMP_NUM_THREADS": "1",
                "PYTHONPATH": paths,
            },
        )  # fmt: skip
        for rank in range(world)
    ]


@pytest.fixture(scope="module")
def runs(tiny_model: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The worker's results from two processes: {1: TP=1, 2: TP=2, "hf": the transformers reference}."""
    out = tmp_path_factory.mktemp("megatron") / "runs.pt"
    assert [p.wait(timeout=300) for p in start_worker(tiny_model, out, 2)] == [0, 0]
    return torch.load(out)


def test_on_cpu_two_subclasses_stand_in_for_megatrons_cuda_only_modules(runs):
    # megatron's DotProductAttention and RotaryEmbedding allocate on CUDA (trainer/megatron/model.py)
    assert runs[2]["llama"]["modules"] == ["SdpaAttention", "CpuRotaryEmbedding"]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_logprobs_equal_the_hf_models(runs, name, tp):
    out, ref = runs[tp][name], runs["hf"][name]
    assert out["tp"] == tp
    real = ref["real"]  # (B, T-1): the next token is not right padding (there HF's attention mask differs)
    assert out["logprobs"].shape == ref["logprobs"].shape == real.shape == (4, 16)
    assert torch.allclose(out["logprobs"][real], ref["logprobs"][real], atol=1e-5, rtol=0)  # measured 5e-7
    assert out["spread_before"] == 0.0  # the norms are bit-identical on every TP rank


@pytest.mark.parametrize("kind", ["megatron", "torch"])
@pytest.mark.parametrize("name", ["llama", "qwen2"])
@pytest.mark.parametrize("tp", [1, 2])
def test_activation_checkpointing_recomputes_each_layer_and_keeps_the_logprobs_and_gradients(
    runs, name, tp, kind
):
    """spec.trainer.memory.activationCheckpointing: megatron's full uniform recompute of every layer (the
    GPU path, rehearsed with the CUDA RNG state stood in for by the CPU one) and torch's non-reentrant
    checkpoint around every layer (the CPU path): each layer runs again in backward, and the logprobs
    and every local gradient are the plain model's."""
    out = runs[tp][name]["recompute"][kind]
    assert out["attention_calls"] == 2  # forward, and its recompute in backward
    assert out["difference"] <= 1e-5  # float32 rounding at most


@pytest.mark.parametrize("name", ["llama", "qwen2"])
@pytest.mark.parametrize("tp", [1, 2])
def test_chunked_logprobs_project_a_chunk_at_a_time_and_keep_the_values_and_gradients(runs, name, tp):
    """spec.trainer.memory.logprobChunkTokens: the output layer, the vocabulary-parallel log-softmax and
    entropy over 7 tokens at a time (the tied Qwen2: through the shared embedding) give the whole
    batch's logprobs, entropy and gradients (temperature 0.7, a random weighting of both)."""
    out = runs[tp][name]["chunking"]
    assert out["rows"] == {0: 4 * 16, 7: 7}  # the whole batch's 64 scored tokens at once, or 7
    assert out["logprobs"] <= 1e-5 and out["entropy"] <= 1e-5  # float32 rounding at most
    assert out["grads"] <= 1e-6 * out["grad_scale"]  # measured 5.7e-6 of 23 (qwen2, TP=1)
    assert out["grad_scale"] > 0.1


@pytest.mark.parametrize("name", ["llama", "qwen2"])
@pytest.mark.parametrize("tp", [1, 2])
def test_one_megatron_step_updates_the_weights_as_the_hf_step(runs, name, tp):
    # TP=1 runs in both processes as DP=2, each on its half of the batch; TP=2 is DP=1
    out, ref = runs[tp][name], runs["hf"][name]
    assert out["dp"] == 2 // tp
    assert abs(out["loss"] - ref["loss"]) < 1e-6
    # the global gradient norm counts each shard and each replicated parameter once, after DP averaging
    assert out["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-6)
    assert ref["grad_norm"] > 2.0  # above the worker's clip: both steps were clipped
    tied = name == "qwen2"  # to_hf gives no lm_head for a tied model
    assert sorted(out["weights"]) == sorted(k for k in ref["weights"] if not (tied and k == "lm_head.weight"))
    assert max_diff(out["weights"], ref["initial"]) > 1e-3  # the step moved the weights
    assert max_diff(out["weights"], ref["weights"]) < 2e-6  # measured 1.2e-7; the step moves them 0.04
    assert out["spread_after"] == 0.0  # replicated parameters stayed identical across TP ranks


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_tp1_and_tp2_take_the_same_step(runs, name):
    one, two = runs[1][name], runs[2][name]
    assert abs(one["loss"] - two["loss"]) < 1e-6
    assert max_diff(one["weights"], two["weights"]) < 2e-6


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_megatrons_own_modules_match_transformers(tiny_model, tmp_path):
    """One command on a GPU machine: pytest -m gpu tests/dataplane/test_megatron.py (one GPU: TP=1, nccl)."""
    out = tmp_path / "gpu.pt"
    assert [p.wait(timeout=300) for p in start_worker(tiny_model, out, 1)] == [0]
    runs = torch.load(out)
    for name in ("llama", "qwen2"):
        got, ref = runs[1][name], runs["hf"][name]
        assert got["modules"] == ["DotProductAttention", "RotaryEmbedding"]
        real = ref["real"]
        assert torch.allclose(got["logprobs"][real], ref["logprobs"][real], atol=1e-4, rtol=0)
        assert abs(got["loss"] - ref["loss"]) < 1e-4
        assert max_diff(got["weights"], ref["weights"]) < 1e-4


@pytest.mark.parametrize(
    ("name", "tp"),
    [
        ("backend", 2), ("backend", 1), ("backend_qwen2", 2), ("backend_qwen2", 1), ("backend_teacher", 1),
        ("backend_ddp", 2), ("backend_ddp", 1), ("backend_ddp_qwen2", 2), ("backend_ddp_qwen2", 1),
    ],
)  # fmt: skip
def test_the_megatron_backend_takes_the_fsdp2_backends_step(runs, name, tp):
    """One trainer step (two AdamW updates, length-sorted micro-batches, the tis loss, the grad norm
    clipped) through MegatronBackend (TP=2, or TP=1 with DP=2) and FSDP2Backend on two ranks, same batch.
    The Qwen2 is tied (full_tensors names lm_head.weight as transformers does) with q/k/v biases;
    backend_teacher is the Llama with `correction: none` and a teacher's reverse-KL term. backend_ddp is
    MegatronDDPBackend, the GPU path (megatron's own DistributedDataParallel and distributed optimizer),
    rehearsed on CPU (asyncrl_testing.cuda_on_cpu), against the same FSDP2 step (measured: loss 3.4e-8,
    grad norm 5.769746 vs 5.769747, weights max 2.1e-5 / 1.3e-5 at TP=2 / TP=1, as MegatronBackend's).
    The worker's settings warm the rate up over 4 steps: these two updates run at 2.5e-3."""
    results = runs[name]
    model = "qwen2" if "qwen2" in name else "llama"
    plain = runs["backend_qwen2" if model == "qwen2" else "backend"]  # backend_ddp* ran no FSDP2 of its own
    meg, ref = results[tp], results.get("fsdp2", plain["fsdp2"])
    assert abs(meg["loss"] - ref["loss"]) < 2e-6  # measured <= 1e-7 (0.109)
    assert meg["metrics"]["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], rel=1e-5)
    assert ref["metrics"]["grad_norm"] > 0.5  # above the clip: both backends clipped
    assert meg["metrics"]["skipped_updates"] == ref["metrics"]["skipped_updates"] == 0.0
    assert sorted(meg["weights"]) == sorted(ref["weights"])
    # both backends plan a weight sync before gathering: the plan is what the gather then yields, in order
    for sent in (meg, ref):
        assert sent["sync_metas"] == [(n, t.dtype, tuple(t.shape)) for n, t in sent["weights"].items()]
    initial = runs["hf"][model]["initial"]
    assert max_diff(ref["weights"], initial) > 1e-3  # the step moved the weights
    # AdamW's first updates are lr * g / (|g| + eps): where a gradient is ~eps (1e-8) its float noise
    # (another reduction order) moves the update by a fraction of lr. Measured (lr 2.5e-3 in warmup, the
    # step moves weights 5e-3): max 2.1e-5 / 1.3e-5 / 3.5e-5, entries above 1e-5: 5 of 354k / 1 / 15 of
    # 323k (llama TP=2 / TP=1 / qwen2 TP=2); without warmup (lr 1e-2) 1.1e-4 / 5.3e-5 / 8.6e-5 and 31 /
    # 11 / 169. A wrong layout or gradient scale differs by ~lr almost everywhere.
    diffs = torch.cat([(meg["weights"][k] - ref["weights"][k]).abs().flatten() for k in ref["weights"]])
    assert float(diffs.max()) < 1e-3
    assert float((diffs > 1e-5).float().mean()) < 3e-3


@pytest.mark.parametrize("name", ["backend", "backend_qwen2"])
def test_a_megatron_checkpoint_written_at_tp2_resumes_at_tp1_and_trains_on_the_same(runs, name):
    """The checkpoint is in HF layout (weights, AdamW's moments, step, schedule) through
    trainer/checkpoint.py: written by TP=2 after its step, loaded by a TP=1 x DP=2 backend (the tied
    Qwen2 too: its one matrix saved under both names, loaded once; tis as the step above), a new backend
    as a restarted trainer is. The step after the resume runs at the schedule's warmup rate (5e-3), not
    step 0's (2.5e-3): LambdaLR's load_state_dict alone left the rate at step 0's (found by this test)."""
    two, one = runs[name][2], runs[name][1]
    saved, loaded = two["state"], one["resumed_state"]
    assert max_diff(one["resumed"], two["weights"]) == 0.0
    for key in ("exp_avg", "exp_avg_sq"):
        assert max_diff(loaded["optim"][key], saved["optim"][key]) == 0.0
        assert max(float(t.abs().max()) for t in saved["optim"][key].values()) > 0.0  # two updates' moments
    assert float(loaded["optim"]["step"]) == float(saved["optim"]["step"]) == 2.0
    assert loaded["scheduler"] == saved["scheduler"]
    # the same second step from there: measured 1.2e-7 (Llama), 1.7e-5 (the tied Qwen2: AdamW divides by
    # sqrt(v) + eps, and its embedding rows that few tokens touch have tiny v, which magnifies the other
    # reduction order's float noise); it moves the weights by 1e-2. Wrong moments or the wrong rate
    # differ by ~lr (5e-3)
    assert max_diff(two["second"], two["weights"]) > 1e-3
    assert max_diff(one["second"], two["second"]) < 1e-4


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # DCP in one process
@pytest.mark.parametrize("name", ["backend", "backend_qwen2"])
def test_asyncrl_export_turns_a_megatron_checkpoint_into_the_trained_hf_model(runs, tmp_path, name):
    import safetensors.torch
    from asyncrl_workloads.trainer import export

    export.export(pathlib.Path(runs[name]["checkpoints"]), tmp_path / "hf", dtype="float32")
    exported = safetensors.torch.load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert "model.embed_tokens.weight" in exported
    assert max_diff(exported, runs[name][2]["weights"]) == 0.0  # TP=2's weights when it saved


@pytest.mark.parametrize("name", ["backend", "backend_qwen2"])
def test_megatrons_own_ddp_and_distributed_optimizer_checkpoint_as_the_plain_path_and_resume_it(runs, name):
    """MegatronDDPBackend (rehearsed on CPU, as above) is megatron's DistributedDataParallel and
    DistributedOptimizer; its checkpoint (each DP rank's shard of the float32 main weights and of Adam's
    moments put back in place, in HF layout) after the step equals the plain path's after the same step,
    and at TP=1 x DP=2 it resumes from the plain path's TP=2 checkpoint: the weights, moments and step
    bit-equal, and the same second step follows. So a job moves between CPU and GPU, TP and DP sizes.
    The Qwen2's tied embedding is one parameter used twice, in megatron's grad buffer once."""
    ddp, plain = runs[name.replace("backend", "backend_ddp")], runs[name]
    assert ddp[2]["megatron"] == ddp[1]["megatron"] == ["DistributedDataParallel", "DistributedOptimizer"]
    mine, theirs = ddp[2]["state"], plain[2]["state"]
    assert sorted(mine["model"]) == sorted(theirs["model"])
    # two computations of the same step: measured 6e-8 (Llama), 1.1e-5 (Qwen2: AdamW's eps noise, above)
    assert max_diff(mine["model"], theirs["model"]) < 1e-4
    for key in ("exp_avg", "exp_avg_sq"):  # measured 5e-10 and 2e-13 on moments of 5e-3 and 1.4e-6
        scale = max(float(t.abs().max()) for t in theirs["optim"][key].values())
        assert max_diff(mine["optim"][key], theirs["optim"][key]) < 1e-3 * scale
    assert float(mine["optim"]["step"]) == 2.0 and mine["scheduler"] == theirs["scheduler"]
    resumed = ddp[1]
    assert max_diff(resumed["resumed"], plain[2]["weights"]) == 0.0
    for key in ("exp_avg", "exp_avg_sq"):
        assert max_diff(resumed["resumed_state"]["optim"][key], theirs["optim"][key]) == 0.0
    assert float(resumed["resumed_state"]["optim"]["step"]) == 2.0
    # the second step from there: measured 1.2e-7 (Llama), 2e-5 (Qwen2) from the plain path's; it moves
    # the weights 1e-2
    assert max_diff(resumed["second"], plain[2]["second"]) < 1e-4
    assert max_diff(ddp[2]["second"], plain[2]["second"]) < 1e-4


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_megatrons_own_ddp_trains_in_the_models_dtype_and_checkpoints_its_float32_copy(runs, dtype):
    """spec.model.dtype as a GPU would take it (the worker forces precision.choose's GPU answer; on CPU it
    trains in float32): megatron's Float16Module, float32 main weights sharded over TP=1 x DP=2, and for
    float16 megatron's dynamic loss scale from 2**16 as FSDP2's scaler (its default, 2**32 with
    hysteresis 2, skipped every update of a step: measured). bfloat16's step is FSDP2's float32 one
    within its rounding (measured loss 0.10985 vs 0.10934, grad norm 5.753 vs 5.770). float16's first
    update overflows at 2**16 (measured): it is skipped on both ranks, the scale halves, and the rest
    train - FSDP2's rule and its scaler's. The checkpoint holds float32 weights, loads back bit-exactly
    (float16's scale with it), and a second step follows with no update skipped."""
    out, ref = runs[f"backend_ddp_{dtype}"][1], runs["backend"]["fsdp2"]
    assert out["megatron"] == ["DistributedDataParallel", "DistributedOptimizer"]
    skipped = out["metrics"]["skipped_updates"]  # of the step's two updates
    assert skipped == 0.0 if dtype == "bfloat16" else skipped in (0.0, 1.0)
    assert out["second_metrics"]["skipped_updates"] == 0.0
    if skipped == 0.0:
        assert abs(out["loss"] - ref["loss"]) < 2e-2 * abs(ref["loss"])
        assert out["metrics"]["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], rel=2e-2)
    else:
        assert out["metrics"]["grad_norm"] == float("inf")  # the step reports the skipped update's norm
    saved, reloaded = out["state"], out["reloaded"]
    assert all(t.dtype == torch.float32 for t in saved["model"].values())
    assert max_diff(reloaded["model"], saved["model"]) == 0.0
    for key in ("exp_avg", "exp_avg_sq"):
        assert max_diff(reloaded["optim"][key], saved["optim"][key]) == 0.0
    if dtype == "float16":
        assert float(saved["megatron_grad_scaler"]["scale"]) == 2.0**16 / 2**skipped
        assert reloaded["megatron_grad_scaler"] == saved["megatron_grad_scaler"]
    else:
        assert "megatron_grad_scaler" not in saved
    assert max_diff(out["second"], out["weights"]) > 1e-3  # the second step moved the weights


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_megatrons_own_ddp_and_optimizer_take_the_fsdp2_step(tiny_model, tmp_path):
    """One command on a GPU machine: pytest -m gpu tests/dataplane/test_megatron.py (one GPU, nccl).
    MegatronDDPBackend (what BACKENDS["megatron"] builds on CUDA) unredirected: in float32 against
    FSDP2Backend's step on the same GPU; in bfloat16 (megatron's Float16Module, float32 main weights in
    its distributed optimizer) it trains, its checkpoint state loads back unchanged, and steps again."""
    out = tmp_path / "gpu.pt"
    assert [p.wait(timeout=300) for p in start_worker(tiny_model, out, 1)] == [0]
    runs = torch.load(out)
    meg, ref = runs["backend_ddp"][1], runs["backend_ddp"]["fsdp2"]
    assert meg["megatron"] == ["DistributedDataParallel", "DistributedOptimizer"]
    assert abs(meg["loss"] - ref["loss"]) < 1e-4
    assert meg["metrics"]["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], rel=1e-4)
    assert meg["metrics"]["skipped_updates"] == 0.0
    diffs = torch.cat([(meg["weights"][k] - ref["weights"][k]).abs().flatten() for k in ref["weights"]])
    assert float(diffs.max()) < 1e-3 and float((diffs > 1e-5).float().mean()) < 1e-2
    bf16 = runs["backend_ddp_bfloat16"][1]
    assert bf16["metrics"]["skipped_updates"] == bf16["second_metrics"]["skipped_updates"] == 0.0
    assert abs(bf16["loss"] - ref["loss"]) < 5e-2 * abs(ref["loss"])  # bfloat16 compute, same batch
    assert max_diff(bf16["reloaded"]["model"], bf16["state"]["model"]) == 0.0
    for key in ("exp_avg", "exp_avg_sq"):
        assert max_diff(bf16["reloaded"]["optim"][key], bf16["state"]["optim"][key]) == 0.0
    assert max_diff(bf16["second"], bf16["weights"]) > 1e-3  # the second step moved the weights
