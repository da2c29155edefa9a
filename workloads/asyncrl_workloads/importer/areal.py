"""AReaL's keys (async GRPO with ``max_head_offpolicyness``, the agent modes behind its OpenAI-compatible
proxy) -> AsyncRLJob fields: the one table of ``asyncrl import areal``, read by ``importer/translate.py``
and listed in docs/coming-from-verl-areal.md. Key names are AReaL's own (``areal/api/cli_args.py``,
``examples/math/*.yaml``): ``rollout.backend`` / ``actor.backend`` (``sglang:d4p1t1``, ``fsdp:d4p1t1``),
or the older one-string ``allocation_mode`` (``sglang:d4p1t1+d4p1t1``)."""

from __future__ import annotations

import re
from typing import Any

from asyncrl_workloads.importer.rules import (
    Context,
    Gone,
    Implied,
    Many,
    Skip,
    Table,
    To,
    ceil_div,
    choice,
    integer,
    one_path,
    only,
    positive,
)

_PART = re.compile(r"^(?:(?P<engine>[a-z]+)[:.])?(?P<dims>(?:[dptce]\d+)+)$")


def _dims(part: str) -> tuple[str, dict[str, int]]:
    found = _PART.match(part.strip())
    if found is None:
        raise Skip(f"{part!r} is not an AReaL allocation (e.g. sglang:d4p1t1)")
    dims = {m[0]: int(m[1:]) for m in re.findall(r"[dptce]\d+", found.group("dims"))}
    return found.group("engine") or "", dims


def _generation(value: Any, ctx: Context) -> Many:
    engine, d = _dims(str(value).split("+")[0])
    if engine not in ("", "sglang", "vllm"):
        raise Skip(f"{engine!r} generation: asyncrl generates with vLLM")
    return Many({"rollout.replicas": d.get("d", 1), "rollout.gpusPerReplica": d.get("t", 1) * d.get("p", 1)})


def _training(value: Any, ctx: Context) -> Many:
    parts = str(value).split("+")
    engine, d = _dims(parts[-1])
    if engine not in ("", "fsdp", "megatron"):
        raise Skip(f"{engine!r} training: asyncrl trains with fsdp2 or megatron-core")
    tp, pp, cp, ep = (d.get(k, 1) for k in "tpce")
    gpus = d.get("d", 1) * tp * pp * cp
    per_pod = min(gpus, int(ctx.number("cluster.n_gpus_per_node", 8)))
    return Many(
        {
            "trainer.backend": "megatron" if engine == "megatron" else "fsdp2",
            "trainer.replicas": ceil_div(gpus, per_pod),
            "trainer.gpusPerReplica": per_pod,
            "trainer.parallelism": {"tp": tp, "pp": pp, "cp": cp, "ep": ep},
        }
    )


def _allocation(value: Any, ctx: Context) -> Many:
    if "+" not in str(value):
        raise Skip("one allocation for both roles (colocated): asyncrl separates generation and training")
    return Many({**_generation(value, ctx).values, **_training(value, ctx).values})


def _per_replica(value: Any, ctx: Context) -> int:
    replicas = _generation(ctx.get("rollout.backend") or ctx.get("allocation_mode", "d1"), ctx).values
    return ceil_div(positive(value, ctx), replicas["rollout.replicas"])


def _staleness(value: Any, ctx: Context) -> Many:
    eta = integer(value, ctx)
    return Many({"mode": "sync"} if eta == 0 else {"async.maxStaleness": eta})


def _parser(value: Any, ctx: Context) -> str:
    if value in ("qwen25", "qwen", "hermes"):
        return "hermes"
    raise Skip(f"{value!r}: name a vLLM tool parser in agent.toolParser")


def _validation(value: Any, ctx: Context) -> str:
    if any(k.startswith("rollout.agent.") for k in ctx.cfg):
        raise Skip("a gateway job runs no validation set (the user's agent drives every episode)")
    return one_path(value, ctx)


