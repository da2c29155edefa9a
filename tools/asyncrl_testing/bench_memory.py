"""Trainer memory and scale benchmark (a script, not a test): the live tensor bytes at the peak of one
FSDP2 training step and its time, per micro-batch size, with each spec.trainer.memory feature off and
on, beside the analytic lower bound (issue 43, item 7).

    .venv/bin/python tools/asyncrl_testing/bench_memory.py --json /tmp/memory.json             # the issue's
    .venv/bin/python tools/asyncrl_testing/bench_memory.py --hidden 128 --layers 2 --tokens 1024 --real 1024

The model is Qwen3-shaped and randomly initialised from transformers' Qwen3Config (no download; the
defaults: Qwen3's 151,936-token vocabulary, tied embeddings, hidden 768, 12 layers, 12 heads over 4
KV heads, head dim 64, MLP 2048: about 192M parameters). Each (setting, tokens, mode) runs in a fresh
process: the trainer's own ``backend.FSDP2Backend`` (FSDP2 over a world of one, the memory settings
applied where it wraps the model) and two calls of its ``step`` on one micro-batch of ``tokens``
tokens (8 sequences of lengths up to 25% apart), the tis loss, AdamW. The first step allocates Adam's
moments; the second is measured.

What is measured: torch's own tensor-memory tracker (``torch.distributed._tools.mem_tracker.MemTracker``,
a dispatch mode that adds up the storages of live tensors, as ``torch.cuda.max_memory_allocated``
does, without the allocator's cached pages) over the second step: its peak, and what the peak held
by kind (parameters, gradients, optimizer state, activations, temporaries of backward). The
FSDP-specific ``FSDPMemTracker`` cannot follow this model: the trainer's log-prob method is a second
FSDP forward method of the root (``register_fsdp_forward_method``), which bypasses the hooks that
tracker instruments (it fails with a KeyError on the root in pre-backward). The plain tracker is
given the model and optimizer (``track_external``) and sees every op FSDP2 runs; it takes the base
model and the head, called straight from that method several times a step, for a second iteration
and refuses, so ``_Tracker`` records a repeat call the way it records a shared submodule's. On
CUDA the script also records ``torch.cuda.max_memory_allocated``.

Two modes, said per row:

- **real**: real tensors, gloo. Gives the step time (the second step, the tracker's bookkeeping
  included). On this 2-core CPU only affordable at 4096 tokens.
- **fake**: the same backend built and stepped under FakeTensorMode (tensors with shapes, dtypes and
  storages but no data; torch's memory-estimation recipe, as torchtitan's estimation.py: ``FakeStore``
  and the "fake" process group), so the peak is computed without the FLOPs. transformers'
  ``from_pretrained`` reads the weights into fake tensors; the device mesh is built outside the mode
  (``DeviceMesh`` computes its coordinates with ``nonzero``), the batch's token lists before it.
  ``_FakeData`` answers what a fake tensor has no value for: a scalar read (``float``, ``.tolist()``)
  is 1 (so the gradient norm is finite and AdamW steps and allocates its moments), ``nonzero`` and a
  boolean index take every element (the step's only data-dependent shapes: the advantages' last
  trained token and the log-prob gap's mask, all ones in this batch). No step time. On a small model
  (hidden 128, 2 layers, 1024 tokens) fake and real peaks agreed to the byte for off, checkpointing
  and all on; the issue's run repeats that check at 4096 tokens (BENCHMARKS.md).

The lower bound per rank (one rank here) is the issue's: parameters + gradients + AdamW's two moments,
16 bytes per float32 parameter, plus one decoder layer's activations for the micro-batch: tokens x
(4 hidden + 3 MLP + 2 x heads x head dim) x 4 bytes (the layer's two norms' inputs and outputs, the
attention's query and output, the MLP's gate, up and their product). Not in it: the language-model
head's logits (tokens x vocabulary) and the layer inputs checkpointing keeps (tokens x hidden x 4
bytes x layers), recorded beside it in the JSON. Reported: peak / bound.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

SETTINGS: dict[str, dict[str, Any]] = {
    "off": {"activation_checkpointing": False, "logprob_chunk_tokens": 0, "packing": False},
    "checkpointing": {"activation_checkpointing": True, "logprob_chunk_tokens": 0, "packing": False},
    "chunked log-probs": {"activation_checkpointing": False, "logprob_chunk_tokens": None, "packing": False},
    "packing": {"activation_checkpointing": False, "logprob_chunk_tokens": 0, "packing": True},
    "all on": {"activation_checkpointing": True, "logprob_chunk_tokens": None, "packing": True},
}
"""spec.trainer.memory per setting (offload is GPU-only: admission refuses it for a CPU trainer)."""

SHAPE: dict[str, int] = {
    "vocab": 151936, "hidden": 768, "layers": 12, "heads": 12, "kv_heads": 4, "head_dim": 64, "mlp": 2048,
}  # fmt: skip
"""The issue's model (~192M parameters, Qwen3's vocabulary): the defaults of the shape options."""

KINDS = ("Parameter", "Gradient", "Optstate", "Activation", "Temp", "Buffer", "Other")
"""MemTracker's kinds of tensor memory (its _MemRefType values), in the order reported."""


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
        max_position_embeddings=max(args.tokens + args.real) + 8,
    )
    torch.manual_seed(0)
    model: Any = transformers.Qwen3ForCausalLM(config)  # type: ignore[no-untyped-call]
    model.save_pretrained(directory)
    return int(sum(p.numel() for p in model.parameters()))


