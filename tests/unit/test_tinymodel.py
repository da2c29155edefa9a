"""The tiny-model factory: deterministic from its seed, idempotent, never clobbers, char-level tokenizer;
with chat, ChatML and tool-call specials after the characters and a chat template the agent loop can use."""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import typing
from typing import Any

import pydantic
import pytest
from asyncrl_api import task
from asyncrl_workloads import tinymodel
from asyncrl_workloads.episode import chat


def _digest(path: pathlib.Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return root, tinymodel.create_tiny_model(root / "a", seed=3)


@pytest.fixture(scope="module")
def made_chat(tmp_path_factory):
    return tinymodel.create_tiny_model(tmp_path_factory.mktemp("tiny-chat") / "m", seed=3, chat=True)


@pytest.fixture(scope="module")
def chat_tokenizer(made_chat):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(made_chat)


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


def test_the_model_is_readable_by_every_user_even_one_made_private_before(made):
    """Pods in images (asyncrl run --containers) read it as uid 10001."""
    _, model = made
    modes = lambda: {p.name: p.stat().st_mode & 0o777 for p in [model, *model.iterdir()]}  # noqa: E731
    assert set(modes().values()) == {0o755, 0o644} and modes()[model.name] == 0o755
    model.chmod(0o700)  # as mkdtemp's staging directory left it
    (model / "model.safetensors").chmod(0o600)
    assert tinymodel.create_tiny_model(model, seed=3) == model
    assert set(modes().values()) == {0o755, 0o644}


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


CHAT_IDS = {"<|im_start|>": 100, "<|im_end|>": 101, "<tool_call>": 102, "</tool_call>": 103}


def test_chat_adds_four_specials_after_the_characters_and_keeps_every_other_id():
    plain, with_chat = tinymodel.vocabulary(), tinymodel.vocabulary(chat=True)
    assert len(plain) == 100
    assert with_chat == {**plain, **CHAT_IDS}


def test_a_chat_model_ends_its_turns_with_im_end(made_chat, chat_tokenizer):
    config = json.loads((made_chat / "config.json").read_text())
    generation = json.loads((made_chat / "generation_config.json").read_text())
    assert (config["vocab_size"], config["eos_token_id"], generation["eos_token_id"]) == (104, 101, 101)
    assert (chat_tokenizer.eos_token, chat_tokenizer.eos_token_id) == ("<|im_end|>", 101)
    assert json.loads((made_chat / tinymodel.MARKER).read_text())["chat"] is True


def test_chat_specials_are_one_token_each_and_characters_encode_as_without_chat(made, chat_tokenizer):
    import transformers

    _, plain_dir = made
    plain = transformers.AutoTokenizer.from_pretrained(plain_dir)
    vocab = tinymodel.vocabulary()
    ids = chat_tokenizer("<|im_start|>user\nhi<tool_call></tool_call><|im_end|>", add_special_tokens=False)
    assert ids.input_ids == [100, *(vocab[c] for c in "user\nhi"), 102, 103, 101]
    text = "Say: q!\nok"
    assert chat_tokenizer(text).input_ids == plain(text).input_ids


SEARCH = {"type": "function", "function": {"name": "search", "description": "d", "parameters": {}}}
LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "d", "parameters": {}}}


@pytest.mark.parametrize("arguments", ['{"k": 1}', {"k": 1}], ids=["openai-json-text", "object"])
def test_the_chat_template_is_chatml_with_tools_by_name_and_hermes_calls(chat_tokenizer, arguments: Any):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "secret?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "c"},
    ]
    text = chat_tokenizer.apply_chat_template(
        messages, tools=[SEARCH, LOOKUP], add_generation_prompt=True, tokenize=False
    )
    assert text == (
        "<bos><|im_start|>system\nbe brief\ntools: search, lookup<|im_end|>\n"
        "<|im_start|>user\nsecret?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "lookup", "arguments": {"k": 1}}</tool_call><|im_end|>\n'
        "<|im_start|>tool\nc<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([{"role": "user", "content": "hi"}], "<bos><|im_start|>user\nhi<|im_end|>\n"),
        (
            [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
            "<bos><|im_start|>system\ns<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
        ),
    ],
    ids=["user", "system-and-user"],
)
def test_without_tools_the_chat_template_has_no_tool_line(chat_tokenizer, messages, expected):
    assert chat_tokenizer.apply_chat_template(messages, tokenize=False) == expected
    generated = chat_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert generated == expected + "<|im_start|>assistant\n"


