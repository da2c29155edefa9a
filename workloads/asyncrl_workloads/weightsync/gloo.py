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
``update_weights`` first receives every bucket into host buffers and only then reloads them in
place (vLLM's layerwise ``reload_weights``, needed because the CPU backend repacks linear layers).
A deadline or a dead trainer mid-transfer therefore leaves the old weights intact and the engine
alive; the error reaches the caller, who keeps generating with the old version.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from vllm.distributed.weight_transfer import base as vllm_wt
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.model_executor.model_loader.reload import inplace

from asyncrl_workloads.weightsync import base, checksum
from asyncrl_workloads.weightsync import receiver as receiver_mod

log = logging.getLogger(__name__)
BACKEND = "gloo"


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
    roster: str
    """``base.Roster`` as JSON."""


class GlooWeightTransferEngine(vllm_wt.WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """vLLM worker-side engine: receive all buckets, then reload in place."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    receiver: receiver_mod.GlooWeightReceiver | None = None
    last_checksum: str = ""
    last_version: int = -1

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        self.receiver = receiver_mod.connect(
            init_info.master_address,
            init_info.master_port,
            init_info.replica,
            init_info.incarnation,
            init_info.timeout_seconds,
        )

    def start_weight_update(self) -> None:
        """Nothing: the model stays usable until every byte has arrived (see module docstring)."""

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.receiver is None:
            raise RuntimeError("gloo weight transfer: init_weight_transfer_engine was not called")
        plan = base.decode(update_info.plan.encode(), base.Plan)
        roster = base.decode(update_info.roster.encode(), base.Roster)
        pc = self.parallel_config
        worker_rank = pc.data_parallel_index * pc.world_size + pc.rank
        t0 = time.monotonic()
        tensors = self.receiver.receive(plan, roster, worker_rank)
        t1 = time.monotonic()
        inplace.reload_weights(self.vllm_config, self.model, iter(tensors), None, True)
        self.last_checksum = checksum.of(tensors)
        self.last_version = plan.version
        log.info(
            "gloo weight transfer v%d: %d tensors received in %.1f ms, reloaded in %.1f ms",
            plan.version,
            len(tensors),
            1e3 * (t1 - t0),
            1e3 * (time.monotonic() - t1),
        )

    def finish_weight_update(self) -> None:
        """Nothing: ``receive_weights`` already reloaded (and finalised) the layers."""

    def shutdown(self) -> None:
        if self.receiver is not None:
            self.receiver.pg = None
            self.receiver = None


class WorkerExtension:
    """Mixed into vLLM's worker via ``worker_extension_cls``; importing it registers the engine.

    Method names carry an ``asyncrl_`` prefix: vLLM asserts they do not clash with Worker's own.
    """

    def asyncrl_last_update(self) -> tuple[int, str]:
        """(version, checksum of the received tensors) of the last successful update."""
        engine = getattr(self, "weight_transfer_engine", None)
        if not isinstance(engine, GlooWeightTransferEngine):
            return (-1, "")
        return (engine.last_version, engine.last_checksum)


if BACKEND not in WeightTransferEngineFactory._registry:
    WeightTransferEngineFactory.register_engine(BACKEND, GlooWeightTransferEngine)
