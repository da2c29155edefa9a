"""A tied output head on the rollout side of a CPU (gloo) weight sync.

The trainer sends a tied model's matrix once, as ``model.embed_tokens.weight`` (``fsdp.full_tensors``'s
``tied_once`` where the rollouts run on CPU; 0.77 GB a round instead of 1.24 for the memory benchmark's
192M Qwen3). vLLM's layerwise reload restores each layer on meta tensors of its own, so the tie is not
seen while loading: a head given no weight is put back as it was and never processed again, and on CPU it
multiplies with the packed copy of the weight made when the engine started
(``UnquantizedEmbeddingMethod.process_weights_after_loading`` -> ``dispatch_cpu_unquantized_gemm``).
Measured on the tied qwen3 of tests/dataplane/test_architectures.py: without this, 11 of 12 logprobs
were beyond 2e-3 of the trainer's after a full round. ``with_head`` hands the reload the embedding's
received tensor under ``lm_head.weight`` too, as if it had been sent: the head is loaded and packed like
any layer, and the bytes crossed the network once. The checksum stays that of what was received.
"""

from __future__ import annotations

import torch

HEAD, EMBEDDING = "lm_head.weight", "model.embed_tokens.weight"


def tied_head(model: torch.nn.Module) -> bool:
    """The engine's model has an output head that shares the input embedding's storage."""
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    embed = getattr(getattr(getattr(model, "model", None), "embed_tokens", None), "weight", None)
    return (
        isinstance(head, torch.Tensor)
        and isinstance(embed, torch.Tensor)
        and head.numel() > 0
        and head.data_ptr() == embed.data_ptr()
    )


def with_head(
    model: torch.nn.Module, tensors: list[tuple[str, torch.Tensor]]
) -> list[tuple[str, torch.Tensor]]:
    """``tensors`` with the embedding's tensor added as ``lm_head.weight`` when the model ties them and
    the round carried the embedding alone; otherwise ``tensors`` as they are."""
    names = {name for name, _ in tensors}
    if HEAD in names or EMBEDDING not in names or not tied_head(model):
        return tensors
    return [*tensors, (HEAD, next(t for name, t in tensors if name == EMBEDDING))]
