"""The weight-sync protocol: wire types shared by both sides and the two interfaces.

Trainer rank 0 holds a ``WeightSender``; every rollout replica holds a ``WeightReceiver``
inside its vLLM engine workers (driven through the rollout's ``rollout/engine.py``). Implementations:
``weightsync/sender.py`` (trainer side, gloo group from a TCPStore rendezvous), ``weightsync/gloo.py``
(rollout side, a vLLM weight-transfer engine registered as "gloo") and ``weightsync/nccl.py`` (the
GPU path on vLLM's NCCL engine).

One round (one policy version), all keys under ``asyncrl/v<PROTOCOL>/`` of the trainer's TCPStore
(``weightsync/store.py`` names them):

1. A replica announces itself once per process (``Hello``: replica index + a fresh incarnation id,
   so a restarted pod is a new member), and again whenever a plan leaves it out.
2. The trainer publishes a ``Plan``: the version, the candidates (every replica that said hello and
   was not dropped), the tensor list and the buckets.
3. Each candidate pauses generation and writes ``ready``. The trainer waits for ready keys until
   the deadline; whoever is not ready is dropped. The ready members become the ``Roster``; if they
   differ from the previous round's, or that round failed, the roster gets a new group generation
   and a new gloo group is formed (rank 0 = trainer, ranks ``rank_offset .. rank_offset+ranks-1``
   per replica), else the group is reused.
4. Bucketed broadcast: each bucket is the raw bytes of consecutive tensors, flattened.
5. Each member applies the weights, then writes ``ack`` (with a checksum). A member that does not
   ack before the deadline is dropped and reported, and the next round forms a new generation.
6. A replica process that stops (a scale-down, a stop) says ``bye`` (its Hello again, under its own
   sequence): the trainer unregisters it, ignores its later hellos, and a round waiting for its ready
   key stops waiting; the next round forms a new generation without it.

Every wait in a round has the same deadline (``timeoutSeconds``), so a dead or frozen rollout costs
the trainer at most that long; it never hangs.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import threading
from collections.abc import Collection, Iterable, Iterator
from typing import Any

import torch

PROTOCOL = 1
"""Wire version of every message below; a reader rejects any other."""


class ProtocolError(ValueError):
    """A weight-sync message of another protocol version or with missing fields."""


class EngineUnusable(RuntimeError):
    """A failed round left the inference engine without valid weights (vLLM's NCCL engine moves
    layers to the meta device at start); the rollout must exit so its pod restarts."""


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    """One named tensor as the trainer sends it (HF checkpoint names)."""

    name: str
    dtype: str
    """torch dtype name without the prefix, e.g. "float32"."""
    shape: tuple[int, ...]

    @classmethod
    def of(cls, name: str, dtype: torch.dtype, shape: Iterable[int]) -> TensorMeta:
        """The meta of a tensor named ``name`` of this torch dtype and shape."""
        return cls(name, str(dtype).removeprefix("torch."), tuple(shape))

    @property
    def nbytes(self) -> int:
        numel = 1
        for dim in self.shape:
            numel *= dim
        return numel * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


@dataclasses.dataclass(frozen=True)
class Adapter:
    """The payload kind of a LoRA job's rounds (spec.trainer.lora): the tensors are the adapter's
    alone, under peft's saved names (``base_model.model.<module>.lora_A.weight``), and the engine
    serves them as a LoRA adapter over its base model (weightsync/adapter.py) instead of loading them
    into the model."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Hello:
    """A rollout replica asks to join the weight-sync group at the next version."""

    replica: int
    incarnation: str
    """Random per process: a restarted pod with the same ordinal is a new member."""
    ranks: int = 1
    """Engine workers of the replica (tp * pp); each is one rank of the group."""


