"""verl's keys (fully_async_policy, one_step_off_policy, the agent loop, separate resource pools) ->
AsyncRLJob fields: the one table of ``asyncrl import verl``, read by ``importer/translate.py`` and listed
in docs/coming-from-verl-areal.md. Key names are verl's own (``verl/trainer/config/ppo_trainer.yaml``,
``verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml``)."""

from __future__ import annotations

import math
from typing import Any

from asyncrl_workloads.importer.rules import (
    Context,
    Gone,
    Implied,
    Skip,
    Table,
    To,
    ceil_div,
    integer,
    one_path,
    only,
    positive,
)

AR = "actor_rollout_ref."
ACTOR, ROLLOUT = AR + "actor.", AR + "rollout."
TURN = ROLLOUT + "multi_turn."


def fully_async(ctx: Context) -> bool:
    return any(k.startswith("async_training.") for k in ctx.cfg)


def _tp(ctx: Context) -> int:
    return int(ctx.number(ROLLOUT + "tensor_model_parallel_size", 1))


def _replicas(value: Any, ctx: Context) -> int:
    gpus = ctx.number("rollout.nnodes", 1) * ctx.number("rollout.n_gpus_per_node", 1)
    return ceil_div(gpus, _tp(ctx))


def _step_prompts(ctx: Context) -> int:
    """Prompts one asyncrl step trains on: fully_async's require_batches * ppo_mini_batch_size, else
    data.train_batch_size."""
    if fully_async(ctx):
        return int(
            ctx.number(ACTOR + "ppo_mini_batch_size", 0) * ctx.number("async_training.require_batches", 1)
        )
    return int(ctx.number("data.train_batch_size", 0))


def _batch_prompts(value: Any, ctx: Context) -> int:
    return positive(_step_prompts(ctx), ctx)


def _mini_batches(value: Any, ctx: Context) -> int:
    if fully_async(ctx):
        return integer(ctx.number("async_training.require_batches", 1), ctx)
    return ceil_div(ctx.number("data.train_batch_size", 0), ctx.number(ACTOR + "ppo_mini_batch_size", 1))


def _max_steps(value: Any, ctx: Context) -> int:
    return ceil_div(positive(value, ctx), positive(_step_prompts(ctx), ctx))


def _staleness(value: Any, ctx: Context) -> int:
    return 1 + math.ceil(ctx.number("async_training.staleness_threshold", 0.1))


def _validate_every(value: Any, ctx: Context) -> int:
    if not ctx.get("data.val_files"):
        raise Skip("no data.val_files: nothing to validate")
    every = positive(value, ctx)
    return (
        every * int(ctx.number("async_training.trigger_parameter_sync_step", 1))
        if fully_async(ctx)
        else every
    )


def _backend(value: Any, ctx: Context) -> str:
    if value in ("fsdp", "fsdp2"):
        return "fsdp2"
    if value == "megatron":
        return "megatron"
    raise Skip(f"{value!r} strategy: asyncrl trains with fsdp2 or megatron-core")


def _advantage(value: Any, ctx: Context) -> str:
    if value == "grpo":
        return "grpo"
    raise Skip(f"{value!r}: asyncrl has GRPO and PPO-clip without a critic (trainer.algorithm.name)")


def _no_kl(value: Any, ctx: Context) -> float:
    if ctx.get(ACTOR + "use_kl_loss") and ctx.number(ACTOR + "kl_loss_coef", 0.0) > 0:
        raise Skip(
            "a KL loss to the reference policy is not implemented; serve it with vLLM, set spec.teacher"
        )
    return 0.0


def _correction(value: Any, ctx: Context) -> str:
    if ctx.get("algorithm.rollout_correction.rollout_is"):
        return "tis"
    return "none" if ctx.get("algorithm.rollout_correction.bypass_mode") else "decoupled"


def _reward_function(value: Any, ctx: Context) -> str:
    if not isinstance(value, str) or not value.endswith(".py"):
        raise Skip(f"not a .py file: {value!r}")
    prefix = "reward." if "reward.custom_reward_function.path" in ctx.cfg else ""
    name = ctx.get(prefix + "custom_reward_function.name", "compute_score")
    return f"{value.rsplit('/', 1)[-1].removesuffix('.py')}:{name}"


def _agent(convert: Any = None) -> Any:
    """A multi_turn knob: mapped only when the loop has asyncrl tools (--tool)."""

    def check(value: Any, ctx: Context) -> Any:
        if not ctx.tools:
            raise Skip("the agent loop needs asyncrl tool functions: import again with --tool pkg.mod:fn")
        return convert(value, ctx) if convert else value

    return check


