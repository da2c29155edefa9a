"""Gateway benchmark (a script, not a test): completions/s through the agent gateway ÷ vLLM's own server.

    .venv/bin/python tools/asyncrl_testing/bench_gateway.py --rounds 8 --json /tmp/gw.json

Two servers on the same tiny chat model, started side by side and pinned to the same one core (the
driver and its clients run on the other cores), each one process group with its vLLM engine core:

- **vllm**: ``python -m vllm.entrypoints.openai.api_server`` with the engine arguments a gateway job's
  CPU rollout uses where they bear on speed (float32, eager, chunked prefill off, 32-token KV blocks,
  stats off; request logging is off by default in vLLM 0.32, the access log is turned off).
- **gateway**: this script's ``--serve-gateway`` mode: the rollout's engine (``rollout/engine.py``), a
  ``RolloutWorker`` with no trainer link that publishes into a counter, and the gateway's HTTP server
  (``gateway/http.py``), as ``rollout/main.py`` wires them. Admission never throttles: maxInflightPrompts,
  maxStaleness and groupsPerVersion are set beyond what the benchmark opens, and the session's call
  limit (maxAssistantTurns) beyond the requests it sends.

``--clients`` clients (the official ``openai`` SDK, ``AsyncOpenAI``) each send ``--requests`` chat
completions one after another, non-streaming by default: one user message of ~50 tokens (with the
template's tokens), ``max_tokens`` ``--max-tokens``, temperature 1.0, the same prompts for both sides.
On the gateway each client has a session of its own (``POST /rl/sessions`` with ``{"record": null}``,
opened before the round and ended after it; every request starts a new root of that session).

With ``--apis`` ("Gateway APIs"), no vLLM server: the one gateway serves the same completions through its
three APIs, each with its own official client: chat completions (``openai``), the Messages API
(``anthropic``'s ``messages.create``) and the Responses API (``openai``'s ``responses.create``, stateless
``store: false``); ratio = Messages (Responses) completions/s ÷ chat completions/s per round, the order
rotating. Goal ≥ 0.95: the conversion must cost next to nothing.

Rounds alternate the order (vllm, gateway / gateway, vllm, ...). Per round, ratio = gateway ÷ vllm
completions/s (and completion tokens/s); reported as the median with a 95% bootstrap interval of the
median (``bench_report.median_ci``). Goal ≥ 0.9. Each side's server CPU per completion, by process and
thread, says where a gap is spent. The tiny model is the one every other benchmark uses: its engine
step is cheap, so the per-request work in the front end weighs as much as it ever will (a bigger model
only dilutes it; ``--hidden-size`` and ``--layers`` make one).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import pathlib
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from typing import Any

sys.path[:0] = [
    str(pathlib.Path(__file__).resolve().parents[2] / d) for d in ("workloads", "operator", "tools")
]

from asyncrl_workloads import tinymodel  # noqa: E402
from asyncrl_workloads.local import process  # noqa: E402
from asyncrl_workloads.rewards import scorer as scorer_mod  # noqa: E402
from asyncrl_workloads.rollout import main as rollout_main  # noqa: E402

from asyncrl_testing import procfs  # noqa: E402
from asyncrl_testing.bench_report import median_ci  # noqa: E402

ADMIN_KEY = "bench-admin-key"
MODEL_NAME = "tiny"
MAX_MODEL_LEN = 512
SIDES = ("vllm", "gateway")
API_SIDES = ("gateway", "messages", "responses")
"""--apis: the gateway's chat completions, Messages API and Responses API, on one gateway server."""


def prompts(clients: int) -> list[str]:
    """One user message per client, ~37 characters (the template adds ~13 tokens: ~50 in all)."""
    return [f"Client {i:02d}: write a short story about it." for i in range(clients)]


