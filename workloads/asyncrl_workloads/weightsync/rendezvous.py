"""The weight-sync rendezvous: the trainer's TCPStore, its key names, deadline waits, the gloo
group of one generation, and how buckets are packed into flat byte buffers.

Used by both sides of the gloo path: ``weightsync/sender.py`` (trainer rank 0 hosts the store),
``weightsync/replica.py`` (a rollout's control loop) and ``weightsync/gloo.py`` (vLLM worker).
Only torch; no vLLM import, so the trainer never loads vLLM.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import struct
import threading
import time
from collections.abc import Collection, Iterable, Sequence

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
BYE_SEQ = PREFIX + "bye_seq"


def hello_key(n: int) -> str:
    return f"{PREFIX}hello/{n}"


def bye_key(n: int) -> str:
    """A replica process that is going away (stopped, scaled down): its Hello, said once more."""
    return f"{PREFIX}bye/{n}"


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


class StoreNotAnswering(ConnectionError):
    """The trainer's store accepted a connection but did not answer within the timeout."""


def connect_store(host: str, port: int, timeout: float) -> dist.TCPStore:
    """A rollout process: connect to the trainer's store; every later call on it fails after at most
    ``timeout`` seconds without an answer (``StoreNotAnswering``/c10d's "Socket Timeout").

    A plain TCP connect first: where nothing listens (the trainer has stopped, or is not up yet) it is
    refused in a millisecond and raises ``OSError``, where c10d's client retries a refused connect
    until ``timeout`` and then again after a random back-off (9-13 s for a 5 s timeout, with a C++
    stack trace logged per try). A rollout stopping while its plan watcher sat in such a connect
    waited for it: its stop took ~15 s, the local runner's whole grace. The store server drops the
    probe's connection quietly.

    Why the socket timeouts: c10d's client (torch 2.13) receives every reply with a blocking
    ``recv`` and no timeout - its ``timeout`` bounds only connecting and key waits. Against a peer
    that accepts but never answers (a SIGSTOPped trainer; its kernel still completes handshakes and
    acks bytes) the constructor's handshake and every ``check``/``add``/``get`` were measured to block
    for good (>60 s for a 1 s timeout); a partitioned node does the same until TCP gives up (minutes
    to hours). A rollout's watcher then never saw the trainer's replacement and its stop waited for
    the kubelet's SIGKILL. So the store's socket gets ``SO_RCVTIMEO``/``SO_SNDTIMEO`` = ``timeout``
    (c10d raises "Socket Timeout" on ``EAGAIN``; the link then drops the connection, whose byte
    stream may hold a late reply), and while the constructor runs a watchdog shuts down the socket
    if no answer came within ``timeout``. Linux only (``/proc/self/fd``); elsewhere calls are as
    c10d makes them."""
    socket.create_connection((host, port), timeout=timeout).close()
    before = set(_socket_inodes())
    built = threading.Event()

    def watchdog() -> None:  # c10d may retry its handshake once shut out: every ``timeout`` again
        while not built.wait(timeout):
            for sock in _sockets_to(port, exclude=before):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    guard = threading.Thread(target=watchdog, name="asyncrl-store-connect-watchdog", daemon=True)
    guard.start()
    started = time.monotonic()
    try:
        store = dist.TCPStore(
            host,
            port,
            is_master=False,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=timeout),
        )
    except RuntimeError as exc:
        if time.monotonic() - started >= timeout:
            raise StoreNotAnswering(
                f"store {host}:{port} accepted the connection but did not answer within {timeout:g} s "
                f"(a frozen or partitioned trainer?): {str(exc).splitlines()[0][:120]}"
            ) from None
        raise
    finally:
        built.set()
    for sock in _sockets_to(port, exclude=before):
        limit = struct.pack("ll", int(timeout), int((timeout % 1) * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
        sock.close()  # the duplicate only
    return store


def _socket_inodes() -> dict[int, int]:
    """inode -> file descriptor of each socket this process has open ({} without ``/proc``)."""
    found: dict[int, int] = {}
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except OSError:  # closed meanwhile (the listing's own descriptor, or another thread's)
                continue
            if target.startswith("socket:["):
                found[int(target[8:-1])] = int(name)
    return found


def _sockets_to(port: int, exclude: Collection[int] = ()) -> list[socket.socket]:
    """Duplicates of this process's TCP sockets connected to ``port`` whose inodes are not in
    ``exclude``. A duplicate shares the socket (options, shutdown); closing it leaves the original."""
    found = []
    for inode, fd in _socket_inodes().items():
        if inode in exclude:
            continue
        try:
            dup = os.dup(fd)
        except OSError:  # closed since the listing
            continue
        try:
            sock = socket.socket(fileno=dup)
        except OSError:  # the number was reused by something else since the listing
            os.close(dup)
            continue
        try:
            peer = sock.getpeername()
        except OSError:  # listening, or not connected
            peer = None
        if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(peer, tuple) and peer[1] == port:
            found.append(sock)
        else:
            sock.close()
    return found


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