def _clip_high(value: Any, ctx: Context) -> Any:
    if ctx.get("actor.eps_clip_higher") is not None:
        raise Skip("actor.eps_clip_higher sets it")
    return value


_STYLES = {"concat": "concat", "individual": "individual"}
_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}
_LAUNCHER = "AReaL's launcher and scheduler (local, Ray, Slurm): the operator schedules pods"
_TRACKING = "asyncrl exports Prometheus metrics and a JSON step log; W&B/TensorBoard are not wired in"
_SAME_HERE = "always so in asyncrl"

TABLE: Table = {
    "experiment_name": Implied("metadata.name (unless --name)"),
    "trial_name": Gone("no trials: one AsyncRLJob per name"),
    "seed": Gone("no seed field in the job"),
    "total_train_epochs": Gone("no epochs: prompts are drawn until maxSteps"),
    "tokenizer_path": Implied("the model's own tokenizer (model.path)"),
    "enable_offload": Gone("offloading: not exposed"),
    "allocation_mode": To(
        "rollout.*, trainer.*", _allocation, "d = replicas or data parallel, t/p/c/e parallel"
    ),
    "cluster.n_gpus_per_node": Implied("trainer pods get at most this many GPUs"),
    "cluster.n_nodes": Implied("the allocation says how many GPUs each role gets"),
    "cluster.*": Gone(_LAUNCHER),
    "scheduler.*": Gone(_LAUNCHER),
    "launcher.*": Gone(_LAUNCHER),
    "rollout.backend": To("rollout.replicas, rollout.gpusPerReplica", _generation, "d servers of t*p GPUs"),
    "rollout.max_concurrent_rollouts": To("rollout.maxInflightPrompts", _per_replica, "AReaL's is global"),
    "rollout.queue_size": To(
        "async.queue.maxSize",
        lambda v, c: positive(v, c) * int(c.number("gconfig.n_samples", 1)),
        "AReaL counts groups, asyncrl trajectories",
    ),
    "rollout.consumer_batch_size": To("trainer.batch.prompts", positive),
    "rollout.max_head_offpolicyness": To(
        "async.maxStaleness", _staleness, "versions in both; 0 is mode sync"
    ),
    "rollout.agent.mode": To(
        "agent.loop", lambda v, c: "gateway", "the agent drives the policy over the OpenAI-compatible gateway"
    ),
    "rollout.agent.export_style": To("agent.gateway.export", choice(_STYLES, "unknown export style {value}")),
    "rollout.agent.turn_discount": To("agent.gateway.turnDiscount"),
    "rollout.agent.admin_api_key": To("agent.gateway.adminKeySecret"),
    "rollout.agent.tool_call_parser": To("agent.toolParser", _parser),
    "rollout.agent.max_turns": To("agent.maxAssistantTurns", positive),
    "rollout.agent.*": Gone("agent-service knob with no asyncrl field"),
    "rollout.*": Gone("rollout controller knob with no asyncrl field (paths, tracing, scheduling)"),
    "gconfig.n_samples": To("rollout.sampling.samplesPerPrompt", positive),
    "gconfig.max_new_tokens": To("rollout.sampling.maxTokens", positive),
    "gconfig.max_tokens": To("rollout.engine.maxModelLen", positive),
    "gconfig.temperature": To("rollout.sampling.temperature"),
    "gconfig.top_p": To("rollout.sampling.topP"),
    "gconfig.greedy": To("", only(False, "greedy training samples: set rollout.sampling.temperature 0")),
    "gconfig.min_new_tokens": To("", only(0, "no minimum response length in asyncrl")),
    "gconfig.*": Gone("sampling knob with no asyncrl field"),
    "actor.path": To("model.path"),
    "actor.dtype": To(
        "model.dtype", choice(_DTYPES, "dtype {value}: asyncrl takes bfloat16, float16, float32")
    ),
    "actor.backend": To("trainer.*", _training, "d data parallel, t/p/c/e model parallel"),
    "actor.mb_spec.max_tokens_per_mb": To("trainer.batch.microBatchTokens", positive),
    "actor.optimizer.type": To("", only("adam", "asyncrl's optimizer is AdamW")),
    "actor.optimizer.lr": To("trainer.optimizer.lr"),
    "actor.optimizer.weight_decay": To("trainer.optimizer.weightDecay"),
    "actor.optimizer.gradient_clipping": To("trainer.optimizer.gradClip"),
    "actor.optimizer.lr_scheduler_type": To(
        "", only("constant", "asyncrl's schedule is linear warmup, then constant")
    ),
    "actor.optimizer.*": Gone("AdamW betas/eps and warmup proportion: asyncrl takes warmupSteps"),
    "actor.eps_clip": (To("trainer.algorithm.clipLow"), To("trainer.algorithm.clipHigh", _clip_high)),
    "actor.eps_clip_higher": To("trainer.algorithm.clipHigh"),
    "actor.kl_ctl": To("trainer.algorithm.kl", only(0.0, "a KL loss to the reference is not implemented")),
    "actor.ppo_n_minibatches": To("trainer.batch.miniBatches", positive),
    "actor.use_decoupled_loss": To("trainer.algorithm.correction", lambda v, c: "decoupled" if v else "none"),
    "actor.behav_imp_weight_cap": To("trainer.algorithm.isCap"),
    "actor.weight_update_mode": To(
        "weightSync.backend", choice({"xccl": "nccl"}, "{value}: asyncrl syncs over NCCL")
    ),
    "actor.reward_scaling": Gone("reward shaping: scale in the reward function"),
    "actor.reward_bias": Gone("reward shaping: shift in the reward function"),
    "actor.reward_norm.*": Implied("GRPO normalises rewards within each group"),
    "actor.adv_norm.*": Implied("GRPO normalises advantages within each group"),
    "actor.temperature": Implied("the sampling temperature (gconfig.temperature)"),
    "actor.max_new_tokens": Implied("gconfig.max_new_tokens"),
    "actor.*": Gone("trainer knob with no asyncrl field (IcePop/rejection filters, checkpointing, paths)"),
    "ref.*": Gone("a reference policy: no KL to a reference in asyncrl"),
    "vllm.max_model_len": To("rollout.engine.maxModelLen", positive),
    "vllm.gpu_memory_utilization": To("rollout.engine.gpuMemoryUtilization"),
    "vllm.*": Implied("set by asyncrl from the model and rollout.engine"),
    "sglang.context_length": To("rollout.engine.maxModelLen", positive),
    "sglang.mem_fraction_static": To("rollout.engine.gpuMemoryUtilization"),
    "sglang.*": Gone("SGLang server argument: asyncrl runs vLLM (rollout.engine.args)"),
    "train_dataset.path": To("data.prompts", one_path, "parquet, JSONL, JSON or a datasets folder, by path"),
    "train_dataset.batch_size": To("trainer.batch.prompts", positive),
    "train_dataset.shuffle": Implied("asyncrl draws prompts in a shuffled order"),
    "train_dataset.type": To("", only("rl", "asyncrl trains RL jobs")),
    "train_dataset.*": Gone("data loader knob with no asyncrl field"),
    "valid_dataset.path": To("data.validation", _validation),
    "valid_dataset.*": Gone("validation loader knob with no asyncrl field (data.validationSampling samples)"),
    "saver.freq_steps": To("trainer.checkpoint.everySteps", positive),
    "saver.*": Gone("checkpoints by epochs or seconds: asyncrl counts steps"),
    "recover.mode": Implied("a restarted job resumes from its newest checkpoint"),
    "recover.*": Gone("recovery knob: asyncrl resumes from trainer.checkpoint"),
    "evaluator.freq_steps": To("data.validateEverySteps", positive),
    "evaluator.*": Gone("evaluation by epochs or seconds: asyncrl counts steps"),
    "stats_logger.*": Gone(_TRACKING),
    "perf_tracer.*": Gone("performance tracing: use py-spy on a pod"),
}
