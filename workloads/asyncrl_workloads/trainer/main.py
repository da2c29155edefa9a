"""Assemble and run the trainer from a validated JobConfig: process group, backend, resume, bus, sender.

Called by the `asyncrl-trainer` entry point (entrypoints/trainer.py) after the config is parsed. Every
rank builds the backend and loads the latest checkpoint; rank 0 alone connects to NATS, hosts the
weight-sync rendezvous, serves /metrics and reports progress; the other ranks follow (loop.Follower).

Resume: model/optimizer from the latest checkpoint, counters and consumed ids from the ledger, and
the policy version continues at ledger version + 1 with an immediate broadcast, so paramVersion only
ever increases and rollouts drop the weights of steps the checkpoint does not contain.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import signal
from typing import Any

from asyncrl_api import algorithm as algorithm_api
from asyncrl_api import config as config_mod

from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.bus import access, jetstream, subjects
from asyncrl_workloads.endpoints import settings as endpoint_settings
from asyncrl_workloads.tracking import tracker as tracker_mod
from asyncrl_workloads.trainer import advantage, checkpoint, fsdp, inbox, loop, loss, progress, staleness
from asyncrl_workloads.trainer import backend as backend_mod
from asyncrl_workloads.trainer import batcher as batcher_mod
from asyncrl_workloads.trainer import lora as lora_mod
from asyncrl_workloads.trainer import teacher as teacher_mod
from asyncrl_workloads.trainer import validation as validation_mod
from asyncrl_workloads.trainer.algorithms import advantages, correction, policy_loss, shaping

log = logging.getLogger(__name__)
STEP_LOG_ENV = "ASYNCRL_STEP_LOG"
FAULT_ENV = "ASYNCRL_FAULT_KILL_BEFORE_ACK_STEP"
GROUP_TIMEOUT_S = 30.0


class StartupError(RuntimeError):
    """A problem the trainer reports in one line and exits non-zero for (nothing is written)."""


def train_settings(cfg: config_mod.JobConfig) -> backend_mod.TrainSettings:
    spec = cfg.spec
    algo, opt = spec.trainer.algorithm, spec.trainer.optimizer
    return backend_mod.TrainSettings(
        model_path=spec.model.path,
        advantage=advantage_settings(cfg),
        objective=objective(cfg),
        kl=algo.kl,
        kl_target=algo.kl_target,
        kl_horizon=algo.kl_horizon,
        critic=critic_settings(cfg),
        loss_scale_factor=float(algo.loss_scale_factor or spec.rollout.sampling.max_tokens),
        lr=opt.lr,
        weight_decay=opt.weight_decay,
        grad_clip=opt.grad_clip,
        warmup_steps=opt.warmup_steps,
        updates_per_step=spec.trainer.batch.mini_batches * spec.async_.require_batches,
        micro_batch_tokens=spec.trainer.batch.micro_batch_tokens,
        temperature=spec.rollout.sampling.temperature or 1.0,
        teacher_kl_coef=spec.teacher.kl_coef if spec.teacher is not None else None,
        dtype=spec.model.dtype,
        rollout_gpus=spec.rollout.gpus_per_replica,
        tp=spec.trainer.parallelism.tp,
        memory=fsdp.Memory(
            activation_checkpointing=spec.trainer.memory.activation_checkpointing,
            logprob_chunk_tokens=spec.trainer.memory.logprob_chunk_tokens,
            packing=spec.trainer.memory.packing,
            offload=spec.trainer.memory.offload,
        ),
        lora=lora_settings(cfg),
    )


def lora_settings(cfg: config_mod.JobConfig) -> lora_mod.LoraSettings | None:
    """spec.trainer.lora for the backend, the sender's payload kind and the checkpoints' meta.json."""
    spec = cfg.spec.trainer.lora
    if spec is None:
        return None
    return lora_mod.LoraSettings(spec.rank, spec.alpha, tuple(spec.target_modules), spec.dropout)


def _kl_estimator(cfg: config_mod.JobConfig) -> str:
    """spec klEstimator, or its placement's default: k3 in the loss (verl low_var_kl), k1 in the reward."""
    algo = cfg.spec.trainer.algorithm
    return algo.kl_estimator or ("k3" if algo.kl_placement == "loss" else "k1")