def test_the_agent_loop_can_append_tool_turns_to_the_chat_template(chat_tokenizer):
    """ChatFormat accepts the template (a conversation renders as a prefix of its continuation) and the
    tokens between two assistant turns are the rest of the closing line, the tool turn and a header."""
    formatter = chat.ChatFormat(chat_tokenizer, "prompt")
    between = formatter.between(
        [{"role": "user", "content": "secret?"}],
        [LOOKUP],
        "<|im_end|>",
        [{"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "c"}],
    )
    assert between == "\n<|im_start|>tool\nc<|im_end|>\n<|im_start|>assistant\n"


def test_spec_model_create_chat_makes_the_chat_model(made_chat):
    assert tinymodel.create_from_spec(made_chat, task.TinyModelSpec(seed=3, chat=True)) == made_chat
    with pytest.raises(tinymodel.TinyModelError, match="different parameters"):
        tinymodel.create_from_spec(made_chat, task.TinyModelSpec(seed=3))


def test_a_marker_written_before_chat_existed_still_reads_as_a_plain_model(made, tmp_path):
    _, first = made
    old = shutil.copytree(first, tmp_path / "old")
    marker = json.loads((old / tinymodel.MARKER).read_text())
    del marker["chat"]
    (old / tinymodel.MARKER).write_text(json.dumps(marker))
    before = {p.name: p.stat().st_mtime_ns for p in old.iterdir()}
    assert tinymodel.read_marker(old) == tinymodel.TinyModelParams(seed=3, chat=False)
    assert tinymodel.create_tiny_model(old, seed=3) == old
    assert {p.name: p.stat().st_mtime_ns for p in old.iterdir()} == before
    with pytest.raises(tinymodel.TinyModelError, match="different parameters"):
        tinymodel.create_tiny_model(old, seed=3, chat=True)


def test_every_architecture_the_spec_offers_is_created_and_bad_sizes_are_refused(tmp_path):
    assert typing.get_args(task.TinyModelSpec.model_fields["architecture"].annotation) == task.ARCHITECTURES
    assert tuple(tinymodel.ARCHITECTURES) == task.ARCHITECTURES
    with pytest.raises(tinymodel.TinyModelError, match="num_kv_heads 3"):
        tinymodel.create_tiny_model(tmp_path / "gqa", hidden_size=256, num_heads=4, num_kv_heads=3)
    with pytest.raises(tinymodel.TinyModelError, match="architecture 'gpt2'"):
        tinymodel.create_tiny_model(tmp_path / "gpt2", architecture="gpt2")
    assert not (tmp_path / "gqa").exists() and not (tmp_path / "gpt2").exists()
    with pytest.raises(pydantic.ValidationError, match="heads must be a multiple of kvHeads"):
        task.TinyModelSpec(hidden=256, heads=4, kv_heads=3)
    spec = task.TinyModelSpec.model_validate({"architecture": "qwen3_moe", "kvHeads": 1})
    assert (spec.architecture, spec.kv_heads) == ("qwen3_moe", 1)


def test_spec_model_create_max_positions_is_the_models_max_position_embeddings(tmp_path):
    """A CLI agent's first request is thousands of characters, so tokens: the created model takes
    maxPositions of them; unset it is the 512 a tiny model always had (and its marker is unchanged)."""
    spec = task.TinyModelSpec.model_validate({"chat": True, "maxPositions": 16384})
    long = tinymodel.create_from_spec(tmp_path / "long", spec)
    assert json.loads((long / "config.json").read_text())["max_position_embeddings"] == 16384
    assert tinymodel.read_marker(long) == tinymodel.TinyModelParams(chat=True, max_position_embeddings=16384)
    assert task.TinyModelSpec().positions() == task.DEFAULT_MAX_POSITIONS == 512
    assert tinymodel.TinyModelParams().max_position_embeddings == task.DEFAULT_MAX_POSITIONS


def test_a_created_gemma3_is_text_only_with_its_local_and_global_layers(tmp_path):
    """spec.model.create.architecture gemma3: transformers' Gemma3ForCausalLM (model_type gemma3_text),
    every layer local but the last, its window as long as the model's positions."""
    path = tinymodel.create_tiny_model(
        tmp_path / "gemma3", architecture="gemma3", num_layers=3, num_kv_heads=1
    )
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["model_type"] == "gemma3_text"
    assert config["layer_types"] == ["sliding_attention", "sliding_attention", "full_attention"]
    assert config["sliding_window"] == config["max_position_embeddings"] == 512
    assert (config["head_dim"], config["num_key_value_heads"]) == (64, 1)
