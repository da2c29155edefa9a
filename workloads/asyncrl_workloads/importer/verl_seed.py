"""The seed documents' verl layout -> AsyncRLJob fields: the table of ``asyncrl import verl`` for a
config written as the verl fully-async blog post writes it (``shared/seeds/``: ``fully_async_ppo.yaml``
with ``trainer.class: FullyAsyncTrainer`` / ``rollouter`` / ``message_queue``, ``agent_loop_config.yaml``
with ``agent_loop`` / ``tool_parser`` / ``llm_client``, ``separation_config.yaml`` with
``resource_pool`` / ``actor_worker``), merged into one file. Read as fully async (mode async).

Keys verl's resolved config also has (``data.train_files``, ``reward.custom_reward_function``, the
algorithm keys) map as in ``importer/verl.py``: the seed layout names no data, reward or algorithm, so a
user adds them on the command line (``data.train_files=... --reward ...``). The algorithm stays asyncrl's
default unless a verl algorithm key says otherwise, and the importer says so (verl's own defaults would
be a critic, which asyncrl does not build)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from asyncrl_workloads.importer import verl
from asyncrl_workloads.importer.rules import (
    Context,
    Derived,
    Gone,
    Many,
    Skip,
    Table,
    To,
    ceil_div,
    choice,
    model_path,
    only,
    positive,
)

DIALECT = "verl (the seed documents' layout)"
NAME_KEY = "trainer.experiment_name"
ASPECTS = ()
_TOP = ("rollouter", "message_queue", "agent_loop", "resource_pool", "actor_worker")
_SEED_TRAINER = ("trainer.class", "trainer.require_batches", "trainer.trigger_parameter_sync_step")
_GPUS_PER_NODE = 8
STOP_TOKEN_IDS = {
    128009: "<|eot_id|>",
    128001: "<|end_of_text|>",
    151645: "<|im_end|>",
    151643: "<|endoftext|>",
}
"""End-of-turn token ids of the model families the seeds use (Llama 3, Qwen2.5), by their text: asyncrl
takes stop tokens as text and checks each is one token of the model's vocabulary at rollout start."""


def matches(cfg: Mapping[str, Any]) -> bool:
    return any(k.split(".", 1)[0] in _TOP or k in _SEED_TRAINER for k in cfg)


def base(ctx: Context) -> Derived:
    fields: dict[str, Any] = {"mode": "async"}
    notes = ["mode async (the seed's FullyAsyncTrainer / FullyAsyncRollouter: verl's fully_async_policy)"]
    if ctx.tools and ctx.get("agent_loop.name", "tool_agent") == "tool_agent":
        fields["agent"] = {"loop": "tool", "tools": list(ctx.tools)}
        notes.append(f"agent loop tool with tools {', '.join(ctx.tools)} (--tool)")
    if not any(k.startswith(("algorithm.", verl.ACTOR)) for k in ctx.cfg):
        notes.append(
            "the config names no algorithm: asyncrl's defaults (name grpo, 8 samples per prompt, PPO-clip"
            " 0.2/0.28, correction decoupled). verl's would be adv_estimator gae with a critic (not built),"
            " rollout.n 1, clip_ratio 0.2 with dual-clip 3.0 and PPO against the rollout's log-probs: set"
            " algorithm.adv_estimator=... and actor_rollout_ref.actor.* keys to import them"
        )
    return Derived(fields, notes)


def _one_batch(value: Any, ctx: Context) -> int:
    positive(value, ctx)
    return 1


def _queue(value: Any, ctx: Context) -> int:
    n = ctx.get(verl.ROLLOUT + "n", 8)
    return positive(value, ctx) * int(n)


def _trainer_pool(value: Any, ctx: Context) -> Many:
    gpus = positive(value, ctx)
    per_pod = min(gpus, _GPUS_PER_NODE)
    return Many({"trainer.replicas": ceil_div(gpus, per_pod), "trainer.gpusPerReplica": per_pod})


def _rollout_pool(value: Any, ctx: Context) -> int:
    tp = int(ctx.number(verl.ROLLOUT + "tensor_model_parallel_size", 1))
    return ceil_div(positive(value, ctx), tp)


def _stop_tokens(value: Any, ctx: Context) -> list[str]:
    ids = value if isinstance(value, list) else [value]
    unknown = [i for i in ids if i not in STOP_TOKEN_IDS]
    if unknown:
        raise Skip(f"token ids {unknown}: asyncrl takes stop tokens as text (agent.stopTokens)")
    return [STOP_TOKEN_IDS[i] for i in ids]


