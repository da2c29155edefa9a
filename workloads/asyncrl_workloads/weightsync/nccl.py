"""Weight sync on GPUs: vLLM 0.32's own NCCL weight-transfer engine behind our membership protocol.

NOT RUNNABLE ON THE CPU MACHINES this project is developed on (no CUDA, no NCCL): written against
vLLM 0.32's real API (``vllm.distributed.weight_transfer.nccl_engine``: ``NCCLTrainerInitInfo``,
``NCCLTrainerWeightTransferEngine.trainer_init`` / ``send_weights``, ``NCCLWeightTransferInitInfo``,
``NCCLWeightTransferUpdateInfo``) and exercised only where a GPU machine is lent: two GPUs run a
real round, ``pytest -m gpu tests/dataplane/test_weightsync_gpu.py``. The control
flow is the gloo path's (``weightsync/base.py``); only the transport differs:

- Trainer (``NcclWeightSender``, called by the trainer like ``GlooWeightSender``): the same
  rendezvous store, plans, ready keys, rosters, acks and deadlines. Per group generation it opens
  vLLM's trainer endpoint (``trainer_init``, NCCL rank 0, a StatelessProcessGroup on
  ``weightSync.port + 1``) and each round calls ``send_weights()`` (packed buffers of
  ``bucketMB``). Its client is a no-op: each replica drives its own engine from the roster, because
  vLLM's ``trainer_init`` would send ``rank_offset=1`` to every worker and separate replicas would
  collide (``1 + replica_index * tp * pp`` is needed; the roster carries it).
- Rollout (``update_engine``, called by ``rollout/engine.py`` when the backend is nccl): on a new
  generation ``init_weight_transfer_engine`` with this replica's ``rank_offset``; then
  ``start_weight_update`` (layers to meta) -> ``update_weights`` (names/dtypes/shapes) ->
  ``finish_weight_update(version)``, inside ``pause_generation(keep)``.
- LoRA rounds (``plan.adapter`` set; spec.trainer.lora): the trainer sends the adapter's tensors
  alone through the same ``send_weights``, and each replica receives them in one ``collective_rpc`` of
  ``WorkerExtension.asyncrl_receive_adapter`` (``receive_adapter``) instead of vLLM's 3-call session:
  vLLM's NCCL engine receives as usual (``update_weights``: the packed broadcast on this generation's
  communicator) into a sink set with the engine's ``set_weight_update_target`` in place of the model,
  and worker 0 writes the peft directory (weightsync/adapter.py) that ``rollout/engine.py`` then has
  vLLM load in place (``add_lora(load_inplace=True)``), as on gloo. No layerwise reload runs, so the
  base model never leaves the GPU: a failed LoRA round keeps the old adapter, unless the receive is
  stuck in NCCL past the deadline (then, as for full weights, ``base.EngineUnusable``).
- Deadlines: NCCL collectives cannot be cancelled from Python, so every NCCL call runs in a
  thread the caller waits on until the deadline; past it the communicator is abandoned (leaked,
  never reused), the round fails like a gloo timeout and the next round forms a new generation.

Why the trainer imports vLLM rather than speaking NCCL itself with torch: the receiver is vLLM's
(packed buckets of ``packed_buffer_size_bytes``, its pynccl communicator over a StatelessProcessGroup
rendezvous, names/dtypes/shapes in the update request), and that protocol is vLLM's internal detail
(its trainer-side API changed between 0.32 and 0.33, images/rollout/Dockerfile). Running vLLM's own
trainer-side engine keeps both ends in lockstep by construction; a torch-only copy would have to track
vLLM's pynccl and packing by hand. So the trainer image is built on the rollout's vLLM image
(images/trainer/Dockerfile; tests/unit/test_images.py checks that it installs every module the
trainer can import and that the vLLM pins agree).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

import torch
from asyncrl_api import config as config_mod

from asyncrl_workloads.weightsync import adapter, base, sender

log = logging.getLogger(__name__)

ADAPTER_RPC = "asyncrl_receive_adapter"
"""The engine worker method (``WorkerExtension``) that receives a LoRA round into the adapter directory."""


def group_port(port: int) -> int:
    """NCCL's own rendezvous (vLLM's StatelessProcessGroup) listens beside ours."""
    return port + 1


def _with_deadline(fn: Callable[[], Any], deadline: float, what: str, device: int | None = None) -> Any:
    """Run ``fn`` in a thread of its own, on CUDA device ``device`` (a new thread starts on device 0
    whatever the caller set, and vLLM's trainer side opens its communicator and packing streams on
    the thread's current device)."""

    def run() -> Any:
        if device is not None:
            torch.cuda.set_device(device)
        return fn()

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="nccl-weight-sync")
    future = pool.submit(run)
    try:
        return future.result(timeout=max(0.001, deadline - time.monotonic()))
    except concurrent.futures.TimeoutError:
        raise RuntimeError(f"nccl weight sync: {what} past the deadline; communicator abandoned") from None
    finally:
        pool.shutdown(wait=False)