def advantage_settings(cfg: config_mod.JobConfig) -> advantage.AdvantageSettings:
    """spec.trainer.algorithm's estimator, batch normalisation and reward shaping."""
    algo = cfg.spec.trainer.algorithm
    norm = algo.advantage_norm
    overlong = algo.overlong
    return advantage.AdvantageSettings(
        estimator=algo.name,
        estimator_settings=advantages.EstimatorSettings(group_std=algo.group_std, gamma=algo.gamma),
        batch_norm=None
        if norm is None
        else advantages.BatchNorm(
            std=norm.std, leave_one_out=norm.leave_one_out, unbiased=norm.unbiased, eps=norm.eps
        ),
        overlong=None
        if overlong is None
        else shaping.Overlong(
            buffer_tokens=overlong.buffer_tokens,
            penalty_factor=overlong.penalty_factor,
            max_tokens=cfg.spec.rollout.sampling.max_tokens,
        ),
        kl_in_reward=algo.kl > 0.0 and algo.kl_placement == "reward",
        kl_estimator=_kl_estimator(cfg),
        lam=algo.lam,
    )


def critic_settings(cfg: config_mod.JobConfig) -> backend_mod.CriticSettings | None:
    """name gae's value model: spec critic (its defaults when unset), starting from spec.model.path."""
    algo = cfg.spec.trainer.algorithm
    if algo.name != "gae":
        return None
    critic = algo.critic or algorithm_api.CriticSpec()
    return backend_mod.CriticSettings(
        path=critic.path or cfg.spec.model.path, lr=critic.lr, value_clip=critic.value_clip
    )


def objective(cfg: config_mod.JobConfig) -> loss.Objective:
    """spec.trainer.algorithm's loss: policy loss, aggregation, correction, KL in the loss, entropy."""
    algo = cfg.spec.trainer.algorithm
    sapo = algo.sapo
    if algo.rejection is not None:
        r = algo.rejection
        rejection = correction.Rejection(r.level, r.action, r.metric, r.agg, r.upper, r.lower)
    else:  # decoupled masks above isCap (AReaL's behav_imp_weight_cap), tis truncates there
        action = "clamp" if algo.correction == "tis" else "mask"
        rejection = correction.Rejection(action=action, upper=algo.is_cap)
    return loss.Objective(
        policy_loss=algo.policy_loss,
        loss=policy_loss.LossSettings(
            clip_low=algo.clip_low,
            clip_high=algo.clip_high,
            clip_ratio_c=algo.clip_ratio_c,
            tau_pos=sapo.tau_pos if sapo is not None else 1.0,
            tau_neg=sapo.tau_neg if sapo is not None else 1.05,
        ),
        aggregation=algo.loss_aggregation,
        correction=algo.correction,
        rejection=rejection,
        is_cap=algo.is_cap,
        kl_in_loss=algo.kl if algo.kl_placement == "loss" else 0.0,
        kl_estimator=_kl_estimator(cfg),
        entropy_coef=algo.entropy_coef,
    )


def stream_settings(cfg: config_mod.JobConfig) -> jetstream.StreamSettings:
    spec = cfg.spec
    queue = spec.async_.queue
    step_samples = spec.trainer.batch.prompts * spec.async_.require_batches * spec.rollout.sampling.n
    if queue.when_full == "block" and queue.max_size < step_samples:
        # the trainer holds a step's samples unacked until the step is done; they count against maxSize
        raise StartupError(
            f"spec.async.queue.maxSize: {queue.max_size} is below one step's samples ({step_samples} = "
            "batch.prompts x requireBatches x sampling.n); with whenFull block the bus would deadlock"
        )
    return jetstream.StreamSettings(
        cfg.namespace, cfg.name, max_size=queue.max_size, when_full=queue.when_full
    )


