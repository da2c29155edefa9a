"""spec.model.dtype on the trainer (trainer/precision.py): the choice, and what FSDP2 does with it.

The choice is a pure function of (dtype, device, the model config's dtype). Its GPU answer is applied
here to a small FSDP2 module on CPU (a one-process gloo world in this process): FSDP2's mixed precision
runs on CPU too, so the test sees bfloat16 compute over float32 shards without a GPU. The real model on
CUDA is tests/dataplane/test_trainer_gpu.py (marked gpu).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
import torch.distributed.tensor
from asyncrl_api import config
from asyncrl_testing import jobs
from asyncrl_workloads.rollout import main as rollout_main
from asyncrl_workloads.trainer import fsdp, precision

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


@pytest.mark.parametrize(
    ("dtype", "device", "model_dtype", "compute", "scaled", "noted"),
    [
        ("bfloat16", "cuda", "float32", BF16, False, False),
        ("float16", "cuda", "bfloat16", FP16, True, False),  # float16 gradients need loss scaling
        ("float32", "cuda", "bfloat16", FP32, False, False),
        ("auto", "cuda", "bfloat16", BF16, False, False),  # auto: what config.json names
        ("auto", "cuda", "float32", FP32, False, False),
        ("auto", "cuda", None, FP32, False, False),  # a config that names no dtype
        ("bfloat16", "cpu", "bfloat16", FP32, False, True),  # CPU: float32, and the reason is logged
        ("float16", "cpu", None, FP32, False, True),
        ("auto", "cpu", "bfloat16", FP32, False, True),
        ("float32", "cpu", None, FP32, False, False),  # asked for float32: nothing to say
        ("auto", "cpu", "float32", FP32, False, False),
    ],
)
def test_choice_of_precision(
    dtype: str, device: str, model_dtype: str | None, compute: torch.dtype, scaled: bool, noted: bool
) -> None:
    chosen = precision.choose(dtype, device, model_dtype)
    assert chosen.compute == compute
    assert chosen.loss_scaling is scaled
    assert (chosen.note is not None) is noted
    if compute == FP32:
        assert chosen.policy is None
    else:
        assert chosen.policy is not None
        assert (chosen.policy.param_dtype, chosen.policy.reduce_dtype) == (compute, FP32)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("gpus", [0, 1])
def test_weight_sync_sends_the_dtype_the_rollout_engine_loads_with(dtype: str, gpus: int) -> None:
    spec = jobs.deep_merge(
        jobs.BASE_SPEC,
        {
            "model": {"path": "/m", "dtype": dtype},
            "rollout": {"gpusPerReplica": gpus},
            "trainer": {"gpusPerReplica": gpus},
            "weightSync": {"backend": "nccl" if gpus else "gloo"},
        },
    )
    endpoints = config.Endpoints(nats_url="nats://127.0.0.1:4222", trainer_host="t", weight_sync_port=29600)
    engine = rollout_main.engine_settings(
        config.JobConfig(name="j", namespace="ns", spec=spec, endpoints=endpoints)
    )
    assert precision.engine_dtype(dtype, gpus, None) == getattr(torch, engine.dtype)


def test_auto_sends_the_config_dtype_to_gpu_engines_and_float32_to_cpu_engines() -> None:
    assert precision.engine_dtype("auto", 1, "bfloat16") == BF16
    assert precision.engine_dtype("auto", 1, None) == FP32  # vLLM rounds on load if its auto picks lower
    assert precision.engine_dtype("auto", 0, "bfloat16") == FP32


def test_config_dtype_reads_either_key(tmp_path: pathlib.Path) -> None:
    assert precision.config_dtype(tmp_path) is None  # no config.json
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert precision.config_dtype(tmp_path) == "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float16", "torch_dtype": "bfloat16"}))
    assert precision.config_dtype(tmp_path) == "float16"


class _Decoder(torch.nn.Module):
    """The shape fsdp.shard expects: `.model.layers` are the units, the rest is the root."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])
        self.model = torch.nn.Module()
        self.model.layers = self.layers
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)  # type: ignore[no-any-return]


@pytest.fixture
def world() -> Iterator[fsdp.World]:
    """A one-process gloo world in this process (no environment variables touched)."""
    store = dist.HashStore()  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield fsdp.World(rank=0, size=1, local_rank=0, device=torch.device("cpu"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("device", "compute"), [("cuda", BF16), ("cpu", FP32)])
def test_fsdp2_computes_in_the_chosen_dtype_over_float32_shards(
    world: fsdp.World, device: str, compute: torch.dtype
) -> None:
    torch.manual_seed(0)
    decoder = _Decoder()
    model = fsdp.shard(decoder, world, precision.choose("bfloat16", device, None).policy)
    seen: list[torch.dtype] = []
    decoder.layers[0].register_forward_pre_hook(lambda mod, args: seen.append(mod.weight.dtype))
    out = model(torch.randn(3, 8))
    assert (seen, out.dtype) == ([compute], compute)  # unsharded (all-gathered) params, and activations
    out.float().sum().backward()
    for p in model.parameters():  # the master weights and their gradients stay float32 shards
        assert isinstance(p, torch.distributed.tensor.DTensor)
        assert p.dtype == FP32
        assert p.grad is not None and p.grad.dtype == FP32
    sent = dict(fsdp.full_tensors(model, BF16))
    assert {t.dtype for t in sent.values()} == {BF16}
    kept = dict(fsdp.full_tensors(model))
    assert {t.dtype for t in kept.values()} == {FP32}
    assert all(torch.equal(sent[k], kept[k].to(BF16)) for k in kept)  # rounded once, from the masters


def test_weight_sync_sends_tied_embeddings_once_and_plans_before_it_gathers(world: fsdp.World) -> None:
    """A tied model (Qwen3 up to 4B, Gemma 3) is one matrix that transformers' state dict names twice;
    after FSDP2 it is still one parameter, so the sync payload (``tied_once``) holds it once, as the
    embedding, while the state dict (checkpoint, export) keeps both names. An untied model loses nothing."""
    import transformers

    for tied in (True, False):
        config = transformers.Qwen3Config(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1,
            num_key_value_heads=1, head_dim=32, tie_word_embeddings=tied,
        )  # fmt: skip
        torch.manual_seed(0)
        model = fsdp.shard(transformers.Qwen3ForCausalLM(config), world)
        every = dict(fsdp.full_tensors(model))
        payload = list(fsdp.full_tensors(model, BF16, tied_once=True))
        sent = dict(fsdp.full_tensors(model, tied_once=True))
        assert set(every) - set(sent) == ({"lm_head.weight"} if tied else set())
        # the plan weight sync makes before gathering (full_metas) is what the gather then yields
        assert fsdp.full_metas(model, BF16, tied_once=True) == [
            (n, t.dtype, tuple(t.shape)) for n, t in payload
        ]
        assert all(torch.equal(sent[k], every[k]) for k in sent)
        if tied:
            assert torch.equal(every["lm_head.weight"], sent["model.embed_tokens.weight"])
