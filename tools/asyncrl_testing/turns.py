"""Helpers for tests of multi-turn trajectories (the agent loop's and the gateway's): mask runs, the stop
tokens that end a random model's turns, and the logprobs transformers gives the same tokens."""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any


def runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """(value, length) of each run of equal mask values."""
    out: list[tuple[int, int]] = []
    for m in mask:
        if out and out[-1][0] == m:
            out[-1] = (m, out[-1][1] + 1)
        else:
            out.append((m, 1))
    return out


def stop_ids(tokenizer: Any) -> tuple[int, ...]:
    """Every letter and digit: turns of a random character-level model end by stopping, not by length."""
    return tuple(tokenizer.convert_tokens_to_ids(list(string.ascii_letters + string.digits)))


def hf_logprobs(model: Any, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> Any:
    """(R,) tensor: log p(response_ids[t] | everything before) under ``model`` (transformers, eval mode)."""
    import torch

    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()  # (R, V)
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(list(response_ids))[:, None])[:, 0]  # (R,)


def two_versions(model_dir: Any) -> tuple[Any, Any]:
    """(v0, v1): the model at ``model_dir`` (float32, eval) and a copy with every parameter moved by a
    seeded 0.5 * N(0, 1), the version a test's weight sync broadcasts."""
    import copy

    import torch
    import transformers

    v0: Any = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    v0.eval()
    v1 = copy.deepcopy(v0)
    with torch.no_grad():
        for p in v1.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    return v0, v1