def make_sender(cfg: config_mod.JobConfig) -> Any:
    ws = cfg.spec.weight_sync
    if ws.backend == "gloo":
        from asyncrl_workloads.weightsync import sender

        try:
            return sender.GlooWeightSender(
                port=cfg.endpoints.weight_sync_port,
                timeout_seconds=ws.timeout_seconds,
                bucket_mb=ws.bucket_mb,
                adapter=adapter.wire() if (adapter := lora_settings(cfg)) is not None else None,
            )
        except RuntimeError as exc:  # torch's TCPStore: port taken, no permission
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            port = cfg.endpoints.weight_sync_port
            why = f"endpoints.weightSyncPort: cannot host the weight-sync store on {port}: {first}"
            raise StartupError(why) from exc
    try:
        from asyncrl_workloads.weightsync import nccl
    except ImportError as exc:
        raise StartupError(
            f"spec.weightSync.backend: {ws.backend} sender is not available here ({exc})"
        ) from exc
    return nccl.NcclWeightSender(cfg)


async def _connect(cfg: config_mod.JobConfig) -> Any:
    """The job's bus with its credentials (bus/access.py words every failure in one line)."""
    try:
        return await access.connect(cfg)
    except access.Failed as exc:
        raise StartupError(str(exc)) from exc


async def _lead(
    cfg: config_mod.JobConfig,
    world: fsdp.World,
    backend: backend_mod.TrainerBackend,
    checkpointer: checkpoint.Checkpointer,
    ledger: checkpoint.Ledger,
    state: loop.State,
    resumed: bool,
    bound: metrics_mod.Bound,
) -> None:
    spec = cfg.spec
    nc = await _connect(cfg)
    sender = None
    teacher = None
    tracker = tracker_mod.from_spec(
        spec, cfg.namespace, cfg.name, pathlib.Path(spec.trainer.checkpoint.path), bound
    )  # spec.tracking: MLflow/W&B/TensorBoard runs, fed by the step log and validation results
    try:
        if spec.teacher is not None:  # checked at start by entrypoints/trainer.py (teacher.preflight)
            teacher = teacher_mod.Teacher(endpoint_settings.teacher(spec), bound)
            teacher.start()
        js = nc.jetstream()
        streams = stream_settings(cfg)
        await jetstream.ensure_stream(js, streams)
        consumer = jetstream.Consumer(js, streams)
        await consumer.open()
        dynamic = spec.trainer.algorithm.dynamic_sampling  # DAPO's dynamic sampling, in the intake
        intake = inbox.Inbox(
            consumer,
            staleness.StalenessFilter(spec.max_staleness()),
            batcher_mod.GroupBatcher(
                spec.trainer.batch.prompts * spec.async_.require_batches, GROUP_TIMEOUT_S
            ),
            ledger,
            bound,
            max_zero_variance_drops=dynamic.max_drops_per_step if dynamic is not None else None,
        )
        sender = make_sender(cfg)
        log.info("trainer ready at version %d (step %d): waiting for samples", state.version, state.step)
        step_log = os.environ.get(STEP_LOG_ENV)
        settings = loop.LoopSettings(
            max_steps=spec.max_steps,
            sync_every_steps=spec.async_.sync_every_steps,
            step_log=pathlib.Path(step_log) if step_log else None,
            kill_before_ack_step=int(os.environ[FAULT_ENV]) if os.environ.get(FAULT_ENV) else None,
        )
        reporter = progress.Reporter(
            progress.sink_from_env(cfg.namespace, cfg.name), spec.progress.report_interval_seconds
        )
        validation = None
        if spec.data.validation is not None:  # rollout replica 0 runs it; results come here
            validation = validation_mod.ValidationLog(
                validation_mod.log_path(spec.trainer.checkpoint.path), tracker
            )
            await validation.subscribe(nc, subjects.validation_subject(cfg.namespace, cfg.name))
        leader = loop.Leader(
            settings,
            world,
            backend,
            checkpointer if spec.trainer.checkpoint.every_steps else None,
            intake,
            nc,
            subjects.weights_subject(cfg.namespace, cfg.name),
            sender,
            bound,
            reporter,
            teacher,
            validation,
            tracker,
        )
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        bound.param_version.set(state.version)
        await leader.run(state, stop, sync_first=resumed)
        await consumer.close()
    finally:
        if sender is not None:
            sender.close()
        if teacher is not None:
            teacher.close()
        if tracker is not None:
            await asyncio.to_thread(tracker.close)
        await nc.close()