def bound_parts(params: int, tokens: int, shape: dict[str, int]) -> dict[str, int]:
    """The issue's lower bound (module doc) and the two terms it leaves out, in bytes."""
    hidden, layers, mlp = shape["hidden"], shape["layers"], shape["mlp"]
    heads, head_dim = shape["heads"], shape["head_dim"]
    state = 16 * params  # float32 weights, gradients, AdamW's exp_avg and exp_avg_sq
    layer = tokens * (4 * hidden + 3 * mlp + 2 * heads * head_dim) * 4
    return {
        "bound_bytes": state + layer,
        "state_bytes": state,
        "layer_bytes": layer,
        "layer_inputs_bytes": tokens * hidden * 4 * layers,
        "logits_bytes": tokens * shape["vocab"] * 4,
    }


def make_batch(tokens: int) -> list[Any]:
    """8 trajectories of about ``tokens`` tokens in all, lengths up to 25% apart (padding costs what
    it does in practice), a quarter of each the prompt."""
    import torch
    from asyncrl_workloads.bus import trajectory

    gen = torch.Generator().manual_seed(0)
    rows = 8
    per = tokens // rows
    batch = []
    for i in range(rows):
        n = per - (i * per) // (4 * rows)
        prompt = n // 4
        response = n - prompt
        batch.append(
            trajectory.Trajectory(
                id=f"t{i}", job="j", replica=0, group_id=f"g{i // 4}", group_size=4, sample_index=i % 4,
                prompt_ids=torch.randint(4, 1000, (prompt,), generator=gen).tolist(),
                response_ids=torch.randint(4, 1000, (response,), generator=gen).tolist(),
                behaviour_logprobs=[-5.0] * response, versions=[0] * response, mask=[1] * response,
                reward=float(i % 2), created_at=0.0,
            )
        )  # fmt: skip
    return batch


def _tracker_class() -> Any:
    from torch.distributed._tools import mem_tracker

    class _Tracker(mem_tracker.MemTracker):  # type: ignore[no-untyped-call]
        """MemTracker that records a module called again in forward straight from the top (the
        backend's log-prob method calls the base model per micro-batch and the head per chunk) as a
        repeat call, instead of refusing it as a second iteration."""

        def _pre_fw_hook(self, module: Any, inputs: Any) -> None:
            if module not in self.memory_tracking or self._mod_tracker.is_bw:
                super()._pre_fw_hook(module, inputs)
                return
            stats = self.memory_tracking[module]
            stats.input_mem = self._track_inputs_or_outputs(inputs)
            snapshot = self.get_tracker_snapshot()
            stats.local_peak = {dev: snap["Total"] for dev, snap in snapshot.items()}
            stats.snapshots.setdefault(mem_tracker._ModState.PEAK_FW, []).append(snapshot)
            stats.snapshots.setdefault(mem_tracker._ModState.PRE_FW, []).append(copy.deepcopy(snapshot))

    return _Tracker


def _fake_data_mode() -> Any:
    import torch
    from torch._subclasses import fake_tensor
    from torch.utils import _python_dispatch

    aten = torch.ops.aten

    class _FakeData(_python_dispatch.TorchDispatchMode):  # type: ignore[no-untyped-call]
        """What a fake tensor cannot answer (module doc): a scalar read is 1, a boolean index all true."""

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            first = args[0] if args else None
            if not isinstance(first, fake_tensor.FakeTensor):
                return func(*args, **(kwargs or {}))
            if func is aten._local_scalar_dense.default:
                return True if first.dtype == torch.bool else (1.0 if first.is_floating_point() else 1)
            if func is aten.nonzero.default:
                with first.fake_mode:
                    return torch.zeros((first.numel(), first.dim()), dtype=torch.long, device=first.device)
            if func is aten.index.Tensor and any(i is not None and i.dtype == torch.bool for i in args[1]):
                index: list[Any] = []
                for i in args[1]:
                    if i is None or i.dtype != torch.bool:
                        index.append(i)
                    elif isinstance(i, fake_tensor.FakeTensor):
                        with i.fake_mode:
                            index += [torch.zeros(i.numel(), dtype=torch.long, device=i.device)] * i.dim()
                    else:
                        index += list(torch.nonzero(i, as_tuple=True))
                return func(first, index)
            return func(*args, **(kwargs or {}))

    return _FakeData()  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def _fake_tensors() -> Iterator[None]:
    """FakeTensorMode, with the device mesh built outside it."""
    import torch.distributed.device_mesh
    from torch._subclasses import fake_tensor

    real_mesh = torch.distributed.device_mesh.init_device_mesh

    def mesh(*args: Any, **kwargs: Any) -> Any:
        with fake_tensor.unset_fake_temporarily():
            return real_mesh(*args, **kwargs)

    torch.distributed.device_mesh.init_device_mesh = mesh  # fsdp.shard calls it through the module
    try:
        with fake_tensor.FakeTensorMode(allow_non_fake_inputs=True):
            yield
    finally:
        torch.distributed.device_mesh.init_device_mesh = real_mesh


