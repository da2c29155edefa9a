"""The seed documents' AReaL layout -> AsyncRLJob fields: the table of ``asyncrl import areal`` for a
config written as the AReaL v1.0 agent blog post writes ``configs/agent_async_train.yaml``
(``shared/seeds/``: ``train.engine`` / ``parallelism`` / batch sizes, ``async.*`` workers, staleness and
queue, ``agent.*`` for the gateway, ``logging.*``).

Keys of AReaL's own layout (``actor.path``, ``train_dataset.path``, the algorithm keys) map as in
``importer/areal.py``: the seed names no model, data, reward or algorithm (its router file names an API
model, which a job cannot train), so a user adds them on the command line. The algorithm stays asyncrl's
default unless an AReaL algorithm key says otherwise, and the importer says so."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from asyncrl_workloads.importer import areal
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
    integer,
    positive,
)

DIALECT = "areal (the seed documents' layout)"
NAME_KEY = "experiment_name"
ASPECTS = ()
_TOP = ("train", "async", "agent", "logging")
_PARALLEL = "train.parallelism."
_GPUS_PER_NODE = 8


def matches(cfg: Mapping[str, Any]) -> bool:
    return any(k.split(".", 1)[0] in _TOP for k in cfg)


def base(ctx: Context) -> Derived:
    fields: dict[str, Any] = {}
    notes: list[str] = []
    if any(k.startswith("agent.") for k in ctx.cfg):
        fields["agent.loop"] = "gateway"
        fields["agent.gateway.adminKeySecret"] = ctx.secret_ref("adminKey", "<an admin key of your choice>")
        notes.append("agent loop gateway (the seed's agent gateway: the agent calls the policy over HTTP)")
    if not any(k.startswith("actor.") for k in ctx.cfg):
        notes.append(
            "the config names no algorithm: asyncrl's defaults (name grpo, 8 samples per prompt, PPO-clip"
            " 0.2/0.28, correction decoupled); set actor.* keys (reward_norm, eps_clip, use_decoupled_loss)"
            " to import AReaL's"
        )
    if "actor.path" not in ctx.cfg:
        notes.append(
            "the config names no policy model (the seed names one only in agent.gateway_config's router"
            " file, an API model a job cannot train): add actor.path=/models/<name>"
        )
    return Derived(fields, notes)


def _gpus(ctx: Context) -> int:
    return math.prod(int(ctx.number(_PARALLEL + k, 1)) for k in ("dp", "tp", "pp", "cp"))


def _model_parallel(ctx: Context) -> bool:
    return any(int(ctx.number(_PARALLEL + k, 1)) != 1 for k in ("tp", "pp", "cp", "ep"))


def _pods(ctx: Context) -> Many:
    """The trainer's GPUs (dp x tp x pp x cp) over async.train_workers pods where they divide them,
    else pods of up to 8 GPUs."""
    gpus = _gpus(ctx)
    workers = ctx.get("async.train_workers")
    if isinstance(workers, int) and workers > 0 and gpus % workers == 0:
        return Many({"trainer.replicas": workers, "trainer.gpusPerReplica": gpus // workers})
    per_pod = min(gpus, _GPUS_PER_NODE)
    return Many({"trainer.replicas": ceil_div(gpus, per_pod), "trainer.gpusPerReplica": per_pod})


def _axis(axis: str) -> Any:
    def convert(value: Any, ctx: Context) -> Many:
        return Many({f"trainer.parallelism.{axis}": positive(value, ctx), **_pods(ctx).values})

    return convert


def _train_workers(value: Any, ctx: Context) -> Many:
    workers = positive(value, ctx)
    gpus = _gpus(ctx)
    return Many({"trainer.replicas": workers, "trainer.gpusPerReplica": ceil_div(gpus, workers)})


def _engine(value: Any, ctx: Context) -> Many:
    if value not in ("archon", "fsdp", "megatron"):
        raise Skip(f"{value!r}: asyncrl trains with fsdp2 or megatron-core")
    megatron = value == "megatron" or (value == "archon" and _model_parallel(ctx))
    note = "megatron: asyncrl's backend with tensor parallelism" if megatron else "FSDP2, data parallel"
    return Many({"trainer.backend": "megatron" if megatron else "fsdp2"}, note)


def _mini_batches(value: Any, ctx: Context) -> int:
    batch = positive(ctx.get("train.global_batch_size", 0), ctx)
    return ceil_div(batch, positive(ctx.get("train.mini_batch_size", batch), ctx))


def _batch(value: Any, ctx: Context) -> Many:
    return Many(
        {
            "trainer.batch.prompts": positive(value, ctx),
            "trainer.batch.miniBatches": _mini_batches(value, ctx),
        }
    )


def _framework(value: Any, ctx: Context) -> str:
    return "gateway"


SEED: Table = {
    "train.engine": To("trainer.backend", _engine),
    _PARALLEL + "dp": To(
        "trainer.replicas, trainer.gpusPerReplica", lambda v, c: _pods(c), "dp x tp x pp x cp GPUs"
    ),
    _PARALLEL + "tp": To("trainer.parallelism.tp", _axis("tp")),
    _PARALLEL + "pp": To("trainer.parallelism.pp", _axis("pp")),
    _PARALLEL + "cp": To("trainer.parallelism.cp", _axis("cp")),
    _PARALLEL + "ep": To("trainer.parallelism.ep", lambda v, c: positive(v, c)),
    "train.global_batch_size": To("trainer.batch.prompts", _batch, "prompt groups per step"),
    "train.mini_batch_size": To(
        "trainer.batch.miniBatches", _mini_batches, "global / mini: updates per step"
    ),
    "train.learning_rate": To("trainer.optimizer.lr"),
    "train.max_steps": To("maxSteps", positive),
    "train.*": Gone("training knob with no asyncrl field"),
    "async.enabled": To("mode", choice({True: "async", False: "sync"}, "{value}: not a switch")),
    "async.rollout_workers": To("rollout.replicas", positive, "one vLLM replica per worker"),
    "async.train_workers": To(
        "trainer.replicas, trainer.gpusPerReplica", _train_workers, "read as trainer pods sharing the GPUs"
    ),
    "async.staleness_threshold": To(
        "async.maxStaleness", integer, "policy versions; older samples are dropped"
    ),
    "async.queue_max_size": To("async.queue.maxSize", positive, "trajectories"),
    "async.trigger_batch_size": To("trainer.batch.prompts", positive, "samples gathered before an update"),
    "async.*": Gone("async scheduling knob with no asyncrl field"),
    "agent.gateway_config": Gone(
        "a file the importer does not read: its policy model goes in actor.path (model.path); an API"
        " endpoint's model cannot be trained (the gateway serves the job's own policy)"
    ),
    "agent.framework": To(
        "agent.loop", _framework, "the framework's agent calls the policy over the OpenAI-compatible gateway"
    ),
    "agent.max_turns": To("agent.maxAssistantTurns", positive, "completions per session"),
    "agent.reward_source": To(
        "",
        choice(
            {"agent": "agent"},
            "{value}: a reward model goes behind an OpenAI-compatible endpoint (reward.type"
            " judge, reward.endpoint); this job scores with reward.function (--reward) or the agent's"
            " /rl/reward",
        ),
    ),
    "agent.*": Gone("agent knob with no asyncrl field"),
    "logging.save_interval": To("trainer.checkpoint.everySteps", positive),
    "logging.log_dir": Gone(
        "asyncrl writes a JSON step log to stdout and Prometheus metrics; spec.tracking.tensorboard.logDir"
        " takes an absolute directory on a volume"
    ),
    "logging.log_interval": Gone("asyncrl logs every step: no interval"),
    "logging.*": Gone("logging knob with no asyncrl field"),
}

TABLE: Table = {**areal.TABLE, **SEED}