def _prepare_paths(cfg: config_mod.JobConfig) -> None:
    """Rank 0: create the tiny model if the job asks for one, and the checkpoint directory."""
    spec = cfg.spec
    model = pathlib.Path(spec.model.path)
    if spec.model.create is not None and not (model / "config.json").is_file():
        from asyncrl_workloads import tinymodel

        try:
            tinymodel.create_from_spec(model, spec.model.create)
        except (tinymodel.TinyModelError, OSError) as exc:
            raise StartupError(f"spec.model.create: {exc}") from exc
    try:
        pathlib.Path(spec.trainer.checkpoint.path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StartupError(
            f"spec.trainer.checkpoint.path: cannot create {spec.trainer.checkpoint.path}: {exc.strerror}"
        ) from exc


def run(cfg: config_mod.JobConfig) -> None:
    spec = cfg.spec
    log.info(
        "trainer for %s/%s starting: backend %s, model %s, maxSteps %s",
        cfg.namespace, cfg.name, spec.trainer.backend, spec.model.path, spec.max_steps,
    )  # fmt: skip
    world = fsdp.init_world()
    log.info("rank %d of %d", world.rank, world.size)
    if world.is_main:
        _prepare_paths(cfg)
    fsdp.broadcast_object(None, world)  # a barrier: the model exists before any rank loads it
    bound = metrics_mod.bind(metrics_mod.Identity(cfg.namespace, cfg.name, "trainer", str(world.rank)))
    if world.local_rank == 0:  # one /metrics per pod (ranks of a pod would share the port)
        metrics_mod.serve(int(os.environ.get("ASYNCRL_METRICS_PORT", cfg.endpoints.metrics_port)))
    try:
        backend = backend_mod.BACKENDS[spec.trainer.backend](train_settings(cfg), world)
    except backend_mod.Unsupported as exc:
        raise StartupError(str(exc)) from exc
    ck = spec.trainer.checkpoint
    checkpointer = checkpoint.Checkpointer(
        pathlib.Path(ck.path),
        ck.every_steps,
        ck.keep,
        world,
        model_path=spec.model.path,
        lora=lora.meta() if (lora := lora_settings(cfg)) is not None else None,
    )
    latest = checkpointer.latest() if world.is_main else None
    latest = fsdp.broadcast_object(latest, world)  # type: ignore[assignment]
    state = loop.State()
    if latest is not None:
        directory, meta = latest
        try:
            checkpointer.load(directory, backend)
        except backend_mod.Unsupported as exc:  # e.g. a megatron offload checkpoint: one line for describe
            raise StartupError(str(exc)) from exc
        state.step = int(meta["step"])
        log.info("resumed from %s (step %d)", directory, state.step)
    settings = loop.LoopSettings(max_steps=spec.max_steps, sync_every_steps=spec.async_.sync_every_steps)
    finished = False
    try:
        if world.is_main:
            ledger = checkpoint.Ledger.load(pathlib.Path(ck.path) / checkpoint.LEDGER)
            resumed = latest is not None or ledger.step > 0
            state.version = ledger.param_version + 1 if resumed else 0
            asyncio.run(_lead(cfg, world, backend, checkpointer, ledger, state, resumed, bound))
        else:
            follower = loop.Follower(
                settings,
                world,
                backend,
                checkpointer if ck.every_steps else None,
                bound if world.local_rank == 0 else None,
            )
            follower.run(state)
        finished = True
    finally:
        fsdp.shutdown(finished)
