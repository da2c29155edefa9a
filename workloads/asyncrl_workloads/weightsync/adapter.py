"""The LoRA payload kind on the rollout side: the received adapter as a directory vLLM loads.

Called by ``weightsync/gloo.py`` and ``weightsync/nccl.py`` (an engine worker writes what a LoRA round
received, over gloo or through vLLM's NCCL engine) and by
``rollout/engine.py`` (which then asks vLLM to load that directory in place, ``add_lora`` with
``load_inplace``, under one fixed adapter id that every generation request names). A round of a LoRA
job (``base.Plan.adapter`` set) carries the adapter's tensors alone under peft's saved names; this
writes them as peft does (``adapter_model.safetensors`` + ``adapter_config.json``), which is what
vLLM's ``LoRAModel.from_local_checkpoint`` reads. The directory is per replica process (its
incarnation), under the temp directory: vLLM reads it again only when the adapter is evicted, and
the same round rewrites it before the reload, so it always holds the version being served.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from collections.abc import Sequence

import torch

from asyncrl_workloads.weightsync import base

LORA_ID = 1
"""The vLLM adapter id (and ``lora_name`` ``ADAPTER_NAME``) every version is loaded under, in place."""
ADAPTER_NAME = "asyncrl-policy"
WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"


def directory(replica: int, incarnation: str) -> pathlib.Path:
    """Where replica ``replica``'s process ``incarnation`` keeps the adapter it serves."""
    return pathlib.Path(tempfile.gettempdir()) / f"asyncrl-lora-{replica}-{incarnation}"


def peft_config(adapter: base.Adapter, base_model: str = "") -> dict[str, object]:
    """adapter_config.json as peft writes it, with the fields vLLM's PEFTHelper reads."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": adapter.rank,
        "lora_alpha": adapter.alpha,
        "target_modules": list(adapter.target_modules),
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "base_model_name_or_path": base_model,
    }


def write(
    out: pathlib.Path,
    adapter: base.Adapter,
    tensors: Sequence[tuple[str, torch.Tensor]],
    base_model: str = "",
) -> None:
    """Write ``tensors`` (peft names) and the config into ``out``, each file replaced atomically."""
    from safetensors.torch import save_file  # a dependency of transformers and vLLM alike

    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{WEIGHTS}.tmp"
    save_file({name: t.detach().contiguous() for name, t in tensors}, str(tmp))
    os.replace(tmp, out / WEIGHTS)
    tmp = out / f".{CONFIG}.tmp"
    tmp.write_text(json.dumps(peft_config(adapter, base_model)))
    os.replace(tmp, out / CONFIG)