_VAL = ROLLOUT + "val_kwargs."


def _val_sampling(convert: Any = None) -> Any:
    """A val_kwargs knob: it means something only with data.val_files and val_kwargs.do_sample true
    (otherwise verl answers greedily, whatever n and temperature say)."""

    def check(value: Any, ctx: Context) -> Any:
        if not ctx.get("data.val_files"):
            raise Skip("no data.val_files: nothing to validate")
        if ctx.get(_VAL + "do_sample") is not True:
            raise Skip("val_kwargs.do_sample false: one greedy answer per record, asyncrl's default")
        return value if convert is None else convert(value, ctx)

    return check


def _val_n(value: Any, ctx: Context) -> int:
    n = positive(value, ctx)
    if n > 1 and ctx.number(_VAL + "temperature", 0) <= 0:
        raise Skip("val_kwargs.temperature 0: its n answers would all be the one greedy answer")
    return n


def _parser(value: Any, ctx: Context) -> str:
    if value not in ("hermes",):
        raise Skip(f"{value!r}: name a vLLM tool parser in agent.toolParser (Qwen and hermes use hermes)")
    return "hermes"


_SAME_HERE = "always so in asyncrl"
_NO_RAY = "Ray: asyncrl runs on Kubernetes pods (the operator) or local processes (asyncrl run)"
_TRACKING = "asyncrl exports Prometheus metrics and a JSON step log; W&B/TensorBoard are not wired in"

