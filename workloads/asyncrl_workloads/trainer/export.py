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
"""

from __future__ import annotations

import importlib
import json
import pathlib
import shutil
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from asyncrl_workloads.trainer import checkpoint, precision

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
    path: pathlib.Path, out: pathlib.Path, model: pathlib.Path | None = None, dtype: str = "auto"
) -> pathlib.Path:
    """Write the checkpoint at `path` (a step directory or the root) as a HF model into `out` (created;
    must be empty or absent). Returns the step directory exported."""
    step = step_dir(path)
    meta = json.loads((step / "meta.json").read_text())
    base = base_model(step, meta, model)
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out}: not empty (the export would mix with what is there)")
    transformers: Any = importlib.import_module("transformers")  # heavy and untyped: only here
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