def _loop(value: Any, ctx: Context) -> str:
    if value != "tool_agent":
        raise Skip(
            f"{value!r}: asyncrl's agent loop is verl's tool_agent (a registered loop does not carry over)"
        )
    return "tool"


_AGENT = verl.agent_knob
_EXTERNAL = (
    "an external API endpoint: the policy is served by the job's own rollout replicas, which the trainer"
    " updates (an API's model cannot be trained); a judge or teacher endpoint goes in reward.endpoint or"
    " teacher.endpoint"
)

SEED: Table = {
    "trainer.class": To(
        "mode", choice({"FullyAsyncTrainer": "async"}, "{value}: asyncrl's trainer is fully async")
    ),
    "trainer.ppo_mini_batch_size": (
        To("trainer.batch.prompts", positive, "one ppo_mini_batch per asyncrl batch"),
        To("trainer.batch.miniBatches", _one_batch, "one optimizer update per mini-batch"),
    ),
    "trainer.require_batches": To("async.requireBatches", positive, "mini-batches gathered per step"),
    "trainer.trigger_parameter_sync_step": To("async.syncEverySteps", positive),
    "trainer.use_trainer_do_validate": Gone("validation runs on rollout replica 0, not on trainer GPUs"),
    "rollouter.class": To(
        "",
        only("FullyAsyncRollouter", "asyncrl's rollout is its own (vLLM replicas)"),
        "the rollout replicas generate without waiting for the trainer",
    ),
    "rollouter.max_queue_size": To(
        "async.queue.maxSize", _queue, "verl counts prompts, asyncrl trajectories: times samples per prompt"
    ),
    "rollouter.partial_rollout": To("rollout.partialRollout"),
    "rollouter.*": Gone("rollouter knob with no asyncrl field"),
    "message_queue.class": To(
        "", only("MessageQueue", "asyncrl's queue is its own"), "the trajectory bus (NATS JetStream)"
    ),
    "message_queue.max_queue_size": To("async.queue.maxSize", _queue, "times samples per prompt"),
    "message_queue.*": Gone("message queue knob with no asyncrl field"),
    "agent_loop.name": To("agent.loop", _AGENT(_loop), "the tool loop inside each rollout replica"),
    "agent_loop.max_user_turns": To("agent.maxUserTurns", _AGENT()),
    "agent_loop.max_assistant_turns": To("agent.maxAssistantTurns", _AGENT()),
    "agent_loop.max_parallel_calls": To("agent.maxParallelCalls", _AGENT()),
    "agent_loop.tool_selection": To(
        "",
        _AGENT(only("per_sample", "asyncrl selects tools per sample (a record's tools field)")),
        "a record's tools field selects a subset per sample",
    ),
    "agent_loop.tool_parser.name": To("agent.toolParser", _AGENT(verl.parser)),
    "agent_loop.tool_parser.stop_token_ids": To(
        "agent.stopTokens",
        _AGENT(_stop_tokens),
        "by their text; each checked against the vocabulary at start",
    ),
    "agent_loop.llm_client.model": To(
        "model.path", model_path, "the model the agent loop generates with is the policy the job trains"
    ),
    "agent_loop.llm_client.base_url": Gone(_EXTERNAL),
    "agent_loop.llm_client.api_key": Gone(
        "the external endpoint's key (see secrets): nothing in the job uses it"
    ),
    "agent_loop.*": Gone("agent-loop knob with no asyncrl field"),
    "resource_pool.trainer_pool.num_gpus": To(
        "trainer.replicas, trainer.gpusPerReplica", _trainer_pool, "pods of up to 8 GPUs"
    ),
    "resource_pool.rollout_pool.num_gpus": To(
        "rollout.replicas", _rollout_pool, "one vLLM per tensor_model_parallel_size GPUs"
    ),
    "resource_pool.*": Gone("resource pool knob with no asyncrl field"),
    "actor_worker.class": To(
        "",
        only("DetachActorWorker", "asyncrl's trainer is its own"),
        "the trainer pods; weights reach the rollout replicas over NCCL",
    ),
    "actor_worker.strategy": To("trainer.backend", verl.backend),
    "actor_worker.*": Gone("actor worker knob with no asyncrl field"),
}

TABLE: Table = {**verl.TABLE, **SEED}
