"""AReaL's allocation strings (``areal/api/alloc_mode.py``) -> rollout and trainer sizes: the converts of
``rollout.backend`` (``sglang:d4p1t1``, ``vllm:d1t2``), ``actor.backend`` (``fsdp:d4``, ``megatron:d2t2``,
``archon:d8``, the MoE form ``megatron:(attn:d4p4t2|ffn:d2p4e4)``) and the older one-string
``allocation_mode`` (``sglang:d4p1t1+fsdp:d4p1t1``). Used by ``importer/areal.py``.

d is data parallel (rollout: servers), t/p/c tensor/pipeline/context parallel; in the MoE form the
attention section gives d/t/p/c (the world size) and the ffn section the expert parallel size e.
"""

from __future__ import annotations

import re
from typing import Any

from asyncrl_workloads.importer.rules import Context, Many, Skip, ceil_div

_HEAD = re.compile(r"^(?:(?P<engine>[a-z]+)(?:\[\w+\])?\s*[:.])?\s*(?P<dims>.+)$")
_DIMS = re.compile(r"^(?:[dptce]\d+)+$")
_HYBRID = re.compile(r"^\(?\s*attn\s*:\s*(?P<attn>[dptc\d]+)\s*\|\s*ffn\s*:\s*(?P<ffn>[dpte\d]+)\s*\)?$")


def _dims(text: str) -> dict[str, int]:
    return {m[0]: int(m[1:]) for m in re.findall(r"[dptce]\d+", text)}


def parse(part: str) -> tuple[str, dict[str, int]]:
    """(engine, {d, t, p, c, e}) of one allocation; Skip when it is not one."""
    found = _HEAD.match(part.strip())
    if found is None:
        raise Skip(f"{part!r} is not an AReaL allocation (e.g. sglang:d4p1t1)")
    engine, dims = found.group("engine") or "", found.group("dims").replace(" ", "")
    if (hybrid := _HYBRID.match(dims)) is not None:
        attn, ffn = _dims(hybrid.group("attn")), _dims(hybrid.group("ffn"))
        if ffn.get("t", 1) != 1:
            raise Skip(f"{part!r}: expert tensor parallelism (ffn t) has no asyncrl field")
        return engine, {**attn, "e": ffn.get("e", 1)}
    if not _DIMS.match(dims):
        raise Skip(f"{part!r} is not an AReaL allocation (e.g. sglang:d4p1t1)")
    return engine, _dims(dims)


def generation(value: Any, ctx: Context) -> Many:
    engine, d = parse(str(value).split("+")[0])
    if engine not in ("", "sglang", "vllm"):
        raise Skip(f"{engine!r} generation: asyncrl generates with vLLM")
    note = "SGLang's servers become vLLM replicas" if engine == "sglang" else ""
    return Many(
        {"rollout.replicas": d.get("d", 1), "rollout.gpusPerReplica": d.get("t", 1) * d.get("p", 1)}, note
    )


def training(value: Any, ctx: Context) -> Many:
    engine, d = parse(str(value).split("+")[-1])
    if engine not in ("", "fsdp", "megatron", "archon"):
        raise Skip(f"{engine!r} training: asyncrl trains with fsdp2 or megatron-core")
    tp, pp, cp, ep = (d.get(k, 1) for k in "tpce")
    gpus = d.get("d", 1) * tp * pp * cp
    per_pod = min(gpus, int(ctx.number("cluster.n_gpus_per_node", 8)))
    model_parallel = (tp, pp, cp, ep) != (1, 1, 1, 1)
    backend = "megatron" if engine == "megatron" or (engine == "archon" and model_parallel) else "fsdp2"
    note = ""
    if engine == "archon":
        note = "archon (AReaL's PyTorch-native engine): " + (
            "megatron, asyncrl's backend with model parallelism" if model_parallel else "FSDP2 data parallel"
        )
    return Many(
        {
            "trainer.backend": backend,
            "trainer.replicas": ceil_div(gpus, per_pod),
            "trainer.gpusPerReplica": per_pod,
            "trainer.parallelism": {"tp": tp, "pp": pp, "cp": cp, "ep": ep},
        },
        note,
    )


def combined(value: Any, ctx: Context) -> Many:
    """allocation_mode: generation + training (a colocated single allocation is refused)."""
    if "+" not in str(value):
        raise Skip("one allocation for both roles (colocated): asyncrl separates generation and training")
    generated, trained = generation(value, ctx), training(value, ctx)
    note = "; ".join(n for n in (generated.note, trained.note) if n)
    return Many({**generated.values, **trained.values}, note)