def one(model_dir: str, setting: str, tokens: int, mode: str) -> dict[str, Any]:
    """One (setting, tokens, mode) measurement, in this process."""
    import torch
    import torch.distributed as dist
    from asyncrl_workloads.trainer import backend, fsdp, loss

    fake = mode == "fake"
    if fake:
        from torch.testing._internal.distributed import fake_pg

        dist.init_process_group("fake", rank=0, world_size=1, store=fake_pg.FakeStore())
    world = fsdp.init_world()
    settings = backend.TrainSettings(
        model_path=model_dir,
        lr=1e-5,
        objective=loss.Objective(correction="tis"),
        micro_batch_tokens=tokens,
        memory=fsdp.Memory(**SETTINGS[setting]),
    )
    batch = make_batch(tokens)
    with _fake_tensors() if fake else contextlib.nullcontext():
        b = backend.FSDP2Backend(settings, world)
        data = _fake_data_mode() if fake else contextlib.nullcontext()
        with data:
            b.step(batch)
        cuda = world.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        tracker = _tracker_class()()
        tracker.track_external(b.model, b.optimizer)
        with tracker, data:
            start = time.perf_counter()
            b.step(batch)
            seconds = time.perf_counter() - start
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    row = {
        "setting": setting, "tokens": tokens, "mode": mode, "peak_bytes": peak["Total"],
        "kinds": {k: peak.get(k, 0) for k in KINDS}, "step_s": None if fake else seconds,
        "cuda_peak_bytes": int(torch.cuda.max_memory_allocated()) if cuda else None,
    }  # fmt: skip
    fsdp.shutdown()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", type=int, default=SHAPE["vocab"])
    parser.add_argument("--hidden", type=int, default=SHAPE["hidden"])
    parser.add_argument("--layers", type=int, default=SHAPE["layers"])
    parser.add_argument("--heads", type=int, default=SHAPE["heads"])
    parser.add_argument("--kv-heads", type=int, default=SHAPE["kv_heads"])
    parser.add_argument("--head-dim", type=int, default=SHAPE["head_dim"])
    parser.add_argument("--mlp", type=int, default=SHAPE["mlp"])
    parser.add_argument("--tokens", type=int, nargs="*", default=[4096, 8192, 16384], help="fake-mode sizes")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--real", type=int, nargs="*", default=[4096], metavar="TOKENS",
                        help="sizes also run with real tensors (timed), for --real-settings")  # fmt: skip
    parser.add_argument("--real-settings", nargs="+", default=["off", "all on"], choices=list(SETTINGS))
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--one", nargs=4, metavar=("MODEL", "SETTING", "TOKENS", "MODE"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], int(args.one[2]), args.one[3])))
        return 0
    shape = {k: int(getattr(args, k)) for k in SHAPE}
    runs = [(t, s, "fake") for t in args.tokens for s in args.settings]
    runs += [(t, s, "real") for t in args.real for s in args.real_settings]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = pathlib.Path(tmp) / "qwen3"
        params = make_model(model_dir, args)
        print(f"qwen3-shaped model: {params / 1e6:.1f}M parameters", flush=True)
        for tokens, setting, mode in runs:
            start = time.perf_counter()
            out = subprocess.run(
                [sys.executable, __file__, "--one", str(model_dir), setting, str(tokens), mode],
                capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )  # fmt: skip
            if out.returncode != 0:
                raise SystemExit(f"{tokens} {setting} {mode} failed:\n{out.stderr[-3000:]}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row.update(bound_parts(params, tokens, shape))
            row["ratio"] = row["peak_bytes"] / row["bound_bytes"]
            row["run_s"] = time.perf_counter() - start
            rows.append(row)
            step = f"{row['step_s']:7.1f} s" if row["step_s"] is not None else "      -  "
            print(
                f"{tokens:>6} {setting:<18} {mode:<4} peak {row['peak_bytes'] / 2**30:6.2f} GiB"
                f"  bound {row['bound_bytes'] / 2**30:5.2f} GiB  ratio {row['ratio']:5.2f}  step {step}"
                f"  (process {row['run_s']:.0f} s)",
                flush=True,
            )
    from asyncrl_workloads.trainer import chunked

    # what logprob_chunk_tokens None (the spec's default) comes to on this vocabulary
    result = {
        "params": params, "shape": shape, "settings": SETTINGS, "rows": rows,
        "chunk_tokens": chunked.chunk_tokens(None, shape["vocab"]),
    }  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