@dataclasses.dataclass(frozen=True)
class Member:
    replica: int
    incarnation: str
    ranks: int
    rank_offset: int = 0
    """Group rank of the replica's first engine worker (1 + sum of ranks before it)."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """Trainer -> candidates: version ``version`` is about to be broadcast."""

    seq: int
    """Round number, strictly increasing within one trainer process."""
    version: int
    candidates: tuple[Member, ...]
    tensors: tuple[TensorMeta, ...]
    buckets: tuple[tuple[int, int], ...]
    """[start, end) index ranges into ``tensors``; bucket i is broadcast as one flat byte buffer."""
    timeout_seconds: float
    trainer: str
    """Incarnation of the trainer process; a new one means the store and generations were reset."""
    bucket_bytes: int = 0
    """The sender's bucket bound (bucketMB); the NCCL path's packed buffers must agree with it."""
    registered: int = 0
    """Replicas registered with the trainer, in this round or not (a catch-up round names only the late
    ones); rollouts size their share of each version's groups by it. 0: count the candidates."""
    adapter: Adapter | None = None
    """The payload kind: None, the full weights (loaded into the model); an Adapter, a LoRA adapter."""

    def includes(self, replica: int, incarnation: str) -> bool:
        return any(m.replica == replica and m.incarnation == incarnation for m in self.candidates)


@dataclasses.dataclass(frozen=True)
class Roster:
    """Trainer -> ready members: who is in this round's group and at which ranks."""

    seq: int
    generation: int
    world_size: int
    members: tuple[Member, ...]

    def member(self, replica: int, incarnation: str) -> Member | None:
        for m in self.members:
            if m.replica == replica and m.incarnation == incarnation:
                return m
        return None


@dataclasses.dataclass(frozen=True)
class Ack:
    """Member -> trainer: the weights of round ``seq`` are loaded."""

    replica: int
    incarnation: str
    checksum: str
    apply_seconds: float


@dataclasses.dataclass
class SyncReport:
    """What one round did; the trainer logs it and exports the transfer time."""

    version: int
    generation: int = -1
    members: list[int] = dataclasses.field(default_factory=list)
    """Replicas that acked this version."""
    dropped: dict[int, str] = dataclasses.field(default_factory=dict)
    """Replica -> why it was dropped from the group (not ready, not acked, group failed)."""
    nbytes: int = 0
    transfer_seconds: float = 0.0
    """Broadcast of all buckets (excluding waiting for ready and acks)."""
    total_seconds: float = 0.0
    checksums: dict[int, str] = dataclasses.field(default_factory=dict)


def encode(message: Hello | Plan | Roster | Ack) -> bytes:
    body = {"protocol": PROTOCOL, "kind": type(message).__name__, **dataclasses.asdict(message)}
    return json.dumps(body, separators=(",", ":")).encode()


_KINDS: dict[str, type[Any]] = {"Hello": Hello, "Plan": Plan, "Roster": Roster, "Ack": Ack}


def decode(data: bytes, kind: type[Any]) -> Any:
    """Parse one message of the given kind; ProtocolError on anything else."""
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise ProtocolError(f"weight-sync message is not JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("protocol") != PROTOCOL:
        raise ProtocolError(
            f"protocol: expected {PROTOCOL}, got {body.get('protocol') if isinstance(body, dict) else body!r}"
        )
    if body.get("kind") != kind.__name__:
        raise ProtocolError(f"kind: expected {kind.__name__}, got {body.get('kind')!r}")
    del body["protocol"], body["kind"]
    try:
        if kind is Plan:
            body["candidates"] = tuple(Member(**m) for m in body["candidates"])
            body["tensors"] = tuple(
                TensorMeta(t["name"], t["dtype"], tuple(t["shape"])) for t in body["tensors"]
            )
            body["buckets"] = tuple((int(a), int(b)) for a, b in body["buckets"])
            if body.get("adapter") is not None:
                adapter = body["adapter"]
                body["adapter"] = Adapter(
                    int(adapter["rank"]), float(adapter["alpha"]), tuple(adapter["target_modules"])
                )
        elif kind is Roster:
            body["members"] = tuple(Member(**m) for m in body["members"])
        return kind(**body)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"{kind.__name__}: malformed ({exc})") from None


