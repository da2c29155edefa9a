"""A trainer checkpoint as a Hugging Face model directory that vLLM or transformers serve as it is.

Called by `asyncrl export CHECKPOINT OUT` (cli.py). CHECKPOINT is a `step-…` directory the trainer wrote
(trainer/checkpoint.py: torch.distributed.checkpoint, sharded by however many ranks saved it) or the
checkpoint root, whose newest complete step is taken. The policy's architecture, tokenizer and chat
template come from the model the job started from (`model_path` in the step's meta.json, written by
the trainer; `--model` for checkpoints older than that field or a moved model).

The export runs in one process without a process group: DCP reshards whatever the ranks saved into one
plain state dict (only the `model` entries are read; the optimizer state stays behind), which is loaded
into the Hugging Face model built from the base config and written with `save_pretrained`
(safetensors; tied embeddings stay tied) next to the base model's tokenizer files and generation config.
`export.json` records the source step and policy version. The weights are those the trainer trains
(fp32 master weights); `dtype` casts them (`auto`: the dtype the base model's config.json names, read
as the trainer reads it).

A LoRA job's step (meta.json names `lora`) holds the adapters alone: the base model's own weights are
loaded, peft's adapters applied as the trainer applied them (trainer/lora.py) and filled from the
step, then merged into the weights (`merge_and_unload`), so OUT is a plain model; `adapter` also writes
the peft adapter directory (`adapter_config.json` + `adapter_model.safetensors`) that vLLM's
`--lora-modules` or peft's `PeftModel.from_pretrained` load over the base.
"""

from __future__ import annotations

import importlib
import json
import pathlib
import shutil
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from asyncrl_workloads.trainer import checkpoint, lora, precision

INFO = "export.json"


class ExportError(Exception):
    """Something the user can fix (a path, a missing model); str() is the one line to print."""


def step_dir(path: pathlib.Path) -> pathlib.Path:
    """`path` itself when it is a complete step directory, else the newest complete step under it."""
    if (path / "meta.json").is_file():
        return path
    found = checkpoint.step_dirs(path)
    if not found:
        raise ExportError(f"{path}: no complete checkpoint (a step-NNNNNNNN directory with meta.json)")
    return found[-1]


def base_model(step: pathlib.Path, meta: dict[str, Any], model: pathlib.Path | None) -> pathlib.Path:
    """The model the job started from: `model`, or the one the step's meta.json names."""
    chosen = model if model is not None else meta.get("model_path")
    if chosen is None:
        raise ExportError(f"{step}/meta.json names no model_path: pass --model <the job's spec.model.path>")
    chosen = pathlib.Path(chosen)
    if not (chosen / "config.json").is_file():
        raise ExportError(f"{chosen}: no Hugging Face model there (config.json missing); pass --model")
    return chosen


def export(
    path: pathlib.Path,
    out: pathlib.Path,
    model: pathlib.Path | None = None,
    dtype: str = "auto",
    adapter: pathlib.Path | None = None,
) -> pathlib.Path:
    """Write the checkpoint at `path` (a step directory or the root) as a HF model into `out` (created;
    must be empty or absent), and a LoRA step's adapter into `adapter` when given. Returns the step
    directory exported."""
    step = step_dir(path)
    meta = json.loads((step / "meta.json").read_text())
    base = base_model(step, meta, model)
    for where in (out, adapter):
        if where is not None and where.exists() and any(where.iterdir()):
            raise ExportError(f"{where}: not empty (the export would mix with what is there)")
    if adapter is not None and "lora" not in meta:
        raise ExportError(f"{step}: not a LoRA job's checkpoint (meta.json names no lora): drop --adapter")
    transformers: Any = importlib.import_module("transformers")  # heavy and untyped: only here
    if "lora" in meta:
        hf = _merged_lora(transformers, base, step, lora.LoraSettings.from_meta(meta["lora"]), adapter)
    else:
        config = transformers.AutoConfig.from_pretrained(base)
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        state = {"model": hf.state_dict()}
        dcp.load(state, checkpoint_id=str(step))  # type: ignore[attr-defined]  # no process group: one process
        hf.load_state_dict(state["model"])
    hf.to(precision.resolve(dtype, precision.config_dtype(base)))  # auto: the base model's own dtype
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(base).save_pretrained(out)  # with its chat template
    if (base / "generation_config.json").is_file():
        shutil.copyfile(base / "generation_config.json", out / "generation_config.json")
    info = {"step": meta.get("step"), "param_version": meta.get("param_version"), "source": str(step)}
    (out / INFO).write_text(json.dumps({**info, "base_model": str(base)}) + "\n")
    return step


def _merged_lora(
    transformers: Any,
    base: pathlib.Path,
    step: pathlib.Path,
    settings: lora.LoraSettings,
    adapter: pathlib.Path | None,
) -> Any:
    """The base model with the step's adapters merged in (and written to `adapter` first, if given)."""
    wrapped: Any = lora.apply(
        transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), settings
    )
    trained = {name: t for name, t in wrapped.state_dict().items() if lora.saved_name(name) is not None}
    state = {"model": trained}
    dcp.load(state, checkpoint_id=str(step))  # type: ignore[attr-defined]  # the adapters' entries only
    missing = wrapped.load_state_dict(state["model"], strict=False).missing_keys
    if any(lora.saved_name(name) is not None for name in missing):
        raise ExportError(f"{step}: adapter weights missing from the checkpoint")
    if adapter is not None:
        wrapped.save_pretrained(adapter, safe_serialization=True)
    return wrapped.merge_and_unload()
