"""Trainer memory and scale benchmark (a script, not a test): peak memory and step time of one FSDP2
training step per micro-batch size, with each spec.trainer.memory feature off and on, beside the
analytic lower bound.

    .venv/bin/python tools/asyncrl_testing/bench_memory.py --json /tmp/memory.json             # the issue's
    .venv/bin/python tools/asyncrl_testing/bench_memory.py --hidden 256 --layers 4 --tokens 1024 2048 4096

The model is Qwen3-shaped and randomly initialised from transformers' Qwen3Config (no download; the
defaults: Qwen3's 151,936-token vocabulary, tied embeddings, hidden 768, 12 layers, 12 heads over 4
KV heads, head dim 64, MLP 2048: about 192M parameters). Each (setting, tokens) runs in a fresh process
(a gloo world of one, the FSDP2 backend as the trainer builds it) so its peak is its own: one step on
one micro-batch of ``tokens`` tokens (8 sequences), the tis loss, AdamW. Measured: on CUDA
``torch.cuda.max_memory_allocated`` over the second of two steps (the first allocates Adam's state); on
CPU the process's peak resident set over that second step (Linux VmHWM, reset through
/proc/self/clear_refs before it) minus its resident set before the backend was built (torch's and
Python's own pages are not the trainer's). The step time is the second step's wall time.

The lower bound per rank (one rank here) is parameters + gradients + Adam's two moments, 16 bytes per
float32 parameter, plus one decoder layer's activations for the micro-batch: the layer's input kept
for each layer (tokens x hidden x 4 bytes x layers: what checkpointing must keep) and one layer's
internals (tokens x (4 hidden + 3 MLP + 2 x heads x head dim) x 4 bytes). Reported: peak ÷ bound.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

SETTINGS: dict[str, dict[str, Any]] = {
    "off": {"activation_checkpointing": False, "logprob_chunk_tokens": 0, "packing": False},
    "checkpointing": {"activation_checkpointing": True, "logprob_chunk_tokens": 0, "packing": False},
    "chunked log-probs": {"activation_checkpointing": False, "logprob_chunk_tokens": 1024, "packing": False},
    "packing": {"activation_checkpointing": False, "logprob_chunk_tokens": 0, "packing": True},
    "all on": {"activation_checkpointing": True, "logprob_chunk_tokens": 1024, "packing": True},
}


MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
"""glibc: every block above 64 KiB its own mapping, unmapped when freed, so the CPU resident set
follows torch's live tensors instead of what the allocator keeps after a free."""


def make_model(directory: pathlib.Path, args: argparse.Namespace) -> int:
    """A random Qwen3 at ``directory``; returns its parameter count."""
    import torch
    import transformers

    config = transformers.Qwen3Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.mlp,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        tie_word_embeddings=True,
        max_position_embeddings=max(args.tokens) + 8,
    )
    torch.manual_seed(0)
    model: Any = transformers.Qwen3ForCausalLM(config)  # type: ignore[no-untyped-call]
    model.save_pretrained(directory)
    return int(sum(p.numel() for p in model.parameters()))


def bound_bytes(params: int, tokens: int, args: argparse.Namespace) -> int:
    """Parameters, gradients and AdamW's moments in float32, plus one layer's activations (module doc)."""
    hidden, layers, mlp, heads, head_dim = (
        int(args.hidden),
        int(args.layers),
        int(args.mlp),
        int(args.heads),
        int(args.head_dim),
    )
    kept = tokens * hidden * 4 * layers
    layer = tokens * (4 * hidden + 3 * mlp + 2 * heads * head_dim) * 4
    return 16 * params + kept + layer


def one(model_dir: str, setting: str, tokens: int) -> dict[str, Any]:
    """One (setting, tokens) measurement, in this process."""
    import torch
    from asyncrl_workloads.bus import trajectory
    from asyncrl_workloads.trainer import backend, fsdp, loss

    world = fsdp.init_world()
    before = _rss()
    memory = fsdp.Memory(**SETTINGS[setting])
    settings = backend.TrainSettings(
        model_path=model_dir,
        lr=1e-5,
        objective=loss.Objective(correction="tis"),
        micro_batch_tokens=tokens,
        memory=memory,
    )
    if world.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    b = backend.FSDP2Backend(settings, world)
    gen = torch.Generator().manual_seed(0)
    rows = 8
    per = tokens // rows
    batch = []
    for i in range(rows):  # lengths vary by up to 25%, so padding costs what it does in practice
        n = per - (i * per) // (4 * rows)
        prompt = n // 4
        response = n - prompt
        batch.append(
            trajectory.Trajectory(
                id=f"t{i}",
                job="j",
                replica=0,
                group_id=f"g{i // 4}",
                group_size=4,
                sample_index=i % 4,
                prompt_ids=torch.randint(4, 1000, (prompt,), generator=gen).tolist(),
                response_ids=torch.randint(4, 1000, (response,), generator=gen).tolist(),
                behaviour_logprobs=[-5.0] * response,
                versions=[0] * response,
                mask=[1] * response,
                reward=float(i % 2),
                created_at=0.0,
            )  # fmt: skip
        )
    b.step(batch)
    if world.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:
        pathlib.Path("/proc/self/clear_refs").write_text("5")  # Linux: the peak RSS (VmHWM) restarts here
    start = time.perf_counter()
    b.step(batch)
    seconds = time.perf_counter() - start
    if world.device.type == "cuda":
        peak = int(torch.cuda.max_memory_allocated())
        measured = "cuda max_memory_allocated"
    else:
        peak = _rss_peak() - before
        measured = "peak RSS of the second step (VmHWM) - RSS before the backend was built"
    fsdp.shutdown()
    return {"setting": setting, "tokens": tokens, "peak_bytes": peak, "step_s": seconds, "measured": measured}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rss_peak() -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--mlp", type=int, default=2048)
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "SETTING", "TOKENS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], int(args.one[2]))))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = pathlib.Path(tmp) / "qwen3"
        params = make_model(model_dir, args)
        print(f"qwen3-shaped model: {params / 1e6:.1f}M parameters", flush=True)
        for tokens in args.tokens:
            for setting in args.settings:
                out = subprocess.run(
                    [sys.executable, __file__, "--one", str(model_dir), setting, str(tokens)],
                    capture_output=True, text=True, check=True,
                    env={**os.environ, "PYTHONWARNINGS": "ignore", **MALLOC},
                )  # fmt: skip
                row = json.loads(out.stdout.strip().splitlines()[-1])
                row["bound_bytes"] = bound_bytes(params, tokens, args)
                row["ratio"] = row["peak_bytes"] / row["bound_bytes"]
                rows.append(row)
                print(
                    f"{tokens:>6} tokens  {setting:<18} peak {row['peak_bytes'] / 2**30:6.2f} GiB"
                    f"  bound {row['bound_bytes'] / 2**30:6.2f} GiB  ratio {row['ratio']:5.2f}"
                    f"  step {row['step_s']:6.2f} s",
                    flush=True,
                )
    result = {"params": params, "shape": {k: v for k, v in vars(args).items() if k not in ("json", "one")},
              "rows": rows}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(markdown(result))
    return 0


def markdown(result: dict[str, Any]) -> str:
    """The BENCHMARKS.md section's table."""
    lines = [
        "| tokens | setting | peak (GiB) | lower bound (GiB) | peak ÷ bound | step (s) |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['tokens']} | {r['setting']} | {r['peak_bytes'] / 2**30:.2f}"
            f" | {r['bound_bytes'] / 2**30:.2f} | **{r['ratio']:.2f}** | {r['step_s']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
