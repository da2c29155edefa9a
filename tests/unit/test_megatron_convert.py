"""HF <-> megatron-core weight layouts (trainer/megatron/convert.py) and what architecture.from_hf refuses.

Pure tensors, no process group and no megatron import; tests/dataplane/test_megatron.py runs the
converted weights in megatron's GPTModel against transformers.
"""

from __future__ import annotations

import pathlib
import re
import tomllib
import types

import pydantic
import pytest
import torch
from asyncrl_api import models, task
from asyncrl_workloads import tinymodel
from asyncrl_workloads.trainer.megatron import architecture, convert

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_the_trainer_image_installs_the_megatron_core_pyproject_pins() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (pin,) = extras["megatron"]
    dockerfile = (REPO / "images" / "trainer" / "Dockerfile").read_text()
    (version,) = re.findall(r"^ARG MEGATRON_CORE_VERSION=(\S+)$", dockerfile, re.MULTILINE)
    assert pin == f"megatron-core=={version}"


def arch(**overrides: object) -> architecture.Architecture:
    fields: dict[str, object] = dict(
        vocab_size=100,
        hidden_size=16,
        ffn_hidden_size=24,
        num_layers=2,
        num_heads=4,
        num_query_groups=2,
        head_dim=4,
        rms_norm_eps=1e-6,
        rope_theta=1e4,
        max_position_embeddings=64,
        tied_embeddings=False,
        qkv_bias=False,
    )
    return architecture.Architecture(**{**fields, **overrides})  # type: ignore[arg-type]


def hf_state(a: architecture.Architecture, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights with a LlamaForCausalLM / Qwen2ForCausalLM's names and shapes."""
    gen = torch.Generator().manual_seed(seed)
    H, F, d = a.hidden_size, a.ffn_hidden_size, a.head_dim

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    out = {"model.embed_tokens.weight": rand(a.vocab_size, H), "model.norm.weight": rand(H)}
    if not a.tied_embeddings:
        out["lm_head.weight"] = rand(a.vocab_size, H)
    for i in range(a.num_layers):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": rand(H),
            p + "post_attention_layernorm.weight": rand(H),
            p + "self_attn.q_proj.weight": rand(a.num_heads * d, H),
            p + "self_attn.k_proj.weight": rand(a.num_query_groups * d, H),
            p + "self_attn.v_proj.weight": rand(a.num_query_groups * d, H),
            p + "self_attn.o_proj.weight": rand(H, a.num_heads * d),
            p + "mlp.gate_proj.weight": rand(F, H),
            p + "mlp.up_proj.weight": rand(F, H),
            p + "mlp.down_proj.weight": rand(H, F),
        }
        if a.qkv_bias:
            out |= {
                p + "self_attn.q_proj.bias": rand(a.num_heads * d),
                p + "self_attn.k_proj.bias": rand(a.num_query_groups * d),
                p + "self_attn.v_proj.bias": rand(a.num_query_groups * d),
            }
    return out


@pytest.mark.parametrize(
    "a",
    [
        arch(),  # Llama-style GQA, untied
        arch(num_query_groups=4),  # multi-head attention (the tiny model)
        arch(tied_embeddings=True, qkv_bias=True),  # Qwen2-style
    ],
    ids=["gqa", "mha", "qwen2"],
)
@pytest.mark.parametrize("tp", [1, 2])
def test_hf_to_megatron_to_hf_is_bit_exact(a: architecture.Architecture, tp: int) -> None:
    hf = hf_state(a)
    shards = [convert.to_megatron(hf, a, tp, rank) for rank in range(tp)]
    back = convert.to_hf(shards, a)
    assert back.keys() == hf.keys()
    assert all(torch.equal(back[k], hf[k]) for k in hf)


def test_the_fused_layouts_are_megatrons_per_group_and_per_rank() -> None:
    a = arch(hidden_size=1, head_dim=1, ffn_hidden_size=4, num_layers=1, vocab_size=3)
    hf = hf_state(a)
    rows = {
        "q_proj": [0.0, 1.0, 2.0, 3.0],  # heads 0,1 are group 0's; heads 2,3 group 1's
        "k_proj": [10.0, 11.0],
        "v_proj": [20.0, 21.0],
    }
    for proj, values in rows.items():
        hf[f"model.layers.0.self_attn.{proj}.weight"] = torch.tensor(values)[:, None]
    hf["model.layers.0.mlp.gate_proj.weight"] = torch.tensor([0.0, 1.0, 2.0, 3.0])[:, None]
    hf["model.layers.0.mlp.up_proj.weight"] = torch.tensor([10.0, 11.0, 12.0, 13.0])[:, None]

    def flat(state: dict[str, torch.Tensor], name: str) -> list[float]:
        return state[f"decoder.layers.0.{name}.weight"].flatten().tolist()

    whole = convert.to_megatron(hf, a, tp=1)
    assert flat(whole, "self_attention.linear_qkv") == [0, 1, 10, 20, 2, 3, 11, 21]
    assert flat(whole, "mlp.linear_fc1") == [0, 1, 2, 3, 10, 11, 12, 13]
    rank0, rank1 = (convert.to_megatron(hf, a, tp=2, rank=r) for r in (0, 1))
    assert flat(rank1, "self_attention.linear_qkv") == [2, 3, 11, 21]  # query group 1, whole
    assert flat(rank0, "mlp.linear_fc1") == [0, 1, 10, 11]  # its gate slice, then its up slice
    assert flat(rank1, "mlp.linear_fc1") == [2, 3, 12, 13]


