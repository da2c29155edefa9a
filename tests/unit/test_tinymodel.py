"""The tiny-model factory: deterministic from its seed, idempotent, never clobbers, char-level tokenizer."""

from __future__ import annotations

import hashlib
import json
import pathlib

import pytest
from asyncrl_workloads import tinymodel


def _digest(path: pathlib.Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return root, tinymodel.create_tiny_model(root / "a", seed=3)


def test_same_seed_gives_the_same_weights_and_another_seed_does_not(made):
    root, first = made
    again = tinymodel.create_tiny_model(root / "b", seed=3)
    other = tinymodel.create_tiny_model(root / "c", seed=4)
    assert _digest(first) == _digest(again)
    assert _digest(first) != _digest(other)


def test_a_second_call_reuses_the_directory_untouched(made):
    root, first = made
    before = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}
    assert tinymodel.create_tiny_model(first, seed=3) == first
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == before


def test_different_parameters_or_foreign_files_are_refused_not_overwritten(made, tmp_path):
    _, first = made
    with pytest.raises(tinymodel.TinyModelError, match="different parameters"):
        tinymodel.create_tiny_model(first, seed=5)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(tinymodel.TinyModelError, match="not a tiny model"):
        tinymodel.create_tiny_model(foreign)
    assert (foreign / "notes.txt").read_text() == "mine"


def test_unsupported_head_size_is_rejected_before_anything_is_written(tmp_path):
    with pytest.raises(tinymodel.TinyModelError, match="head_dim 16"):
        tinymodel.create_tiny_model(tmp_path / "m", hidden_size=32, num_heads=2)
    assert not (tmp_path / "m").exists()


def test_config_has_the_requested_shape(made):
    _, first = made
    config = json.loads((first / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"]) == (2, 128, 2)
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    assert config["vocab_size"] == len(tinymodel.vocabulary())


def test_tokenizer_is_one_token_per_character_with_bos_and_round_trips(made):
    import transformers

    _, first = made
    tokenizer = transformers.AutoTokenizer.from_pretrained(first)
    vocab = tinymodel.vocabulary()
    text = "Say: q!\nok"
    ids = tokenizer(text).input_ids
    assert ids == [vocab["<bos>"]] + [vocab[ch] for ch in text]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (vocab["<eos>"], vocab["<pad>"])