class _RoundSource:
    """vLLM ``WeightSource`` over this round's tensors: the plan's metadata (declared before any tensor
    is gathered, as vLLM's interface intends) and the tensors, a ``base.Stream`` gathered while vLLM packs
    and broadcasts them, or a list."""

    def __init__(self) -> None:
        self.metas: tuple[base.TensorMeta, ...] = ()
        self.tensors: Iterable[tuple[str, torch.Tensor]] = ()

    def metadata(self) -> list[Any]:
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(m.name, getattr(torch, m.dtype), m.shape) for m in self.metas]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.tensors)


class _RolloutsDriveThemselves:
    """The 4-method client vLLM's trainer engine calls; each replica drives its own engine."""

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        pass

    def start_weight_update(self) -> None:
        pass

    def update_weights(self, update_info: Any) -> None:
        pass

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        pass


class NcclWeightSender(sender.GlooWeightSender):
    """Trainer rank 0 on GPUs: our membership protocol, vLLM's NCCL transport."""

    def __init__(self, cfg: config_mod.JobConfig) -> None:
        ws = cfg.spec.weight_sync
        lora = cfg.spec.trainer.lora
        super().__init__(
            port=cfg.endpoints.weight_sync_port, timeout_seconds=ws.timeout_seconds, bucket_mb=ws.bucket_mb,
            adapter=None if lora is None else base.Adapter(lora.rank, lora.alpha, tuple(lora.target_modules)),
        )  # fmt: skip
        self.host = cfg.endpoints.trainer_host
        self.port = cfg.endpoints.weight_sync_port
        self._source = _RoundSource()
        self.device = torch.cuda.current_device() if torch.cuda.is_available() else None
        """The trainer's device when it made the sender (``fsdp`` set it): every NCCL call runs there,
        from whichever thread ``sync`` is called."""

    def _open_group(self, roster: base.Roster, deadline: float) -> Any:
        from vllm.distributed.weight_transfer import base as vllm_wt
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        info = NCCLTrainerInitInfo(
            master_address=self.host, master_port=group_port(self.port), world_size=roster.world_size, rank=0,
            packed=True, packed_buffer_size_bytes=self.bucket_bytes,
        )  # fmt: skip
        source: vllm_wt.WeightSource = self._source  # type: ignore[assignment]
        client = _RolloutsDriveThemselves()
        return _with_deadline(
            lambda: NCCLTrainerWeightTransferEngine.trainer_init(info, client=client, source=source),
            deadline, f"forming group generation {roster.generation}", self.device,
        )  # fmt: skip

    def _transfer(
        self,
        plan: base.Plan,
        tensors: Iterable[tuple[str, torch.Tensor]],
        deadline: float,
        report: base.SyncReport,
    ) -> None:
        self._source.metas, self._source.tensors = plan.tensors, tensors
        engine = self._group
        try:
            _with_deadline(engine.send_weights, deadline, f"broadcast of v{plan.version}", self.device)
        finally:  # past the deadline the abandoned thread may still hold the stream: the trainer drains it
            self._source.metas, self._source.tensors = (), ()
        report.nbytes += sum(m.nbytes for m in plan.tensors)

    def _close_group(self) -> None:
        engine, self._group = self._group, None
        self._group_members = ()
        if engine is not None:
            with contextlib.suppress(RuntimeError):  # a stuck communicator is abandoned
                _with_deadline(engine.shutdown, time.monotonic() + 5.0, "shutdown", self.device)


@dataclasses.dataclass
class EngineState:
    """What the rollout side remembers between rounds."""

    generation: int = -1


def _update_info(plan: base.Plan) -> dict[str, Any]:
    """vLLM's ``NCCLWeightTransferUpdateInfo`` of ``plan``: what each packed broadcast holds, in order."""
    return {
        "names": [t.name for t in plan.tensors],
        "dtype_names": [t.dtype for t in plan.tensors],
        "shapes": [list(t.shape) for t in plan.tensors],
    }


