"""AReaL's keys (async GRPO with ``max_head_offpolicyness``, the agent modes behind its OpenAI-compatible
proxy) -> AsyncRLJob fields: the table of ``asyncrl import areal``, read by ``importer/translate.py``
and listed in docs/coming-from-verl-areal.md. Key names are AReaL 1.0.4's own (``areal/api/cli_args.py``,
``examples/math/*.yaml``, ``examples/tau2``, ``search_agent``, ``vlm``); the algorithm keys are read by
value in ``areal_algorithm.py``, the allocation strings (``sglang:d4p1t1``, ``archon:d8``,
``megatron:(attn:d4p4t2|ffn:d2p4e4)``, the older one-string ``allocation_mode``) in
``areal_allocation.py``. The seed documents' AReaL layout is ``areal_seed.py``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from asyncrl_workloads.importer import areal_algorithm as alg
from asyncrl_workloads.importer import areal_allocation as allocation
from asyncrl_workloads.importer import hub, hydra
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
    choice,
    integer,
    model_path,
    one_path,
    only,
    part,
    positive,
)

DIALECT = "areal"
NAME_KEY = "experiment_name"
ASPECTS = alg.ASPECTS


def matches(cfg: Mapping[str, Any]) -> bool:
    return True


def gateway(ctx: Context) -> bool:
    return any(k.startswith("rollout.agent.") for k in ctx.cfg)


def base(ctx: Context) -> Derived:
    """The agent gateway for AReaL's agent modes (rollout.agent.*), with an admin key Secret."""
    notes = []
    if ctx.get("valid_dataset.path") and not gateway(ctx) and not ctx.has("eval_gconfig"):
        notes.append(
            "no eval_gconfig: AReaL validates with gconfig or what the training script passes (gsm8k_rl.py:"
            " temperature 0.6); the job answers each validation record once, greedily: set"
            " data.validationSampling to match"
        )
    if not gateway(ctx):
        return Derived(notes=notes)
    fields: dict[str, Any] = {"agent.loop": "gateway"}
    if "rollout.agent.admin_api_key" not in ctx.cfg:
        fields["agent.gateway.adminKeySecret"] = ctx.secret_ref("adminKey", "<an admin key of your choice>")
    notes.append("agent loop gateway (AReaL's agent modes: the agent calls the policy over HTTP)")
    return Derived(fields, notes)


def _per_replica(value: Any, ctx: Context) -> int:
    source = ctx.get("rollout.backend") or ctx.get("allocation_mode", "d1")
    replicas = allocation.generation(source, ctx).values["rollout.replicas"]
    return ceil_div(positive(value, ctx), replicas)


def _staleness(value: Any, ctx: Context) -> Many:
    eta = integer(value, ctx)
    return Many({"mode": "sync"} if eta == 0 else {"async.maxStaleness": eta})


def _parser(value: Any, ctx: Context) -> str:
    if value in ("qwen25", "qwen", "hermes"):
        return "hermes"
    raise Skip(f"{value!r}: name a vLLM tool parser in agent.toolParser")


def _validation(value: Any, ctx: Context) -> str:
    if gateway(ctx):
        raise Skip("a gateway job runs no validation set (the user's agent drives every episode)")
    return one_path(value, ctx)


