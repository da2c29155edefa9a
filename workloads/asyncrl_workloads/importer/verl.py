"""verl's resolved config (fully_async_policy, one_step_off_policy, the agent loop, separate resource
pools) -> AsyncRLJob fields: the table of ``asyncrl import verl``, read by ``importer/translate.py`` and
listed in docs/coming-from-verl-areal.md. Key names are verl's own (``verl/trainer/config/
_generated_ppo_trainer.yaml``, ``verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml``);
the algorithm keys are read by value in ``verl_algorithm.py``. The seed documents' verl layout
(``rollouter``, ``agent_loop``, ``resource_pool``) is ``verl_seed.py``; its helpers for the agent loop
live here."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from asyncrl_workloads.importer import verl_algorithm as alg
from asyncrl_workloads.importer.rules import (
    Context,
    Derived,
    Gone,
    Implied,
    Many,
    Skip,
    Table,
    To,
    ceil_div,
    integer,
    model_path,
    one_path,
    only,
    part,
    positive,
)

DIALECT = "verl"
NAME_KEY = "trainer.experiment_name"
AR, ACTOR, ROLLOUT = alg.AR, alg.ACTOR, alg.ROLLOUT
TURN = ROLLOUT + "multi_turn."
ASPECTS = alg.ASPECTS


def matches(cfg: Mapping[str, Any]) -> bool:
    return True


def fully_async(ctx: Context) -> bool:
    return any(k.startswith("async_training.") for k in ctx.cfg)


def base(ctx: Context) -> Derived:
    """The mode (fully_async: async; else one_step_off) and the agent loop (with --tool)."""
    fields: dict[str, Any] = {"mode": "async" if fully_async(ctx) else "one-step-off"}
    notes = [
        "mode async (async_training: verl's fully_async_policy)"
        if fully_async(ctx)
        else "mode one-step-off (no async_training: verl's one_step_off_policy)"
    ]
    if ctx.tools and ctx.get(TURN + "enable"):
        fields["agent"] = {"loop": "tool", "tools": list(ctx.tools)}
        notes.append(f"agent loop tool with tools {', '.join(ctx.tools)} (--tool)")
    return Derived(fields, notes)


def _tp(ctx: Context) -> int:
    return int(ctx.number(ROLLOUT + "tensor_model_parallel_size", 1))


def _replicas(value: Any, ctx: Context) -> int:
    gpus = ctx.number("rollout.nnodes", 1) * ctx.number("rollout.n_gpus_per_node", 1)
    return ceil_div(gpus, _tp(ctx))


def _step_prompts(ctx: Context) -> int:
    """Prompts one step trains on: fully_async's require_batches * ppo_mini_batch_size (asyncrl:
    batch.prompts x async.requireBatches), else data.train_batch_size."""
    if fully_async(ctx):
        return int(
            ctx.number(ACTOR + "ppo_mini_batch_size", 0) * ctx.number("async_training.require_batches", 1)
        )
    return int(ctx.number("data.train_batch_size", 0))


def _batch_prompts(value: Any, ctx: Context) -> int:
    """fully_async: one asyncrl batch is one ppo_mini_batch (the step gathers requireBatches of them);
    else the whole train_batch_size."""
    if fully_async(ctx):
        return positive(ctx.number(ACTOR + "ppo_mini_batch_size", 0), ctx)
    return positive(_step_prompts(ctx), ctx)


def _mini_batches(value: Any, ctx: Context) -> int:
    """Optimizer updates per asyncrl batch: fully_async updates once per ppo_mini_batch (1 per batch,
    requireBatches per step); else train_batch_size / ppo_mini_batch_size."""
    if fully_async(ctx):
        return 1
    return ceil_div(ctx.number("data.train_batch_size", 0), ctx.number(ACTOR + "ppo_mini_batch_size", 1))


def _max_steps(value: Any, ctx: Context) -> int:
    return ceil_div(positive(value, ctx), positive(_step_prompts(ctx), ctx))


def _staleness(value: Any, ctx: Context) -> int:
    return 1 + math.ceil(ctx.number("async_training.staleness_threshold", 0.1))


def _validate_every(value: Any, ctx: Context) -> int:
    if not ctx.get("data.val_files"):
        raise Skip("no data.val_files: nothing to validate")
    try:
        one_path(ctx.get("data.val_files"), ctx)
    except Skip as exc:
        raise Skip(f"data.val_files is not mapped ({exc})") from None
    every = positive(value, ctx)
    return (
        every * int(ctx.number("async_training.trigger_parameter_sync_step", 1))
        if fully_async(ctx)
        else every
    )


def backend(value: Any, ctx: Context) -> str:
    if value in ("fsdp", "fsdp2"):
        return "fsdp2"
    if value == "megatron":
        return "megatron"
    raise Skip(f"{value!r} strategy: asyncrl trains with fsdp2 or megatron-core")


def _reward_function(value: Any, ctx: Context) -> str:
    if not isinstance(value, str) or not value.endswith(".py"):
        raise Skip(f"not a .py file: {value!r}")
    prefix = "reward." if "reward.custom_reward_function.path" in ctx.cfg else ""
    name = ctx.get(prefix + "custom_reward_function.name", "compute_score")
    return f"{value.rsplit('/', 1)[-1].removesuffix('.py')}:{name}"


def agent_knob(convert: Any = None) -> Any:
    """An agent-loop knob: mapped only when the loop has asyncrl tools (--tool)."""

    def check(value: Any, ctx: Context) -> Any:
        if not ctx.tools:
            raise Skip("the agent loop needs asyncrl tool functions: import again with --tool pkg.mod:fn")
        return convert(value, ctx) if convert else value

    return check


def parser(value: Any, ctx: Context) -> str:
    if value not in ("hermes",):
        raise Skip(f"{value!r}: name a vLLM tool parser in agent.toolParser (Qwen and hermes use hermes)")
    return "hermes"


_VAL = ROLLOUT + "val_kwargs."


def _val_sampling(convert: Any = None) -> Any:
    """A val_kwargs knob: it means something only with data.val_files and val_kwargs.do_sample true
    (otherwise verl answers greedily, whatever n and temperature say)."""

    def check(value: Any, ctx: Context) -> Any:
        _validate_every(1, ctx)
        if ctx.get(_VAL + "do_sample") is not True:
            raise Skip("val_kwargs.do_sample false: one greedy answer per record, asyncrl's default")
        return value if convert is None else convert(value, ctx)

    return check


def _val_n(value: Any, ctx: Context) -> int:
    n = positive(value, ctx)
    if n > 1 and ctx.number(_VAL + "temperature", 0) <= 0:
        raise Skip("val_kwargs.temperature 0: its n answers would all be the one greedy answer")
    return n


def _tracking(value: Any, ctx: Context) -> Many:
    """trainer.logger: console is asyncrl's step log; wandb, tensorboard and mlflow become spec.tracking
    (verl reads their settings from the environment: WANDB_API_KEY, TENSORBOARD_DIR, MLFLOW_TRACKING_URI)."""
    loggers = value if isinstance(value, list) else [value]
    project = str(ctx.get("trainer.project_name", "verl_examples"))
    out: dict[str, Any] = {}
    left: list[str] = []
    for logger in loggers:
        if logger == "console":
            continue
        if logger == "wandb":
            wandb: dict[str, Any] = {"project": project}
            if ctx.env.get("WANDB_ENTITY"):
                wandb["entity"] = ctx.env["WANDB_ENTITY"]
            if ctx.env.get("WANDB_MODE") == "offline":
                wandb["mode"] = "offline"
            else:
                wandb["apiKeySecret"] = ctx.secret_ref("WANDB_API_KEY", "$WANDB_API_KEY")
            out["tracking.wandb"] = wandb
        elif logger == "tensorboard" and ctx.env.get("TENSORBOARD_DIR", "").startswith("/"):
            out["tracking.tensorboard"] = {"logDir": ctx.env["TENSORBOARD_DIR"]}
        elif logger == "tensorboard":
            left.append(
                "tensorboard: verl writes under $TENSORBOARD_DIR (unset or relative here); set"
                " spec.tracking.tensorboard.logDir to a directory on a volume"
            )
        elif logger == "mlflow" and ctx.env.get("MLFLOW_TRACKING_URI"):
            out["tracking.mlflow"] = {"trackingURI": ctx.env["MLFLOW_TRACKING_URI"], "experiment": project}
        else:
            left.append(f"{logger}: asyncrl's trackers are W&B, TensorBoard and MLflow (with its URI)")
    if left and not out:
        raise Skip("; ".join(left))
    return Many(out, "; ".join(left))


def _resume(value: Any, ctx: Context) -> Any:
    if value not in ("auto", "resume_path") or ctx.get("trainer.resume_from_path"):
        raise Skip(f"{value!r}: a restarted asyncrl job always resumes from its newest checkpoint")
    return value


_SAME_HERE = "always so in asyncrl"
_NO_RAY = "Ray: asyncrl runs on Kubernetes pods (the operator) or local processes (asyncrl run)"
_EPOCHS = (
    "epochs: the data set's size is not known here; maxSteps comes from trainer.total_training_steps or"
    " rollout.total_rollout_steps (set maxSteps = epochs x records / prompts per step)"
)
_CORRECTION = part(alg.correction)
_KL = part(alg.kl)
_LOSS = part(alg.loss)
_LORA = part(alg.lora, unset="LoRA off (rank 0): full fine-tuning")

TABLE: Table = {
    "hydra.*": Gone("Hydra's own settings"),
    "defaults": Gone("Hydra defaults are not composed: import the resolved config verl prints at start"),
    "ray_kwargs.*": Gone(_NO_RAY),
    "ray_init.*": Gone(_NO_RAY),
    "global_profiler.*": Gone("profiling: use py-spy on a pod"),
    "transfer_queue.*": Gone("verl's transfer queue: asyncrl's trajectories travel over NATS JetStream"),
    "skip.*": Gone("verl's rollout dump/replay: not in asyncrl"),
    "distillation.enabled": To("", only(False, "verl's distillation: use spec.teacher (a vLLM endpoint)")),
    "distillation.*": Gone("distillation settings (distillation.enabled is false here)"),
    "critic.optim.lr": alg.critic_key("adv_estimator gae: the critic's learning rate"),
    "critic.cliprange_value": alg.critic_key("adv_estimator gae: the value clip"),
    "critic.model.path": alg.critic_key("adv_estimator gae: where the critic starts"),
    "critic.*": Gone(
        "the critic's other settings: asyncrl's critic (adv_estimator gae) shards, batches and clips its"
        " gradient like the policy, with AdamW"
    ),
    "reward_model.enable": To(
        "",
        only(
            False,
            "a reward-model worker: serve it behind an OpenAI-compatible"
            " endpoint and set reward.type judge and reward.endpoint",
        ),
    ),
    "reward_model.reward_manager": To(
        "",
        only("dapo", "verl's reward managers: asyncrl calls reward.function per sample"),
        "DAPO's overlong",
    ),
    "reward_model.overlong_buffer.*": part(alg.overlong),
    "reward_model.reward_kwargs.overlong_buffer_cfg.*": part(alg.overlong),
    "reward_model.reward_kwargs.max_resp_len": part(alg.overlong),
    "reward.reward_kwargs.overlong_buffer_cfg.*": part(alg.overlong),
    "reward.reward_kwargs.max_resp_len": part(alg.overlong),
    "reward_model.*": Gone("reward model settings (reward_model.enable is false here)"),
    "reward.reward_model.*": Gone("reward model settings: use reward.type judge with reward.endpoint"),
    "reward.reward_manager.*": Gone("verl's reward managers: asyncrl calls reward.function per sample"),
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
    "data.shuffle": To("", only(True, "asyncrl always draws prompts in a shuffled order"), "shuffled"),
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
        To("async.requireBatches", positive, "ppo_mini_batches gathered per step"),
        To("trainer.batch.miniBatches", _mini_batches, "one optimizer update per ppo_mini_batch"),
    ),
    "async_training.partial_rollout": To("rollout.partialRollout"),
    "async_training.max_queue_size": To(
        "async.queue.maxSize",
        lambda v, c: positive(v, c) * int(c.number(ROLLOUT + "n", 1)),
        "verl counts prompts, asyncrl trajectories: times rollout.n",
    ),
    "async_training.concurrent_samples_per_replica": To("rollout.maxInflightPrompts", positive),
    "async_training.use_rollout_log_probs": _CORRECTION,
    "async_training.compute_prox_log_prob": _CORRECTION,
    "async_training.use_trainer_do_validate": Gone(
        "validation runs on rollout replica 0, not on trainer GPUs"
    ),
    "async_training.parallel_validate_and_rollout": Implied("validation runs beside generation"),
    "async_training.*": Gone("fully_async knob with no asyncrl field"),
    "rollout.nnodes": To(
        "rollout.replicas", _replicas, "nnodes * n_gpus_per_node / tensor_model_parallel_size"
    ),
    "rollout.n_gpus_per_node": To("rollout.replicas", _replicas, "nnodes * n_gpus_per_node / tp"),
    "rollout.n": Gone("not read: verl's fully_async samples actor_rollout_ref.rollout.n"),
    "rollout.total_rollout_steps": To("maxSteps", _max_steps, "prompts / prompts per step"),
    "rollout.test_freq": To(
        "data.validateEverySteps", _validate_every, "verl counts syncs: times the sync step"
    ),
    "rollout.max_concurrent_samples_per_replica": To("rollout.maxInflightPrompts", positive),
    "rollout.total_epochs": Gone(_EPOCHS),
    "trainer.nnodes": To("trainer.replicas", positive),
    "trainer.n_gpus_per_node": To("trainer.gpusPerReplica", integer),
    "trainer.total_training_steps": To("maxSteps", positive),
    "trainer.total_epochs": Gone(_EPOCHS),
    "trainer.test_freq": To("data.validateEverySteps", _validate_every),
    "trainer.save_freq": To("trainer.checkpoint.everySteps", lambda v, c: max(0, integer(v, c))),
    "trainer.default_local_dir": To("trainer.checkpoint.path"),
    "trainer.max_actor_ckpt_to_keep": To("trainer.checkpoint.keep", positive),
    "trainer.resume_mode": To("", _resume, "a restarted job resumes from its newest checkpoint"),
    "trainer.val_before_train": To(
        "",
        only(True, "asyncrl validates the initial weights whenever data.validation is set"),
        "the initial weights are validated",
    ),
    "trainer.experiment_name": Implied("metadata.name (unless --name)"),
    "trainer.project_name": Implied("the tracker's project (trainer.logger)"),
    "trainer.logger": To("tracking", _tracking, "console: asyncrl's step log"),
    "trainer.use_legacy_worker_impl": Implied(_SAME_HERE),
    "trainer.*": Gone("trainer loop knob with no asyncrl field"),
    "algorithm.adv_estimator": part(alg.estimator),
    "algorithm.norm_adv_by_std_in_grpo": part(alg.estimator, "groupStd", note="grpo only"),
    "algorithm.gamma": part(alg.estimator, "gamma", note="reinforce_plus_plus (and gae) only"),
    "algorithm.lam": part(alg.estimator, "lam", note="GAE's lambda (adv_estimator gae only)"),
    "algorithm.use_kl_in_reward": _KL,
    "algorithm.kl_penalty": _KL,
    "algorithm.kl_ctrl.*": _KL,
    "algorithm.rollout_correction.*": _CORRECTION,
    "algorithm.filter_groups.enable": part(alg.dynamic_sampling),
    "algorithm.filter_groups.metric": part(alg.dynamic_sampling),
    "algorithm.filter_groups.max_num_gen_batches": Gone(
        "no exact equivalent: asyncrl bounds the groups dropped per step (dynamicSampling.maxDropsPerStep,"
        " 64) instead of the generation batches"
    ),
    "algorithm.*": Gone("algorithm knob with no asyncrl field"),
    AR + "hybrid_engine": To("", only(False, "colocated training and generation: asyncrl separates them")),
    AR + "model.path": To("model.path", model_path),
    AR + "model.lora_rank": _LORA,
    AR + "model.lora_alpha": _LORA,
    AR + "model.target_modules": _LORA,
    AR + "model.exclude_modules": _LORA,
    AR + "model.lora.rank": _LORA,
    AR + "model.lora.*": Gone("verl's Megatron-Bridge LoRA settings: read only with model.lora.rank > 0"),
    AR + "model.use_shm": Gone("verl copies the model to /dev/shm first: asyncrl's pods read model.path"),
    AR + "model.lora_adapter_path": To("", only(None, "a LoRA adapter to start from: asyncrl's start fresh")),
    AR + "model.*": Gone("model loading knob (padding removal, checkpointing, kernels): not exposed"),
    AR + "ref.*": Implied("the reference policy (kl > 0): a frozen copy of model.path on the trainer ranks"),
    ACTOR + "strategy": To("trainer.backend", backend),
    ACTOR + "fsdp_config.strategy": To("trainer.backend", backend),
    ACTOR + "megatron.tensor_model_parallel_size": To("trainer.parallelism.tp", positive),
    ACTOR + "megatron.pipeline_model_parallel_size": To("trainer.parallelism.pp", positive),
    ACTOR + "megatron.context_parallel_size": To("trainer.parallelism.cp", positive),
    ACTOR + "megatron.expert_model_parallel_size": To("trainer.parallelism.ep", positive),
    ACTOR + "optim.lr": To("trainer.optimizer.lr"),
    ACTOR + "optim.weight_decay": To("trainer.optimizer.weightDecay"),
    ACTOR + "optim.lr_warmup_steps": To("trainer.optimizer.warmupSteps", positive),
    ACTOR + "optim.clip_grad": To("trainer.optimizer.gradClip"),
    ACTOR + "grad_clip": To("trainer.optimizer.gradClip"),
    ACTOR + "clip_ratio": _LOSS,
    ACTOR + "clip_ratio_low": _LOSS,
    ACTOR + "clip_ratio_high": _LOSS,
    ACTOR + "clip_ratio_c": _LOSS,
    ACTOR + "tau_pos": _LOSS,
    ACTOR + "tau_neg": _LOSS,
    ACTOR + "loss_agg_mode": _LOSS,
    ACTOR + "loss_scale_factor": _LOSS,
    ACTOR + "policy_loss.loss_mode": _LOSS,
    ACTOR + "policy_loss.*": Implied("the settings of verl's other loss modes (clip_cov, kl_cov, dro)"),
    ACTOR + "entropy_coeff": part(alg.entropy),
    ACTOR + "calculate_entropy": Implied("entropy is computed when entropyCoef > 0 and logged"),
    ACTOR + "use_kl_loss": _KL,
    ACTOR + "kl_loss_coef": _KL,
    ACTOR + "kl_loss_type": _KL,
    ACTOR + "use_rollout_log_probs": _CORRECTION,
    ACTOR + "ppo_mini_batch_size": (
        To("trainer.batch.prompts", _batch_prompts, "fully_async: one mini-batch per asyncrl batch"),
        To("trainer.batch.miniBatches", _mini_batches),
    ),
    ACTOR + "ppo_max_token_len_per_gpu": To("trainer.batch.microBatchTokens", positive),
    ACTOR + "use_dynamic_bsz": Implied("micro-batches are always packed by tokens (microBatchTokens)"),
    ACTOR + "ppo_epochs": To("", only(1, "one pass over each batch")),
    ACTOR + "ulysses_sequence_parallel_size": To(
        "",
        only(
            1,
            "Ulysses sequence parallelism: not in asyncrl's fsdp2 backend (megatron: trainer.parallelism.cp)",
        ),
    ),
    ACTOR + "*": Gone("actor knob with no asyncrl field"),
    ROLLOUT + "name": To("rollout.engine.name", only("vllm", "asyncrl runs vLLM")),
    ROLLOUT + "n": (To("rollout.sampling.samplesPerPrompt", positive), part(alg.estimator, "name")),
    ROLLOUT + "temperature": To("rollout.sampling.temperature"),
    ROLLOUT + "top_p": To("rollout.sampling.topP"),
    ROLLOUT + "gpu_memory_utilization": To("rollout.engine.gpuMemoryUtilization"),
    ROLLOUT + "enforce_eager": To("rollout.engine.enforceEager"),
    ROLLOUT + "tensor_model_parallel_size": To("rollout.gpusPerReplica", positive, "one vLLM per tp GPUs"),
    ROLLOUT + "max_num_seqs": To("rollout.engine.args.max_num_seqs", positive),
    ROLLOUT + "max_num_batched_tokens": To("rollout.engine.args.max_num_batched_tokens", positive),
    ROLLOUT + "free_cache_engine": Implied(_SAME_HERE),
    ROLLOUT + "calculate_log_probs": Implied(_SAME_HERE),
    ROLLOUT + "layered_summon": Gone(
        "verl gathers the FSDP model layer by layer to hand vLLM its LoRA weights: asyncrl's sync sends the"
        " adapter alone"
    ),
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
    TURN + "max_user_turns": To("agent.maxUserTurns", agent_knob()),
    TURN + "max_assistant_turns": To("agent.maxAssistantTurns", agent_knob()),
    TURN + "max_parallel_calls": To("agent.maxParallelCalls", agent_knob()),
    TURN + "max_tool_response_length": To("agent.maxToolResponseChars", agent_knob()),
    TURN + "format": To("agent.toolParser", agent_knob(parser)),
    TURN + "tool_config_path": Gone("verl tool classes: write asyncrl tool functions, pass them with --tool"),
    TURN + "*": Gone("agent-loop knob with no asyncrl field"),
    ROLLOUT + "*": Gone("rollout engine knob with no asyncrl field"),
}
