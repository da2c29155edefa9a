"""The engine workers' log: vLLM's rotary reload warning is dropped, every other warning kept."""

from __future__ import annotations

import logging

import pytest
from asyncrl_workloads.weightsync import gloo  # noqa: F401  (installs the filter, as in an engine worker)
from vllm.model_executor.model_loader.reload import layerwise


def test_only_the_rotary_reload_warning_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger(layerwise.__name__)
    with caplog.at_level(logging.DEBUG, logger=layerwise.__name__):
        logger.warning("%s: Failed to load weights", "RotaryEmbedding")
        logger.warning("%s: Failed to load weights", "QKVParallelLinear")
    assert [r.getMessage() for r in caplog.records] == ["QKVParallelLinear: Failed to load weights"]