def steps_per_epoch(ctx: Context) -> int:
    """AReaL's len(train dataloader): records // batch_size (drop_last), where the data set is known."""
    path, batch = ctx.get("train_dataset.path"), ctx.get("train_dataset.batch_size")
    rows = hub.TRAIN_ROWS.get(str(path))
    if rows is None or not isinstance(batch, int) or batch < 1:
        raise Skip(f"epochs: the size of {path!r} is not known here (steps = epochs x records // batch size)")
    return max(1, rows // batch)


def _max_steps(value: Any, ctx: Context) -> int:
    """AReaL stops at total_train_steps or after total_train_epochs, whichever comes first."""
    limits = []
    if isinstance(ctx.get("total_train_steps"), int):
        limits.append(positive(ctx.get("total_train_steps"), ctx))
    try:
        limits.append(int(ctx.number("total_train_epochs", 1)) * steps_per_epoch(ctx))
    except Skip:
        if not limits:
            raise
    return min(limits)


def _every_epochs(value: Any, ctx: Context) -> int:
    return positive(value, ctx) * steps_per_epoch(ctx)


def _eval_sampling(value: Any, ctx: Context) -> Any:
    if gateway(ctx) or not ctx.get("valid_dataset.path"):
        raise Skip("no validation set here")
    return value


def _wandb(value: Any, ctx: Context) -> Many:
    """stats_logger.wandb: mode online/offline -> spec.tracking.wandb, its key a Secret reference."""
    if value == "disabled":
        return Many({}, "no W&B run")
    if value not in ("online", "offline"):
        raise Skip(f"{value!r}: asyncrl's W&B modes are online and offline")
    p = "stats_logger.wandb."
    wandb: dict[str, Any] = {"project": str(ctx.get(p + "project") or ctx.get("experiment_name", "areal"))}
    if value == "offline":
        wandb["mode"] = "offline"
    if ctx.get(p + "entity"):
        wandb["entity"] = ctx.get(p + "entity")
    if str(ctx.get(p + "wandb_base_url", "")).startswith(("http://", "https://")):
        wandb["baseURL"] = ctx.get(p + "wandb_base_url")
    if value == "online":
        wandb["apiKeySecret"] = _wandb_key(ctx)
    return Many({"tracking.wandb": wandb})


def _wandb_key(ctx: Context) -> dict[str, str]:
    """The W&B key's Secret reference: from the config's own key (stats_logger.wandb.wandb_api_key, a
    WANDB_API_KEY in scheduling_spec's env_vars), else from $WANDB_API_KEY."""
    for value in ctx.cfg.values():
        for secret in hydra.secrets_in(value):
            if "wandb" in secret.key.lower():
                where = f"${secret.env}" if secret.env else f"<the value of {secret.key} in your config>"
                return ctx.secret_ref("WANDB_API_KEY", where, secret.key)
    return ctx.secret_ref("WANDB_API_KEY", "$WANDB_API_KEY")


def _tensorboard(value: Any, ctx: Context) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise Skip(f"{value!r}: set spec.tracking.tensorboard.logDir to an absolute directory on a volume")
    return value


def _same_as(key: str, what: str) -> Any:
    def check(value: Any, ctx: Context) -> Any:
        if ctx.get(key) is not None and value != ctx.get(key):
            raise Skip(f"differs from {key} ({ctx.get(key)}): asyncrl uses {what}")
        return value

    return check


def _shaping(which: int, what: str) -> Any:
    def check(value: Any, ctx: Context) -> Any:
        if value == (1.0 if which == 0 else 0.0) or alg.shaping(ctx)[which]:
            return value
        raise Skip(
            f"{what}: it changes the advantages here (no std normalisation removes it): do it in the"
            " reward function"
        )

    return check


_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}
_LAUNCHER = "AReaL's launcher and scheduler (local, Ray, Slurm): the operator schedules pods"
_SAME_HERE = "always so in asyncrl"
_ADV = part(alg.advantage)
_LOSS = part(alg.loss)
_CORRECTION = part(alg.correction)
_OVERLONG = part(alg.overlong)
_LORA = part(alg.lora, unset="LoRA off (actor.use_lora false): full fine-tuning")
_LORA_SERVED = part(
    alg.lora,
    note="the rollout serves trainer.lora's adapter (max_lora_rank from its rank, named by asyncrl)",
    unset="LoRA off (actor.use_lora false): full fine-tuning",
)