async def join_group(
    llm: Any, plan: base.Plan, roster: base.Roster, host: str, port: int, replica: int, incarnation: str,
    state: EngineState,
) -> None:  # fmt: skip
    """Open this replica's side of the roster's NCCL group unless the engine is already in that generation
    (``init_weight_transfer_engine`` with the member's rank offset; the old group is shut down first)."""
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, worker_init_payload

    member = roster.member(replica, incarnation)
    if member is None:
        raise RuntimeError(f"replica {replica} is not in the roster of round {roster.seq}")
    if state.generation == roster.generation:
        return
    timeout = plan.timeout_seconds
    if state.generation >= 0:
        await asyncio.wait_for(llm.shutdown_weight_transfer_engine(), timeout)
    state.generation = -1
    init = NCCLWeightTransferInitInfo(
        master_address=host, master_port=group_port(port), rank_offset=member.rank_offset,
        world_size=roster.world_size, packed=True, packed_buffer_size_bytes=plan.bucket_bytes,
    )  # fmt: skip
    request = WeightTransferInitRequest(init_info=worker_init_payload(init))
    await asyncio.wait_for(llm.init_weight_transfer_engine(request), timeout)
    state.generation = roster.generation


async def update_engine(
    llm: Any, plan: base.Plan, roster: base.Roster, host: str, port: int, replica: int, incarnation: str,
    state: EngineState,
) -> None:  # fmt: skip
    """Rollout side of one full-weights round on vLLM's NCCL engine (generation must be paused)."""
    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

    await join_group(llm, plan, roster, host, port, replica, incarnation, state)
    await llm.start_weight_update()
    try:
        await asyncio.wait_for(
            llm.update_weights(WeightTransferUpdateRequest(update_info=_update_info(plan))),
            plan.timeout_seconds,
        )
    except BaseException as exc:
        state.generation = -1
        raise base.EngineUnusable(f"nccl weight update v{plan.version} failed mid-transfer: {exc}") from exc
    await llm.finish_weight_update(weight_version=str(plan.version))


def receive_adapter(llm: Any, plan: base.Plan, replica: int, incarnation: str) -> Awaitable[Any]:
    """The engine call that receives a LoRA round (``plan.adapter``) on the group ``join_group`` opened
    and writes replica ``replica``'s adapter directory; not awaited here, so the caller can queue vLLM's
    adapter load and the version stamp right behind it (``RolloutEngine._stamped``)."""
    if plan.adapter is None:
        raise ValueError(f"round {plan.seq} carries full weights, not an adapter")
    result: Awaitable[Any] = llm.collective_rpc(
        ADAPTER_RPC, args=(base.encode(plan).decode(), replica, incarnation)
    )
    return result


class _AdapterSink(torch.nn.Module):
    """Stands in for the model as the target of vLLM's NCCL receive: keeps what it is given, on the host.

    vLLM's packed receive hands ``load_weights`` views of its packed receive buffer (on a side stream);
    the copy to the host is ordered after the broadcast on that stream and outlives the buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.tensors: list[tuple[str, torch.Tensor]] = []

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        names = set()
        for name, tensor in weights:
            self.tensors.append((name, tensor.to("cpu", copy=True)))
            names.add(name)
        return names


class WorkerExtension:
    """The NCCL path's methods in vLLM's engine workers. vLLM takes one ``worker_extension_cls``, which is
    ``weightsync/gloo.py``'s ``WorkerExtension`` (importing it registers the gloo engine); it inherits
    these. Names carry the ``asyncrl_`` prefix (vLLM asserts they do not clash with Worker's own)."""

    def asyncrl_receive_adapter(self, plan: str, replica: int, incarnation: str) -> None:
        """Receive a LoRA round through vLLM's NCCL engine into host buffers, not into the model, and
        (worker 0 of the replica) write them as the adapter directory ``rollout/engine.py`` loads."""
        decoded = base.decode(plan.encode(), base.Plan)
        if decoded.adapter is None:
            raise ValueError(f"round {decoded.seq} carries full weights, not an adapter")
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        engine = getattr(self, "weight_transfer_engine", None)
        if not isinstance(engine, NCCLWeightTransferEngine):
            raise RuntimeError("asyncrl LoRA over NCCL needs weight_transfer_config backend 'nccl'")
        if engine.model_update_group is None:
            raise RuntimeError("nccl weight transfer: init_weight_transfer_engine was not called")
        t0 = time.monotonic()
        sink = _AdapterSink()
        engine.set_weight_update_target(sink, engine.model_config)
        try:
            engine.update_weights(_update_info(decoded))  # vLLM's receive: packed broadcast -> sink
        finally:
            engine.reset_weight_update_target()
        pc = engine.parallel_config
        if pc.data_parallel_index * pc.world_size + pc.rank == 0:  # one writer per replica
            out = adapter.directory(replica, incarnation)
            adapter.write(out, decoded.adapter, sink.tensors, str(engine.model_config.model))
        log.info("nccl weight transfer v%d: %d adapter tensors received and written in %.1f ms",
                 decoded.version, len(sink.tensors), 1e3 * (time.monotonic() - t0))  # fmt: skip
