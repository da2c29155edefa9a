"""The weight-sync rendezvous: the trainer's TCPStore, its key names, deadline waits, the gloo
group of one generation, and how buckets are packed into flat byte buffers.

Used by both sides of the gloo path: ``weightsync/sender.py`` (trainer rank 0 hosts the store),
``weightsync/replica.py`` (a rollout's control loop) and ``weightsync/gloo.py`` (vLLM worker).
Only torch; no vLLM import, so the trainer never loads vLLM.
"""

from __future__ import annotations

import datetime
import socket
import time
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from asyncrl_workloads.weightsync import base

PREFIX = f"asyncrl/v{base.PROTOCOL}/"
POLL_SECONDS = 0.005


class DeadlineExceeded(TimeoutError):
    """A wait in a weight-sync round ran past its deadline."""


# ---- keys (all under PREFIX) -------------------------------------------------------------------
TRAINER = PREFIX + "trainer"
"""Incarnation of the trainer process hosting the store (a restarted trainer counts rounds anew)."""
HELLO_SEQ = PREFIX + "hello_seq"
PLAN_SEQ = PREFIX + "plan_seq"


def hello_key(n: int) -> str:
    return f"{PREFIX}hello/{n}"


def plan_key(seq: int) -> str:
    return f"{PREFIX}plan/{seq}"


def ready_key(seq: int, replica: int) -> str:
    return f"{PREFIX}ready/{seq}/{replica}"


def roster_key(seq: int) -> str:
    return f"{PREFIX}roster/{seq}"


def joined_key(generation: int, rank: int) -> str:
    return f"{PREFIX}joined/{generation}/{rank}"


def received_key(seq: int, replica: int, worker_rank: int) -> str:
    """Set by an engine worker when its background receive of round ``seq`` ended (checksum or error)."""
    return f"{PREFIX}received/{seq}/{replica}/{worker_rank}"


def ack_key(seq: int, replica: int) -> str:
    return f"{PREFIX}ack/{seq}/{replica}"


# ---- the store ---------------------------------------------------------------------------------
def host_store(port: int, timeout: float) -> dist.TCPStore:
    """Trainer rank 0: serve the rendezvous store on ``port`` (all interfaces)."""
    return dist.TCPStore(
        "0.0.0.0",
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout),
    )


def connect_store(host: str, port: int, timeout: float) -> dist.TCPStore:
    """A rollout process: connect to the trainer's store.

    A plain TCP connect first: where nothing listens (the trainer has stopped, or is not up yet) it is
    refused in a millisecond and raises ``OSError``, where c10d's client retries a refused connect
    until ``timeout`` and then again after a random back-off (9-13 s for a 5 s timeout, with a C++
    stack trace logged per try). A rollout stopping while its plan watcher sat in such a connect
    waited for it: its stop took ~15 s, the local runner's whole grace. The store server drops the
    probe's connection quietly."""
    socket.create_connection((host, port), timeout=timeout).close()
    return dist.TCPStore(
        host,
        port,
        is_master=False,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout),
    )


def read_int(store: dist.Store, key: str) -> int:
    """An integer counter or 0 when the key does not exist yet."""
    return int(store.get(key)) if store.check([key]) else 0


def peek_int(store: dist.Store, key: str) -> int:
    """An integer counter (written by ``add`` or as a decimal ``set``) or 0, in one store round trip:
    adding 0 returns the value, creating the key at 0 if it does not exist yet. For hot polls."""
    return int(store.add(key, 0))


def read_str(store: dist.Store, key: str) -> str:
    """A string value or "" when the key does not exist yet."""
    return bytes(store.get(key)).decode() if store.check([key]) else ""


def wait_keys(store: dist.Store, keys: Iterable[str], deadline: float) -> set[str]:
    """Poll until every key exists or ``deadline`` (time.monotonic) passes; return those present."""
    pending = set(keys)
    present: set[str] = set()
    while True:
        for key in list(pending):
            if store.check([key]):
                pending.discard(key)
                present.add(key)
        if not pending or time.monotonic() >= deadline:
            return present
        time.sleep(POLL_SECONDS)


def get_by(store: dist.Store, key: str, deadline: float) -> bytes:
    """Wait for one key until ``deadline``, then read it (DeadlineExceeded if it never came)."""
    if key not in wait_keys(store, [key], deadline):
        raise DeadlineExceeded(f"weight sync: {key} not written before the deadline")
    return bytes(store.get(key))


# ---- the group of one generation ---------------------------------------------------------------
def form_group(
    store: dist.Store, generation: int, rank: int, world_size: int, timeout: float
) -> distributed_c10d.ProcessGroupGloo:
    """Join generation ``generation``'s gloo group: a fresh key space, never the default group.

    Blocks until every rank has joined or ``timeout`` passes (then gloo raises). Each rank first
    marks itself joined, so the trainer can tell who never came.
    """
    store.set(joined_key(generation, rank), b"1")
    prefix = distributed_c10d.PrefixStore(f"{PREFIX}group/{generation}/", store)
    return distributed_c10d.ProcessGroupGloo(
        prefix, rank, world_size, datetime.timedelta(seconds=max(timeout, 0.001))
    )


def broadcast(pg: distributed_c10d.ProcessGroupGloo, buffer: torch.Tensor, timeout: float) -> None:
    """Broadcast ``buffer`` from rank 0 in place, failing after ``timeout`` seconds."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    opts.timeout = datetime.timedelta(seconds=max(timeout, 0.001))
    pg.broadcast([buffer], opts).wait()


# ---- buckets -----------------------------------------------------------------------------------
def pack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate the raw bytes of ``tensors`` into one flat uint8 CPU buffer."""
    views = [t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    return torch.cat(views) if len(views) > 1 else views[0].clone()


def bucket_nbytes(metas: Sequence[base.TensorMeta]) -> int:
    return sum(m.nbytes for m in metas)


def unpack(buffer: torch.Tensor, metas: Sequence[base.TensorMeta]) -> list[tuple[str, torch.Tensor]]:
    """Split a received bucket back into named tensors (views into ``buffer``)."""
    if buffer.numel() != bucket_nbytes(metas):
        raise ValueError(f"bucket holds {buffer.numel()} bytes, its tensors {bucket_nbytes(metas)}")
    out: list[tuple[str, torch.Tensor]] = []
    offset = 0
    for meta in metas:
        n = meta.nbytes
        dtype = getattr(torch, meta.dtype)
        chunk = buffer[offset : offset + n]
        if offset % torch.empty((), dtype=dtype).element_size():
            chunk = chunk.clone()  # a view must start at a multiple of its element size
        chunk = chunk.view(dtype).reshape(meta.shape)
        out.append((meta.name, chunk))
        offset += n
    return out