def plan_buckets(tensors: Iterable[TensorMeta], bucket_bytes: int) -> tuple[tuple[int, int], ...]:
    """Group consecutive tensors into buckets of at most ``bucket_bytes`` (a bigger tensor is alone)."""
    buckets: list[tuple[int, int]] = []
    start, size = 0, 0
    metas = list(tensors)
    for i, meta in enumerate(metas):
        if i > start and size + meta.nbytes > bucket_bytes:
            buckets.append((start, i))
            start, size = i, 0
        size += meta.nbytes
    if start < len(metas):
        buckets.append((start, len(metas)))
    return tuple(buckets)


class Stream:
    """A round's tensors, produced while they are sent: the plan (``metas``) is known before any tensor
    exists, and each (name, tensor) is made when the transport asks for it, so the sender holds about one
    bucket of full tensors, not the model (7B in bfloat16 is 15 GB on trainer rank 0 otherwise).

    ``tensors``: the producer; on the trainer a collective gather (``TrainerBackend.full_tensors``) that
    every rank must run to the end, so whoever made the stream calls ``drain`` after the round, whatever
    the round did (no members, a broadcast that failed part-way, a transport thread abandoned at its
    deadline): the rest is produced and dropped, and a thread that comes back later finds the stream
    ended. Thread-safe: the NCCL transport iterates in a thread of its own.

    ``keep``: also keep a CPU copy of each tensor (``kept``), for the trainer's checksum of small models.
    """

    def __init__(
        self, metas: Iterable[TensorMeta], tensors: Iterable[tuple[str, torch.Tensor]], keep: bool = False
    ) -> None:
        self.metas = tuple(metas)
        self._it = iter(tensors)
        self._lock = threading.Lock()
        self._next = 0
        self._ended = False
        self.keep = keep
        self.kept: list[tuple[str, torch.Tensor]] = []

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[str, torch.Tensor]:
        with self._lock:
            if self._ended:
                raise StopIteration
            try:
                name, tensor = next(self._it)
            except StopIteration:
                self._ended = True
                if self._next != len(self.metas):
                    raise ValueError(
                        f"weight stream ended after {self._next} of {len(self.metas)} tensors"
                    ) from None
                raise
            self._check(name, tensor)
            self._next += 1
            if self.keep:
                self.kept.append((name, tensor.detach().to("cpu", copy=True)))
            return name, tensor

    def _check(self, name: str, tensor: torch.Tensor) -> None:
        if self._next >= len(self.metas):
            raise ValueError(f"weight stream: {name} beyond the plan's {len(self.metas)} tensors")
        meta = self.metas[self._next]
        got = TensorMeta.of(name, tensor.dtype, tensor.shape)
        if got != meta:
            raise ValueError(f"weight stream: tensor {self._next} is {got}, the plan said {meta}")

    def drain(self) -> None:
        """Produce what is left (the producer's collective ends on every rank) and end the stream."""
        with self._lock:
            if self._ended:
                return
            for _ in self._it:
                pass
            self._ended = True


class WeightSender(abc.ABC):
    """Trainer rank 0: broadcasts a policy version to every live rollout engine worker."""

    @abc.abstractmethod
    def sync(
        self,
        version: int,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        only: Collection[int] | None = None,
    ) -> SyncReport:
        """Run one round; never blocks longer than about 3 x timeoutSeconds, never raises for a
        rollout's failure (those are in the report's ``dropped``). ``only``: the round is for these
        replicas alone (a catch-up of late joiners to the current version); default all members.
        ``named_tensors``: a ``Stream`` is consumed while it is sent (the caller drains it after);
        anything else is read into a list first."""

    @abc.abstractmethod
    def behind(self, version: int) -> list[int]:
        """Members that hold an older version than ``version`` and were not yet offered a
        catch-up round of it (the trainer asks while it waits for samples)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Tear down the group and the rendezvous store."""


class WeightReceiver(abc.ABC):
    """One rollout engine worker: joins the round's group and yields the received tensors."""

    @abc.abstractmethod
    def receive(self, plan: Plan, roster: Roster, worker_rank: int) -> list[tuple[str, torch.Tensor]]:
        """Receive every bucket of ``plan`` as rank ``rank_offset + worker_rank``; raise on a
        deadline or a broken group (the caller keeps the old weights)."""
