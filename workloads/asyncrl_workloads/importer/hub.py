"""Hugging Face Hub ids in a source config: verl and AReaL download ``Qwen/Qwen2.5-1.5B-Instruct`` or
``openai/gsm8k`` when they start; asyncrl never downloads at run time (model.path and data.prompts are
directories and files on a volume). Called by ``importer/rules.py`` (``model_path``, ``one_path``) and
the tables that derive step counts from a dataset's size.

The importer keeps the id in the job (so the job shows what was asked for) and flags it with the command
that saves it; a pod of the job refuses to start with one line naming the field (entrypoints/common.py:
``spec.model.path: no model at ...``; the rollout's data check for data.prompts).
"""

from __future__ import annotations

import re

_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_FILE = re.compile(r"\.(parquet|pq|jsonl|json|arrow|csv)$", re.IGNORECASE)

TRAIN_ROWS = {"openai/gsm8k": 7473}
"""Records in the train split of Hub datasets the anchors' examples use, for epochs -> steps (AReaL's
gsm8k examples train 10 epochs of openai/gsm8k's 7473 problems)."""


def is_hub_id(value: str) -> bool:
    """``org/name`` or ``name``: not absolute, not relative to ``.`` or ``~``, not a data file."""
    return bool(_ID.match(value)) and not _FILE.search(value)


def _local_name(value: str) -> str:
    return value.rsplit("/", 1)[-1]


def model_flag(value: str) -> str | None:
    """The line that tells the user how to put a Hub model on a volume, or None for a path."""
    if value.startswith("~"):
        return (
            f"model.path {value!r} is under your home directory, which the pods do not have: give the"
            " model's directory on a volume (spec.volumes)"
        )
    if not is_hub_id(value):
        return None
    local = f"/models/{_local_name(value)}"
    return (
        f"model.path {value!r} is a Hugging Face Hub id; nothing is downloaded at run time, and the pods"
        f" refuse to start until model.path is a directory: huggingface-cli download {value}"
        f" --local-dir {local} (on a volume mounted at /models, spec.volumes), then set model.path {local}"
    )


def dataset_flag(value: str) -> str | None:
    """The line that tells the user how to put a Hub dataset on a volume, or None for a path."""
    if value.startswith("~"):
        return f"{value!r} is under your home directory, which the pods do not have: give a path on a volume"
    if not is_hub_id(value):
        return None
    local = f"/data/{_local_name(value)}"
    return (
        f"{value!r} is a Hugging Face Hub dataset name (or one your training script resolves); nothing is"
        f" downloaded at run time: huggingface-cli download {value} --repo-type dataset --local-dir {local}"
        " (on a volume, spec.volumes), then point data.prompts (data.validation) at the split's parquet"
        " file or"
        " folder under it"
    )
