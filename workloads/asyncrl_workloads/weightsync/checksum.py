"""A content checksum of named tensors, computed the same way on both sides of weight sync.

Called by rollout engine workers (``weightsync/gloo.py``) after they load a version, by the trainer
(``weightsync/sender.py``'s ``expected_checksum``) and by tests that compare the two.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch


def of(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over (name, dtype, shape, raw bytes) of every tensor, in name order (16 hex chars)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(named_tensors, key=lambda item: item[0]):
        t = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]