def test_the_vocabulary_is_padded_with_zero_rows_split_over_ranks_and_cut_back() -> None:
    a = arch(vocab_size=100)
    hf = hf_state(a)
    shards = [convert.to_megatron(hf, a, tp=2, rank=r) for r in (0, 1)]
    embedding = [s["embedding.word_embeddings.weight"] for s in shards]
    assert [e.shape[0] for e in embedding] == [128, 128]  # 100 -> 256 = 128 per rank
    assert torch.equal(embedding[0][:100], hf["model.embed_tokens.weight"])
    assert not embedding[0][100:].any() and not embedding[1].any()
    assert convert.to_hf(shards, a)["lm_head.weight"].shape == (100, 16)


def test_a_tied_model_has_no_output_layer_and_no_lm_head() -> None:
    a = arch(tied_embeddings=True)
    shard = convert.to_megatron({**hf_state(a), "lm_head.weight": torch.zeros(1)}, a)
    assert "output_layer.weight" not in shard
    assert "lm_head.weight" not in convert.to_hf([shard], a)


def test_tensor_parallel_sizes_that_do_not_divide_the_heads_are_refused() -> None:
    with pytest.raises(
        architecture.UnsupportedModel, match="num_key_value_heads 2 .* tensor parallel size 4"
    ):
        convert.to_megatron(hf_state(arch()), arch(), tp=4)


LLAMA = dict(
    model_type="llama",
    vocab_size=100,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=64,
    hidden_act="silu",
    rope_parameters={"rope_type": "default", "rope_theta": 5e5},
    tie_word_embeddings=False,
)


def test_from_hf_reads_a_llama_and_a_qwen2_config() -> None:
    llama = architecture.from_hf(types.SimpleNamespace(**LLAMA))
    assert (llama.head_dim, llama.rope_theta, llama.qkv_bias, llama.heads_per_group) == (64, 5e5, False, 1)
    qwen = architecture.from_hf(
        types.SimpleNamespace(**{**LLAMA, "model_type": "qwen2", "head_dim": None, "num_key_value_heads": 1})
    )
    assert (qwen.head_dim, qwen.qkv_bias, qwen.heads_per_group) == (64, True, 2)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model_type": "mixtral"}, "model_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"attention_bias": True}, "attention_bias"),
        ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "rope_parameters"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ],
)
def test_from_hf_refuses_what_it_cannot_build_naming_the_field(change: dict, field: str) -> None:
    with pytest.raises(architecture.UnsupportedModel, match=field):
        architecture.from_hf(types.SimpleNamespace(**{**LLAMA, **change}))


@pytest.mark.parametrize("arch", [a for a in task.ARCHITECTURES if a not in architecture.SUPPORTED])
def test_a_created_architecture_megatron_does_not_build_is_refused_naming_the_spec_field(arch, tmp_path):
    """spec.model.create's architectures are admitted on megatron only where it builds them (the CEL
    rule names spec.model.create.architecture); a model at spec.model.path is refused by the trainer
    with that field and the supported set."""
    import transformers
    from asyncrl_workloads.trainer import backend
    from asyncrl_workloads.trainer.megatron import backend as megatron_backend

    assert task.MEGATRON_ARCHITECTURES == architecture.SUPPORTED
    config_class = getattr(transformers, tinymodel.ARCHITECTURES[arch][0])
    config_class(
        hidden_size=128, num_attention_heads=2, intermediate_size=256, vocab_size=100
    ).save_pretrained(tmp_path)
    with pytest.raises(backend.Unsupported, match=rf"^spec\.model\.path: .*{arch}.*builds llama, qwen2"):
        megatron_backend.read_architecture(str(tmp_path), 1)
    with pytest.raises(
        pydantic.ValidationError, match=r"model\.create\.architecture: trainer\.backend megatron"
    ):
        models.AsyncRLJobSpec.model_validate(
            {
                "model": {"path": "/m", "create": {"architecture": arch}},
                "trainer": {"backend": "megatron"},
                "data": {"prompts": "builtin:say_char", "format": "raw"},
            }
        )
