"""Data-plane fixtures: a real nats-server (JetStream), a real Prometheus, a tiny model made on the spot.

Used by tests/dataplane/* (and tests/e2e/* through the same modules). Each server runs in its own process
group and is torn down even when the test fails.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asyncrl_testing import loopthread
from asyncrl_testing import prometheus as prometheus_server
from asyncrl_workloads import tinymodel
from asyncrl_workloads.local import natsserver


@pytest.fixture
def nats_server(tmp_path: pathlib.Path) -> Iterator[natsserver.NatsServer]:
    """A nats-server with JetStream on, its store in the test's tmp dir; `.url` to connect."""
    server = natsserver.start(store_dir=tmp_path / "nats-store", log_path=tmp_path / "nats-server.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def prometheus() -> Iterator[Callable[..., prometheus_server.Prometheus]]:
    """Factory: `prometheus(["127.0.0.1:PORT", ...])` (or {job: [targets]}) starts a scraping Prometheus."""
    started: list[prometheus_server.Prometheus] = []

    def start(targets: prometheus_server.Targets) -> prometheus_server.Prometheus:
        server = prometheus_server.start(targets)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A seeded 2-layer Llama (hidden 128, 2 heads) with a char-level tokenizer, as a local HF dir."""
    return tinymodel.create_tiny_model(tmp_path_factory.mktemp("tiny-model") / "model", seed=0)


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The tiny model with ChatML + tool-call tokens and a chat template (``chat=True``)."""
    return tinymodel.create_tiny_model(tmp_path_factory.mktemp("tiny-chat") / "model", seed=0, chat=True)


@pytest.fixture(scope="module")
def host() -> Iterator[loopthread.LoopThread]:
    """An event loop on a thread of its own: one vLLM engine serves every test of a module."""
    thread = loopthread.LoopThread()
    yield thread
    thread.close()


@pytest.fixture(scope="module")
def tokenizer(chat_model: pathlib.Path) -> Any:
    """The tiny chat model's tokenizer (transformers)."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(chat_model)