TABLE: Table = {
    "experiment_name": Implied("metadata.name (unless --name)"),
    "trial_name": Gone("no trials: one AsyncRLJob per name"),
    "seed": Gone("no seed field in the job (each rollout replica seeds its own engine)"),
    "total_train_epochs": To(
        "maxSteps", _max_steps, "epochs x (records // batch size), or total_train_steps"
    ),
    "total_train_steps": To("maxSteps", _max_steps, "AReaL stops at whichever limit comes first"),
    "total_train_n_seqs": Gone("a sample budget: asyncrl counts steps (maxSteps)"),
    "tokenizer_path": To(
        "", _same_as("actor.path", "the model's own tokenizer (model.path)"), "the model's own"
    ),
    "enable_offload": To("", only(False, "offloading: not exposed")),
    "dynamic_bs": part(alg.dynamic_sampling),
    "allocation_mode": To(
        "rollout.*, trainer.*", allocation.combined, "d = replicas or data parallel, t/p/c/e parallel"
    ),
    "cluster.n_gpus_per_node": Implied("trainer pods get at most this many GPUs"),
    "cluster.n_nodes": Implied("the allocation says how many GPUs each role gets"),
    "cluster.*": Gone(_LAUNCHER),
    "scheduler.*": Gone(_LAUNCHER),
    "launcher.*": Gone(_LAUNCHER),
    "rollout.backend": To(
        "rollout.replicas, rollout.gpusPerReplica", allocation.generation, "d servers of t*p GPUs"
    ),
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
    "rollout.use_lora": _LORA_SERVED,
    "rollout.agent.mode": To(
        "agent.loop", lambda v, c: "gateway", "the agent drives the policy over the OpenAI-compatible gateway"
    ),
    "rollout.agent.export_style": To(
        "agent.gateway.export",
        choice({"concat": "concat", "individual": "individual"}, "unknown export style {value}"),
    ),
    "rollout.agent.turn_discount": To("agent.gateway.turnDiscount"),
    "rollout.agent.admin_api_key": To("agent.gateway.adminKeySecret"),
    "rollout.agent.tool_call_parser": To("agent.toolParser", _parser),
    "rollout.agent.max_turns": To("agent.maxAssistantTurns", positive),
    "rollout.agent.*": Gone("agent-service knob with no asyncrl field"),
    "rollout.*": Gone("rollout controller knob with no asyncrl field (paths, tracing, scheduling)"),
    "gconfig.n_samples": (To("rollout.sampling.samplesPerPrompt", positive), part(alg.advantage, "name")),
    "gconfig.max_new_tokens": To("rollout.sampling.maxTokens", positive),
    "gconfig.max_tokens": To("rollout.engine.maxModelLen", positive),
    "gconfig.temperature": To("rollout.sampling.temperature"),
    "gconfig.top_p": To("rollout.sampling.topP"),
    "gconfig.greedy": To("", only(False, "greedy training samples: set rollout.sampling.temperature 0")),
    "gconfig.min_new_tokens": To("", only(0, "no minimum response length in asyncrl")),
    "gconfig.lora_name": _LORA_SERVED,
    "gconfig.*": Gone("sampling knob with no asyncrl field"),
    "eval_gconfig.n_samples": To(
        "data.validationSampling.samplesPerPrompt", _eval_sampling, "k of mean@k, pass@k"
    ),
    "eval_gconfig.temperature": To("data.validationSampling.temperature", _eval_sampling),
    "eval_gconfig.top_p": To("data.validationSampling.topP", _eval_sampling),
    "eval_gconfig.*": Gone("validation sampling knob with no asyncrl field"),
    "actor.path": To("model.path", model_path),
    "actor.dtype": To(
        "model.dtype", choice(_DTYPES, "dtype {value}: asyncrl takes bfloat16, float16, float32")
    ),
    "actor.backend": To("trainer.*", allocation.training, "d data parallel, t/p/c/e model parallel"),
    "actor.mb_spec.max_tokens_per_mb": To("trainer.batch.microBatchTokens", positive),
    "actor.optimizer.type": To("", only("adam", "asyncrl's optimizer is AdamW")),
    "actor.optimizer.lr": To("trainer.optimizer.lr"),
    "actor.optimizer.weight_decay": To("trainer.optimizer.weightDecay"),
    "actor.optimizer.gradient_clipping": To("trainer.optimizer.gradClip"),
    "actor.optimizer.lr_scheduler_type": To(
        "", only("constant", "asyncrl's schedule is linear warmup, then constant")
    ),
    "actor.optimizer.*": Gone("AdamW betas/eps and warmup proportion: asyncrl takes warmupSteps"),
    "actor.eps_clip": _LOSS,
    "actor.eps_clip_higher": _LOSS,
    "actor.c_clip": _LOSS,
    "actor.importance_sampling_level": _LOSS,
    "actor.use_sapo_loss": _LOSS,
    "actor.sapo_tau_pos": _LOSS,
    "actor.sapo_tau_neg": _LOSS,
    "actor.m2_threshold": _LOSS,
    "actor.reward_norm.*": _ADV,
    "actor.reward_norm": _ADV,
    "actor.adv_norm.*": _ADV,
    "actor.adv_norm": _ADV,
    "actor.discount": _ADV,
    "actor.gae_lambda": _ADV,
    "actor.kl_ctl": _ADV,
    "actor.kl_estimator": _ADV,
    "actor.reward_scaling": To("", _shaping(0, "reward_scaling"), "a std normalisation removes the scale"),
    "actor.reward_bias": To("", _shaping(1, "reward_bias"), "a mean removal removes the shift"),
    "actor.reward_clip": Gone("clipping the scaled score: clip in the reward function"),
    "actor.mask_no_eos_with_zero": To(
        "", only(False, "a score of 0 for responses without EOS: do it in the reward function")
    ),
    "actor.ppo_n_minibatches": To("trainer.batch.miniBatches", positive),
    "actor.use_decoupled_loss": _CORRECTION,
    "actor.recompute_logprob": _CORRECTION,
    "actor.prox_logp_method": To(
        "",
        only("recompute", "AReaL approximates pi_prox; asyncrl recomputes it"),
        "asyncrl recomputes pi_prox",
    ),
    "actor.rejection_sampling.*": _CORRECTION,
    "actor.behav_imp_weight_cap": _CORRECTION,
    "actor.behave_imp_weight_cap": _CORRECTION,
    "actor.behave_imp_weight_mode": _CORRECTION,
    "actor.overlong_reward_penalty": _OVERLONG,
    "actor.overlong_tokens": _OVERLONG,
    "actor.overlong_penalty_factor": _OVERLONG,
    "actor.use_lora": _LORA,
    "actor.lora_rank": _LORA,
    "actor.lora_alpha": _LORA,
    "actor.peft_type": _LORA,
    "actor.target_modules": _LORA,
    "actor.weight_update_mode": To(
        "weightSync.backend", choice({"xccl": "nccl"}, "{value}: asyncrl syncs over NCCL")
    ),
    "actor.temperature": To(
        "", _same_as("gconfig.temperature", "the sampling temperature"), "gconfig.temperature"
    ),
    "actor.max_new_tokens": To(
        "", _same_as("gconfig.max_new_tokens", "rollout.sampling.maxTokens"), "gconfig.max_new_tokens"
    ),
    "actor.scheduling_spec": Gone(_LAUNCHER),
    "actor.*": Gone("trainer knob with no asyncrl field (checkpointing, paths, agent stats)"),
    "ref.*": Implied("the reference policy (kl > 0): a frozen copy of model.path on the trainer ranks"),
    "critic.path": _ADV,
    "critic.eps_clip": _ADV,
    "critic.optimizer.lr": _ADV,
    "critic.optimizer": _ADV,
    "critic.*": Gone(
        "the critic's own backend, batching and optimizer knobs: asyncrl's critic (name gae) is sharded,"
        " batched and clipped like the policy, with AdamW"
    ),
    "critic": _ADV,
    "teacher.*": Gone("AReaL's teacher engine: spec.teacher takes a vLLM endpoint serving the teacher"),
    "vllm.max_model_len": To("rollout.engine.maxModelLen", positive),
    "vllm.gpu_memory_utilization": To("rollout.engine.gpuMemoryUtilization"),
    "vllm.enable_lora": _LORA_SERVED,
    "vllm.max_lora_rank": _LORA_SERVED,
    "vllm.*": Implied("set by asyncrl from the model and rollout.engine"),
    "sglang.context_length": To("rollout.engine.maxModelLen", positive),
    "sglang.mem_fraction_static": To("rollout.engine.gpuMemoryUtilization"),
    "sglang.enable_lora": _LORA_SERVED,
    "sglang.max_lora_rank": _LORA_SERVED,
    "sglang.*": Gone("SGLang server argument: asyncrl runs vLLM (rollout.engine.args)"),
    "train_dataset.path": To("data.prompts", one_path, "parquet, JSONL, JSON or a datasets folder, by path"),
    "train_dataset.batch_size": To("trainer.batch.prompts", positive),
    "train_dataset.shuffle": To(
        "", only(True, "asyncrl always draws prompts in a shuffled order"), "shuffled"
    ),
    "train_dataset.type": To("", only("rl", "asyncrl trains RL jobs")),
    "train_dataset.*": Gone("data loader knob with no asyncrl field"),
    "valid_dataset.path": To("data.validation", _validation),
    "valid_dataset.*": Gone(
        "validation loader knob with no asyncrl field (eval_gconfig: data.validationSampling)"
    ),
    "saver.freq_steps": To("trainer.checkpoint.everySteps", positive),
    "saver.freq_epochs": To("trainer.checkpoint.everySteps", _every_epochs, "epochs x steps per epoch"),
    "saver.*": Gone("checkpoints by seconds: asyncrl counts steps"),
    "recover.mode": To(
        "",
        choice(
            {"auto": "auto", "resume": "resume", "fault": "fault"},
            "{value}: a restarted asyncrl job always resumes from its newest checkpoint",
        ),
        "a restarted job resumes from its newest checkpoint",
    ),
    "recover.*": Gone("recovery knob: asyncrl resumes from trainer.checkpoint"),
    "evaluator.freq_steps": To("data.validateEverySteps", positive),
    "evaluator.freq_epochs": To("data.validateEverySteps", _every_epochs, "epochs x steps per epoch"),
    "evaluator.*": Gone("evaluation by seconds: asyncrl counts steps"),
    "stats_logger.wandb.mode": To("tracking.wandb", _wandb, "trainer rank 0 logs the step log to W&B"),
    "stats_logger.wandb.project": Implied("tracking.wandb.project"),
    "stats_logger.wandb.entity": Implied("tracking.wandb.entity"),
    "stats_logger.wandb.wandb_base_url": Implied("tracking.wandb.baseURL"),
    "stats_logger.wandb.wandb_api_key": Implied(
        "tracking.wandb.apiKeySecret: the Secret to create is printed"
    ),
    "stats_logger.wandb.api_key": Implied("tracking.wandb.apiKeySecret: the Secret to create is printed"),
    "stats_logger.wandb.*": Gone("W&B run knob with no asyncrl field (the run is named after the job)"),
    "stats_logger.tensorboard.path": To("tracking.tensorboard.logDir", _tensorboard),
    "stats_logger.swanlab.mode": To(
        "", only("disabled", "SwanLab: asyncrl's trackers are W&B, TensorBoard, MLflow")
    ),
    "stats_logger.trackio.mode": To(
        "", only("disabled", "Trackio: asyncrl's trackers are W&B, TensorBoard, MLflow")
    ),
    "stats_logger.*": Gone("logger settings: asyncrl's step log and Prometheus metrics need none"),
    "perf_tracer.*": Gone("performance tracing: use py-spy on a pod"),
    "memory_profiler.*": Gone("memory profiling: use py-spy or torch's profiler on a pod"),
    "econfig.*": Gone("the agent's environment (tau2's): your agent's own settings"),
    "max_turns": Gone("the agent workflow's own setting: the agent runs its own loop"),
}