# ---- the gateway side's server process ------------------------------------------------------------
async def serve_gateway(args: argparse.Namespace) -> None:
    import transformers
    from asyncrl_workloads import metrics as metrics_mod
    from asyncrl_workloads.episode import chat as chat_mod
    from asyncrl_workloads.episode import parser as parser_mod
    from asyncrl_workloads.gateway import http as gw_http
    from asyncrl_workloads.gateway import service as gw_service
    from asyncrl_workloads.rollout import engine as engine_mod
    from asyncrl_workloads.rollout import worker as worker_mod

    sock = gw_http.listen(args.port, "127.0.0.1")
    extra = (("block_size", args.block_size),)
    engine = await engine_mod.RolloutEngine.start(
        engine_mod.EngineSettings(model=args.model, max_model_len=MAX_MODEL_LEN, extra=extra)
    )
    tok = transformers.AutoTokenizer.from_pretrained(args.model)
    fmt = chat_mod.ChatFormat(tok, "prompt")
    parser = parser_mod.ToolCallParser("asyncrl_workloads.tasks.lookup_parser:CompactParser", tok)
    bound = metrics_mod.bind(metrics_mod.Identity("bench", "gateway", "rollout", "0"))
    published = 0

    async def publish(trajectory: Any) -> bool:
        nonlocal published
        published += 1
        return True

    never = 10**9  # admission and the session's call limit never throttle the benchmark
    ws = worker_mod.WorkerSettings(
        job="bench", replica=0, n=1, max_tokens=args.max_tokens, max_inflight_prompts=never,
        max_staleness=never, groups_per_version=never,
    )  # fmt: skip
    worker = worker_mod.RolloutWorker(
        ws, engine, None, publish, scorer_mod.Scorer(lambda record, text: 0.0), [{"prompt": "unused"}],
        lambda text: list(tok(text)["input_ids"]), bound, prompt_ids=fmt.prompt_ids,
    )  # fmt: skip
    settings = gw_service.GatewaySettings(
        public_url=f"http://127.0.0.1:{args.port}", model_name=MODEL_NAME, max_model_len=MAX_MODEL_LEN,
        max_tokens=args.max_tokens, max_calls=never,
    )  # fmt: skip
    app = gw_http.GatewayApp(
        gw_service.Gateway(settings, engine, fmt, parser, worker, bound), ADMIN_KEY, 1 << 20
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    try:
        await worker.run(stop, serve=lambda st: gw_http.serve(app, sock, st, worker.abort_generating))
    finally:
        print(f"published {published} trajectories", flush=True)
        engine.shutdown()


# ---- the driver -----------------------------------------------------------------------------------
def start_servers(
    args: argparse.Namespace, model: pathlib.Path, logs: pathlib.Path, cpus: frozenset[int] | None
) -> dict[str, tuple[process.Child, int]]:
    env = {
        **os.environ,
        **process.engine_core_env(cpus),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
    }
    py = sys.executable
    port_a, port_b = process.free_port(), process.free_port()
    vllm_argv = [
        py, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
        "--port", str(port_a), "--served-model-name", MODEL_NAME, "--dtype", "float32",
        "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager", "--no-enable-chunked-prefill",
        "--block-size", str(args.block_size), "--seed", "0", "--disable-log-stats",
        "--disable-uvicorn-access-log", "--logprobs-mode", "processed_logprobs",
        "--generation-config", "vllm",
    ]  # fmt: skip
    gateway_argv = [
        py, __file__, "--serve-gateway", "--model", str(model), "--port", str(port_b),
        "--block-size", str(args.block_size), "--max-tokens", str(args.max_tokens),
    ]  # fmt: skip
    gateway = (process.Child("gateway", gateway_argv, logs / "gateway.log", env=env, cpus=cpus), port_b)
    if args.apis:  # one gateway answers all three sides
        servers = {side: gateway for side in API_SIDES}
    else:
        servers = {
            "vllm": (process.Child("vllm", vllm_argv, logs / "vllm.log", env=env, cpus=cpus), port_a),
            "gateway": gateway,
        }
    for child, port in set(servers.values()):
        child.wait_ready(functools.partial(_healthy, port), timeout=300)
    return servers


def _healthy(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
        return int(resp.status) == 200


def server_cpu(child: process.Child) -> dict[str, float]:
    """CPU seconds by "process/thread" of a server's whole session (its engine core included)."""
    return procfs.session_thread_cpu(child.pid)


async def open_sessions(port: int, count: int) -> list[dict[str, Any]]:
    import httpx

    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers) as http:
        out = []
        for _ in range(count):
            resp = await http.post("/rl/sessions", json={"record": None})
            resp.raise_for_status()
            out.append(resp.json())
        return out


async def end_sessions(sessions: list[dict[str, Any]]) -> None:
    import httpx

    async with httpx.AsyncClient() as http:
        for s in sessions:
            url = s["base_url"].removesuffix("/v1") + "/rl/end"
            resp = await http.post(url, headers={"Authorization": f"Bearer {s['api_key']}"})
            resp.raise_for_status()


async def run_side(side: str, port: int, args: argparse.Namespace, requests: int) -> dict[str, Any]:
    """``args.clients`` clients sending ``requests`` chat completions each; the round's rates."""
    import openai

    if side in API_SIDES[1:]:
        return await run_api_side(side, port, args, requests)
    if side == "gateway":
        sessions = await open_sessions(port, args.clients)
        targets = [(s["base_url"], s["api_key"]) for s in sessions]
    else:
        targets = [(f"http://127.0.0.1:{port}/v1", "none")] * args.clients
    clients = [openai.AsyncOpenAI(base_url=u, api_key=k, max_retries=0, timeout=300) for u, k in targets]
    finish: dict[str, int] = {}
    # the gateway records every token's logprob (training needs it): --vllm-logprobs asks vLLM for them too
    extra: Any = {"logprobs": True, "top_logprobs": 0} if side == "vllm" and args.vllm_logprobs else {}

    async def one(client: openai.AsyncOpenAI, prompt: str) -> int:
        tokens = 0
        messages: Any = [{"role": "user", "content": prompt}]
        for _ in range(requests):
            if args.stream:
                chunks = await client.chat.completions.create(
                    model=MODEL_NAME, messages=messages, max_tokens=args.max_tokens, temperature=1.0,
                    stream=True, stream_options={"include_usage": True}, **extra,
                )  # fmt: skip
                async for chunk in chunks:
                    if chunk.usage is not None:
                        tokens += chunk.usage.completion_tokens
                    for choice in chunk.choices:
                        if choice.finish_reason:
                            finish[choice.finish_reason] = finish.get(choice.finish_reason, 0) + 1
                continue
            resp = await client.chat.completions.create(
                model=MODEL_NAME, messages=messages, max_tokens=args.max_tokens, temperature=1.0, **extra
            )
            assert resp.usage is not None
            tokens += resp.usage.completion_tokens
            reason = resp.choices[0].finish_reason
            finish[reason] = finish.get(reason, 0) + 1
        return tokens

    try:
        t0 = time.perf_counter()
        counts = await asyncio.gather(
            *(one(c, p) for c, p in zip(clients, prompts(args.clients), strict=True))
        )
        secs = time.perf_counter() - t0
    finally:
        for c in clients:
            await c.close()
    if side == "gateway":
        await end_sessions(sessions)
    n = args.clients * requests
    return {
        "completions": n, "seconds": round(secs, 3), "per_s": round(n / secs, 2),
        "tokens": sum(counts), "tokens_per_s": round(sum(counts) / secs, 1),
        "tokens_per_completion": round(sum(counts) / n, 1), "finish_reasons": finish,
    }  # fmt: skip


async def run_api_side(side: str, port: int, args: argparse.Namespace, requests: int) -> dict[str, Any]:
    """As ``run_side``'s gateway side, through the Messages API (the ``anthropic`` SDK) or the Responses
    API (``openai``'s ``responses.create``, stateless): the same prompts, max tokens and temperature."""
    import anthropic
    import openai

    sessions = await open_sessions(port, args.clients)
    finish: dict[str, int] = {}

    def make(session: dict[str, Any]) -> Any:
        if side == "messages":
            root = session["base_url"].removesuffix("/v1")
            return anthropic.AsyncAnthropic(
                base_url=root, api_key=session["api_key"], max_retries=0, timeout=300
            )
        return openai.AsyncOpenAI(
            base_url=session["base_url"], api_key=session["api_key"], max_retries=0, timeout=300
        )

    clients = [make(s) for s in sessions]  # made before the clock starts, as run_side's

    async def one(client: Any, prompt: str) -> int:
        tokens = 0
        for _ in range(requests):
            if side == "messages":
                message = await client.messages.create(
                    model=MODEL_NAME, max_tokens=args.max_tokens, extra_body={"temperature": 1.0},
                    messages=[{"role": "user", "content": prompt}],
                )  # fmt: skip
                tokens, reason = tokens + message.usage.output_tokens, str(message.stop_reason)
            else:
                response = await client.responses.create(
                    model=MODEL_NAME, max_output_tokens=args.max_tokens, temperature=1.0, store=False,
                    input=[{"role": "user", "content": prompt}],
                )  # fmt: skip
                tokens, reason = tokens + response.usage.output_tokens, str(response.status)
            finish[reason] = finish.get(reason, 0) + 1
        return tokens

    try:
        t0 = time.perf_counter()
        counts = await asyncio.gather(
            *(one(c, p) for c, p in zip(clients, prompts(args.clients), strict=True))
        )
        secs = time.perf_counter() - t0
    finally:
        for c in clients:
            await c.close()
    await end_sessions(sessions)
    n = args.clients * requests
    return {
        "completions": n, "seconds": round(secs, 3), "per_s": round(n / secs, 2),
        "tokens": sum(counts), "tokens_per_s": round(sum(counts) / secs, 1),
        "tokens_per_completion": round(sum(counts) / n, 1), "finish_reasons": finish,
    }  # fmt: skip


def cpu_split(before: dict[str, float], after: dict[str, float], completions: int) -> dict[str, float]:
    """Server CPU ms per completion by "process/thread", largest first (threads under 0.05 ms left out)."""
    per = {k: 1e3 * (after.get(k, 0.0) - before.get(k, 0.0)) / completions for k in after}
    return {k: round(v, 2) for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= 0.05}


def core_busy(cores: list[int]) -> float:
    return sum(procfs.core_busy_seconds(c) for c in cores)


async def bench(
    args: argparse.Namespace, servers: dict[str, tuple[process.Child, int]], cores: list[int]
) -> dict[str, Any]:
    sides = API_SIDES if args.apis else SIDES
    for side in sides:  # warm-up: the engines' first steps, the clients' imports, the sessions' paths
        await run_side(side, servers[side][1], args, 2)
    rounds = []
    for r in range(args.rounds):
        order = sides[r % len(sides) :] + sides[: r % len(sides)]  # rotating: each side in each place
        got: dict[str, Any] = {"order": list(order)}
        for side in order:
            child, port = servers[side]
            before, busy, t0 = server_cpu(child), core_busy(cores), time.monotonic()
            got[side] = await run_side(side, port, args, args.requests)
            wall, busy = time.monotonic() - t0, core_busy(cores) - busy
            after = server_cpu(child)
            total = sum(after.values()) - sum(before.values())
            got[side]["server_cpu_ms_per_completion"] = round(1e3 * total / got[side]["completions"], 2)
            got[side]["server_cpu_split"] = cpu_split(before, after, got[side]["completions"])
            # the servers' core(s): this side's server, and everything else on it (the other side's idle
            # server, other people's processes) as fractions of the round's wall time
            got[side]["server_core_share"] = round(total / wall / max(1, len(cores)), 3)
            got[side]["others_core_share"] = round(max(0.0, busy - total) / wall / max(1, len(cores)), 3)
        if args.apis:
            for api in API_SIDES[1:]:
                got[f"{api}_ratio"] = round(got[api]["per_s"] / got["gateway"]["per_s"], 3)
        else:
            got["ratio"] = round(got["gateway"]["per_s"] / got["vllm"]["per_s"], 3)
            got["tokens_ratio"] = round(got["gateway"]["tokens_per_s"] / got["vllm"]["tokens_per_s"], 3)
        rounds.append(got)
        print(json.dumps(got), flush=True)
    if args.apis:
        by_api = {api: [r[f"{api}_ratio"] for r in rounds] for api in API_SIDES[1:]}
        return {
            **{f"{api}_ratio": round(statistics.median(v), 3) for api, v in by_api.items()},
            **{f"{api}_interval": list(median_ci(v)) for api, v in by_api.items()},
            "per_s_medians": {s: statistics.median(r[s]["per_s"] for r in rounds) for s in API_SIDES},
            "rounds": rounds,
            "settings": {"clients": args.clients, "requests": args.requests, "max_tokens": args.max_tokens,
                         "block_size": args.block_size, "prompt_chars": len(prompts(1)[0])},
        }  # fmt: skip
    ratios, tokens = [r["ratio"] for r in rounds], [r["tokens_ratio"] for r in rounds]
    return {
        "ratio": round(statistics.median(ratios), 3), "interval": list(median_ci(ratios)),
        "tokens_ratio": round(statistics.median(tokens), 3), "tokens_interval": list(median_ci(tokens)),
        "rounds": rounds,
        "settings": {"clients": args.clients, "requests": args.requests, "max_tokens": args.max_tokens,
                     "stream": args.stream, "vllm_logprobs": args.vllm_logprobs,
                     "block_size": args.block_size, "layers": args.layers, "hidden_size": args.hidden_size,
                     "prompt_chars": len(prompts(1)[0])},
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients")
    parser.add_argument("--requests", type=int, default=16, help="completions per client per round")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--stream", action="store_true", help="streaming chat completions")
    parser.add_argument(
        "--apis", action="store_true", help="Gateway APIs: Messages and Responses ÷ chat on one gateway"
    )
    parser.add_argument(
        "--vllm-logprobs",
        action="store_true",
        help="ask vLLM's server for the sampled tokens' logprobs too, as the gateway always computes them",
    )
    parser.add_argument("--block-size", type=int, default=rollout_main.AGENT_CPU_BLOCK_SIZE)
    parser.add_argument("--layers", type=int, default=2, help="tiny model layers (2: the usual one)")
    parser.add_argument("--hidden-size", type=int, default=128, help="tiny model width (128: the usual)")
    parser.add_argument("--json", type=pathlib.Path, help="write the result here")
    parser.add_argument(
        "--logs", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "bench_gateway",
        help="the servers' logs",
    )  # fmt: skip
    parser.add_argument("--serve-gateway", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_gateway:
        asyncio.run(serve_gateway(args))
        return 0
    cpus = process.rollout_cpus(1)  # the servers' one core, as a rollout pod has
    if cpus is not None and len(os.sched_getaffinity(0) - cpus) > 0:
        os.sched_setaffinity(0, os.sched_getaffinity(0) - cpus)  # the driver and clients: the rest
    load_start = [round(x, 2) for x in os.getloadavg()]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        model = tinymodel.create_tiny_model(
            pathlib.Path(tmp) / "model", seed=0, chat=True, num_layers=args.layers,
            hidden_size=args.hidden_size, intermediate_size=2 * args.hidden_size,
            num_heads=max(1, args.hidden_size // 64),
        )  # fmt: skip
        servers = start_servers(args, model, args.logs, cpus)
        try:
            affinity = {
                f"{side}: {name}": procfs.thread_affinity(pid)
                for side, (child, _) in servers.items()
                for pid, name in procfs.session_processes(child.pid).items()
            }
            result = asyncio.run(bench(args, servers, sorted(cpus) if cpus else []))
        finally:
            for child, _ in set(servers.values()):
                child.stop()
    result.update(
        pinning={"servers": sorted(cpus) if cpus else "unpinned", "affinity_seen": affinity,
                 "driver": sorted(os.sched_getaffinity(0))},
        load_avg_start=load_start, load_avg_end=[round(x, 2) for x in os.getloadavg()],
        wall_s=round(time.monotonic() - t0, 1),
    )  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
