"""The receiving end of a weight-sync round: join the generation's gloo group, receive buckets.

Used inside each vLLM engine worker by ``weightsync/gloo.py`` and, without vLLM, by the data-plane
tests' peer process (tests/dataplane/weightsync_peer.py). Only torch.
"""

from __future__ import annotations

import time

import torch
from torch.distributed import distributed_c10d

from asyncrl_workloads.weightsync import base, rendezvous


class NotAMember(RuntimeError):
    """The roster of this round does not include this replica (it was dropped)."""


class GlooWeightReceiver(base.WeightReceiver):
    """Joins a generation's gloo group (cached while the generation holds) and receives buckets."""

    def __init__(self, store: distributed_c10d.Store, replica: int, incarnation: str) -> None:
        self.store, self.replica, self.incarnation = store, replica, incarnation
        self.generation = -1
        self.pg: distributed_c10d.ProcessGroupGloo | None = None

    def receive(
        self, plan: base.Plan, roster: base.Roster, worker_rank: int
    ) -> list[tuple[str, torch.Tensor]]:
        member = roster.member(self.replica, self.incarnation)
        if member is None:
            raise NotAMember(f"replica {self.replica} is not in the roster of round {roster.seq}")
        deadline = time.monotonic() + plan.timeout_seconds
        try:
            if self.pg is None or self.generation != roster.generation:
                self.pg, self.generation = None, -1
                self.pg = rendezvous.form_group(
                    self.store,
                    roster.generation,
                    member.rank_offset + worker_rank,
                    roster.world_size,
                    deadline - time.monotonic(),
                )
                self.generation = roster.generation
            received: list[tuple[str, torch.Tensor]] = []
            for a, b in plan.buckets:
                metas = plan.tensors[a:b]
                buffer = torch.empty(rendezvous.bucket_nbytes(metas), dtype=torch.uint8)
                rendezvous.broadcast(self.pg, buffer, deadline - time.monotonic())
                received.extend(rendezvous.unpack(buffer, metas))
            return received
        except BaseException:
            self.pg, self.generation = None, -1  # a broken group is never reused
            raise


def connect(host: str, port: int, replica: int, incarnation: str, timeout: float) -> GlooWeightReceiver:
    """A receiver with its own connection to the trainer's rendezvous store."""
    return GlooWeightReceiver(rendezvous.connect_store(host, port, timeout), replica, incarnation)