TABLE: Table = {
    "hydra.*": Gone("Hydra's own settings"),
    "defaults": Gone("Hydra defaults are not composed: import the resolved config verl prints at start"),
    "ray_kwargs.*": Gone(_NO_RAY),
    "ray_init.*": Gone(_NO_RAY),
    "global_profiler.*": Gone("profiling: use py-spy on a pod"),
    "critic.*": Gone("a critic: asyncrl trains without one (GRPO, PPO-clip on sample advantages)"),
    "reward_model.enable": To(
        "",
        only(
            False,
            "a reward-model worker: serve it behind an OpenAI-compatible"
            " endpoint and set reward.type judge and reward.endpoint",
        ),
    ),
    "reward_model.*": Gone("reward model settings (reward_model.enable is false here)"),
    "reward.reward_model.*": Gone("reward model settings: use reward.type judge with reward.endpoint"),
    "data.train_files": To("data.prompts", one_path, "parquet, JSONL, JSON or a datasets folder, by path"),
    "data.val_files": To(
        "data.validation", one_path, "scored by rollout replica 0 (greedy unless val_kwargs)"
    ),
    "data.prompt_key": To("data.promptKey"),
    "data.reward_fn_key": To("", only("data_source", "asyncrl passes the record's data_source field")),
    "data.max_prompt_length": To(
        "rollout.engine.maxModelLen",
        lambda v, c: integer(v, c) + integer(c.get("data.max_response_length", 0), c),
        "max_prompt_length + max_response_length",
    ),
    "data.max_response_length": To("rollout.sampling.maxTokens", positive),
    "data.train_batch_size": To("trainer.batch.prompts", _batch_prompts, "prompts per trainer step"),
    "data.return_raw_chat": Implied("data.format chat: prompts go through the model's chat template"),
    "data.shuffle": Implied("asyncrl draws prompts in a shuffled order"),
    "data.gen_batch_size": Implied("each rollout generates prompt groups one by one"),
    "data.filter_overlong_prompts": Gone("a prompt longer than maxModelLen fails that group, logged"),
    "data.custom_cls.*": Gone("a custom dataset class: write its rows as parquet/JSONL first"),
    "data.*": Gone("dataset loading knob with no asyncrl field"),
    "reward.custom_reward_function.path": To(
        "reward.function",
        _reward_function,
        "the file must be importable in the rollout (image or a mounted volume on PYTHONPATH)",
    ),
    "custom_reward_function.path": To(
        "reward.function",
        _reward_function,
        "the file must be importable in the rollout (image or a mounted volume on PYTHONPATH)",
    ),
    "reward.custom_reward_function.name": Implied("part of reward.function (module:name)"),
    "custom_reward_function.name": Implied("part of reward.function (module:name)"),
    "custom_reward_function.reward_kwargs.*": Gone("extra keyword arguments: bind them in your function"),
    "reward.custom_reward_function.reward_kwargs.*": Gone(
        "extra keyword arguments: bind them in your function"
    ),
    "async_training.staleness_threshold": To(
        "async.maxStaleness", _staleness, "verl counts a fraction of a batch, asyncrl versions: 1 + ceil(it)"
    ),
    "async_training.trigger_parameter_sync_step": To("async.syncEverySteps", positive),
    "async_training.require_batches": (
        To("async.requireBatches", positive),
        To("trainer.batch.miniBatches", _mini_batches, "one optimizer update per mini-batch"),
    ),
    "async_training.partial_rollout": To("rollout.partialRollout"),
    "async_training.max_queue_size": To(
        "async.queue.maxSize",
        lambda v, c: positive(v, c) * int(c.number(ROLLOUT + "n", 1)),
        "verl counts prompts, asyncrl trajectories: times rollout.n",
    ),
    "async_training.use_trainer_do_validate": Gone(
        "validation runs on rollout replica 0, not on trainer GPUs"
    ),
    "async_training.parallel_validate_and_rollout": Implied("validation runs beside generation"),
    "async_training.*": Gone("fully_async knob with no asyncrl field"),
    "rollout.nnodes": To(
        "rollout.replicas", _replicas, "nnodes * n_gpus_per_node / tensor_model_parallel_size"
    ),
    "rollout.n_gpus_per_node": To("rollout.replicas", _replicas, "nnodes * n_gpus_per_node / tp"),
    "rollout.total_rollout_steps": To("maxSteps", _max_steps, "prompts / prompts per step"),
    "rollout.test_freq": To(
        "data.validateEverySteps", _validate_every, "verl counts syncs: times the sync step"
    ),
    "rollout.max_concurrent_samples_per_replica": To("rollout.maxInflightPrompts", positive),
    "rollout.total_epochs": Gone("no epochs: prompts are drawn until maxSteps"),
    "trainer.nnodes": To("trainer.replicas", positive),
    "trainer.n_gpus_per_node": To("trainer.gpusPerReplica", integer),
    "trainer.total_training_steps": To("maxSteps", positive),
    "trainer.total_epochs": Gone("no epochs: prompts are drawn until maxSteps"),
    "trainer.test_freq": To("data.validateEverySteps", _validate_every),
    "trainer.save_freq": To("trainer.checkpoint.everySteps", lambda v, c: max(0, integer(v, c))),
    "trainer.default_local_dir": To("trainer.checkpoint.path"),
    "trainer.val_before_train": Implied("the initial weights are validated when data.validation is set"),
    "trainer.experiment_name": Implied("metadata.name (unless --name)"),
    "trainer.project_name": Gone(_TRACKING),
    "trainer.logger": Gone(_TRACKING),
    "trainer.use_legacy_worker_impl": Implied(_SAME_HERE),
    "trainer.*": Gone("trainer loop knob with no asyncrl field"),
    "algorithm.adv_estimator": To("trainer.algorithm.name", _advantage),
    "algorithm.use_kl_in_reward": To("", only(False, "a KL penalty in the reward is not implemented")),
    "algorithm.kl_ctrl.*": Gone("KL control: no KL to a reference policy in asyncrl"),
    "algorithm.rollout_correction.bypass_mode": To(
        "trainer.algorithm.correction", _correction, "bypass: none; rollout_is: tis; else decoupled"
    ),
    "algorithm.rollout_correction.rollout_is": To("trainer.algorithm.correction", _correction),
    "algorithm.rollout_correction.rollout_is_threshold": To("trainer.algorithm.isCap"),
    "algorithm.*": Gone("algorithm knob with no asyncrl field"),
    AR + "hybrid_engine": To("", only(False, "colocated training and generation: asyncrl separates them")),
    AR + "model.path": To("model.path"),
    AR + "model.*": Gone("model loading knob (padding removal, checkpointing, LoRA): not exposed"),
    AR + "ref.*": Gone("a reference policy: no KL to a reference in asyncrl"),
    ACTOR + "strategy": To("trainer.backend", _backend),
    ACTOR + "fsdp_config.strategy": To("trainer.backend", _backend),
    ACTOR + "megatron.tensor_model_parallel_size": To("trainer.parallelism.tp", positive),
    ACTOR + "megatron.pipeline_model_parallel_size": To("trainer.parallelism.pp", positive),
    ACTOR + "megatron.context_parallel_size": To("trainer.parallelism.cp", positive),
    ACTOR + "megatron.expert_model_parallel_size": To("trainer.parallelism.ep", positive),
    ACTOR + "optim.lr": To("trainer.optimizer.lr"),
    ACTOR + "optim.weight_decay": To("trainer.optimizer.weightDecay"),
    ACTOR + "optim.lr_warmup_steps": To("trainer.optimizer.warmupSteps", positive),
    ACTOR + "grad_clip": To("trainer.optimizer.gradClip"),
    ACTOR + "clip_ratio_low": To("trainer.algorithm.clipLow"),
    ACTOR + "clip_ratio_high": To("trainer.algorithm.clipHigh"),
    ACTOR + "use_kl_loss": To("trainer.algorithm.kl", _no_kl),
    ACTOR + "kl_loss_coef": To("trainer.algorithm.kl", _no_kl),
    ACTOR + "ppo_mini_batch_size": To("trainer.batch.prompts", _batch_prompts, "times require_batches"),
    ACTOR + "ppo_max_token_len_per_gpu": To("trainer.batch.microBatchTokens", positive),
    ACTOR + "use_dynamic_bsz": Implied("micro-batches are always packed by tokens (microBatchTokens)"),
    ACTOR + "ppo_epochs": To("", only(1, "one pass over each batch")),
    ACTOR + "use_rollout_log_probs": Implied(_SAME_HERE),
    ACTOR + "ulysses_sequence_parallel_size": Gone(
        "Ulysses sequence parallelism: not in asyncrl's fsdp2 backend (megatron: trainer.parallelism.cp)"
    ),
    ACTOR + "clip_ratio_c": Gone("dual-clip PPO's lower bound for negative advantages: not implemented"),
    ACTOR + "loss_agg_mode": To("", only("token-mean", "asyncrl averages the loss over tokens (token-mean)")),
    ACTOR + "entropy_coeff": To("", only(0, "no entropy bonus in asyncrl's loss")),
    ACTOR + "*": Gone("actor knob with no asyncrl field"),
    ROLLOUT + "name": To("rollout.engine.name", only("vllm", "asyncrl runs vLLM")),
    ROLLOUT + "n": To("rollout.sampling.samplesPerPrompt", positive),
    ROLLOUT + "temperature": To("rollout.sampling.temperature"),
    ROLLOUT + "top_p": To("rollout.sampling.topP"),
    ROLLOUT + "gpu_memory_utilization": To("rollout.engine.gpuMemoryUtilization"),
    ROLLOUT + "enforce_eager": To("rollout.engine.enforceEager"),
    ROLLOUT + "tensor_model_parallel_size": To("rollout.gpusPerReplica", positive, "one vLLM per tp GPUs"),
    ROLLOUT + "max_num_seqs": To("rollout.engine.args.max_num_seqs", positive),
    ROLLOUT + "max_num_batched_tokens": To("rollout.engine.args.max_num_batched_tokens", positive),
    ROLLOUT + "free_cache_engine": Implied(_SAME_HERE),
    ROLLOUT + "calculate_log_probs": Implied(_SAME_HERE),
    ROLLOUT + "checkpoint_engine.backend": To("weightSync.backend", only("nccl", "asyncrl syncs over NCCL")),
    _VAL + "n": To("data.validationSampling.samplesPerPrompt", _val_sampling(_val_n), "k of mean@k, pass@k"),
    _VAL + "temperature": To("data.validationSampling.temperature", _val_sampling()),
    _VAL + "top_p": To("data.validationSampling.topP", _val_sampling()),
    _VAL + "do_sample": Implied(
        "false: one greedy answer per record; true: val_kwargs' n, temperature, top_p"
    ),
    _VAL + "*": Gone("validation sampling knob with no asyncrl field (top_k: all tokens)"),
    ROLLOUT + "agent.*": Gone("agent-loop workers: the loop runs inside each rollout replica"),
    TURN + "enable": Implied("spec.agent with loop tool (with --tool)"),
    TURN + "max_user_turns": To("agent.maxUserTurns", _agent()),
    TURN + "max_assistant_turns": To("agent.maxAssistantTurns", _agent()),
    TURN + "max_parallel_calls": To("agent.maxParallelCalls", _agent()),
    TURN + "max_tool_response_length": To("agent.maxToolResponseChars", _agent()),
    TURN + "format": To("agent.toolParser", _agent(_parser)),
    TURN + "tool_config_path": Gone("verl tool classes: write asyncrl tool functions, pass them with --tool"),
    TURN + "*": Gone("agent-loop knob with no asyncrl field"),
    ROLLOUT + "*": Gone("rollout engine knob with no asyncrl field"),
}
