"""The trajectory: one sampled response, the unit that travels over the bus.

Built by the rollout worker (one per sample of a group), encoded by bus/codec.py, consumed by the trainer
(trainer/staleness.py, trainer/batcher.py, trainer/backend.py). Arrays line up as follows:

    prompt_ids          (P,)  prompt token ids
    response_ids        (R,)  generated (and, for agent loops, tool-output) token ids
    behaviour_logprobs  (R,)  log pi_behaviour(response_ids[t] | prefix) from the engine that sampled it
    versions            (R,)  policy version that produced response_ids[t] (several with partial rollout)
    mask                (R,)  1 = generated token (trained), 0 = tool output / not trained

A trajectory keeps its arrays packed (`packed`, in `ARRAYS` order: int32, float32 and uint8, little
endian), which is also their wire layout, so encoding is a join and decoding a slice. The attributes of
the same names are plain lists built on first access (and cached: treat them as read-only). Validation
runs on the packed bytes with a few C-level bytes operations per array, not a Python step per element.
Logprobs are float32 from construction on, as the engine computes them and as the bus carries them.

The id is stable across retries and redeliveries (see `trajectory_id`): it is the JetStream
`Nats-Msg-Id` (publisher dedup) and the key the trainer records so a sample is never trained twice.
"""

from __future__ import annotations

import array
import dataclasses
import functools
import math
import struct
import sys
from collections.abc import Sequence
from typing import Any

ARRAYS: tuple[tuple[str, str], ...] = (
    ("prompt_ids", "i"),
    ("response_ids", "i"),
    ("behaviour_logprobs", "f"),
    ("versions", "i"),
    ("mask", "B"),
)
"""(array, struct format character) in packed order: "i" int32, "f" float32, "B" uint8."""
ITEMSIZE = {"i": 4, "f": 4, "B": 1}
_SWAP = sys.byteorder != "little"

# Top (sign + high exponent) byte of a little-endian int32 / float32, for whole-array checks.
_NON_NEGATIVE = bytes(range(0x80))
_LOGPROB_SURE = bytes(range(0x38)) + bytes(range(0x80, 0xFF))
"""Top bytes of floats that are surely valid logprobs: +0 .. 3.05e-5 and finite negatives above -1.7e38."""
_LOGPROB_UNSURE = b"\x38\xff"
"""Top bytes that need the exact check: 3.05e-5 .. 1.22e-4 (1e-4 is the tolerance) and -1.7e38 .. -inf/NaN."""


class InvalidTrajectory(ValueError):
    """A trajectory whose arrays do not line up or whose fields are out of range."""


def trajectory_id(job: str, replica: int, prompt_key: str, sample_index: int, attempt: int = 0) -> str:
    """Stable id of one sample: the same generation request always maps to the same id."""
    return f"{job}:r{replica}:p{prompt_key}:s{sample_index}:a{attempt}"


def _pack(name: str, code: str, values: Sequence[Any]) -> bytes:
    if isinstance(values, array.array) and values.typecode == code and values.itemsize == ITEMSIZE[code]:
        if not _SWAP:
            return values.tobytes()
        values = values.tolist()
    try:
        return struct.pack(f"<{len(values)}{code}", *values)
    except (struct.error, OverflowError, TypeError) as exc:
        raise InvalidTrajectory(f"{name}: {exc}") from exc


def _unpack(data: bytes, code: str) -> list[Any]:
    arr = array.array(code, data)
    if _SWAP:
        arr.byteswap()
    return arr.tolist()


@dataclasses.dataclass(frozen=True, init=False)
class Trajectory:
    """Construct with sequences (lists, or `array.array`s of the packed type); `from_packed` for bytes."""

    id: str
    job: str
    replica: int
    group_id: str
    """Samples of the same prompt share a group id; GRPO normalises rewards within a group."""
    group_size: int
    """Number of samples the rollout generated for this group (sampling.n)."""
    sample_index: int
    reward: float
    created_at: float
    """Unix time at which the rollout finished the sample (queue age = now - created_at)."""
    packed: tuple[bytes, ...] = dataclasses.field(repr=False)
    """The arrays as little-endian bytes, in `ARRAYS` order."""

    def __init__(
        self,
        id: str,
        job: str,
        replica: int,
        group_id: str,
        group_size: int,
        sample_index: int,
        prompt_ids: Sequence[int],
        response_ids: Sequence[int],
        behaviour_logprobs: Sequence[float],
        versions: Sequence[int],
        mask: Sequence[int],
        reward: float,
        created_at: float,
    ) -> None:
        columns = (prompt_ids, response_ids, behaviour_logprobs, versions, mask)
        packed = tuple(_pack(name, code, v) for (name, code), v in zip(ARRAYS, columns, strict=True))
        self._set(id, job, replica, group_id, group_size, sample_index, reward, created_at, packed)

    @classmethod
    def from_packed(
        cls,
        id: str,
        job: str,
        replica: int,
        group_id: str,
        group_size: int,
        sample_index: int,
        reward: float,
        created_at: float,
        packed: tuple[bytes, ...],
    ) -> Trajectory:
        """A trajectory over already packed arrays (bus/codec.py's decoder); validated all the same."""
        traj = cls.__new__(cls)
        traj._set(id, job, replica, group_id, group_size, sample_index, reward, created_at, packed)
        return traj

    def _set(self, *values: Any) -> None:
        # Straight into the instance dict (a frozen dataclass without slots): one C call instead of an
        # object.__setattr__ per field, on every message the trainer decodes.
        self.__dict__.update(zip(_FIELDS, values, strict=True))
        validate(self)

    def __getstate__(self) -> dict[str, Any]:  # pickled (trainer ranks) without the cached lists
        return {name: self.__dict__[name] for name in _FIELDS}

    @functools.cached_property
    def prompt_ids(self) -> list[int]:
        return _unpack(self.packed[0], "i")

    @functools.cached_property
    def response_ids(self) -> list[int]:
        return _unpack(self.packed[1], "i")

    @functools.cached_property
    def behaviour_logprobs(self) -> list[float]:
        return _unpack(self.packed[2], "f")

    @functools.cached_property
    def versions(self) -> list[int]:
        return _unpack(self.packed[3], "i")

    @functools.cached_property
    def mask(self) -> list[int]:
        return _unpack(self.packed[4], "B")

    @functools.cached_property
    def oldest_version(self) -> int:
        """The oldest policy version that produced any of the response tokens."""
        return min(self.versions)

    @functools.cached_property
    def newest_version(self) -> int:
        return max(self.versions)


_FIELDS = tuple(f.name for f in dataclasses.fields(Trajectory))


def validate(traj: Trajectory) -> None:
    """Raise InvalidTrajectory naming the first field that is wrong."""
    for (name, code), data in zip(ARRAYS, traj.packed, strict=True):
        if len(data) % ITEMSIZE[code]:
            raise InvalidTrajectory(f"{name}: {len(data)} bytes are not whole {code!r} items")
    prompt, response, logprobs, versions, mask = traj.packed
    if not traj.id:
        raise InvalidTrajectory("id: must not be empty")
    if not prompt:
        raise InvalidTrajectory("prompt_ids: must not be empty")
    n = len(response) // 4
    if n == 0:
        raise InvalidTrajectory("response_ids: must not be empty")
    for (name, code), data in zip(ARRAYS[2:], (logprobs, versions, mask), strict=True):
        if len(data) != n * ITEMSIZE[code]:
            raise InvalidTrajectory(f"{name}: length {len(data) // ITEMSIZE[code]} != len(response_ids) {n}")
    # whole-array bytes operations (C loops); this runs for every message on the bus
    if versions[3::4].translate(None, _NON_NEGATIVE):
        raise InvalidTrajectory("versions: policy versions must be >= 0")
    if mask.translate(None, b"\x00\x01"):
        raise InvalidTrajectory("mask: entries must be 0 or 1")
    if b"\x01" not in mask:
        raise InvalidTrajectory("mask: no trainable token")
    unsure = logprobs[3::4].translate(None, _LOGPROB_SURE)
    if unsure and (unsure.translate(None, _LOGPROB_UNSURE) or not _logprobs_exact(logprobs, n)):
        raise InvalidTrajectory("behaviour_logprobs: must be finite log-probabilities (<= 0)")
    if not math.isfinite(traj.reward):
        raise InvalidTrajectory("reward: must be finite")
    if traj.group_size < 1 or not 0 <= traj.sample_index < traj.group_size:
        raise InvalidTrajectory(f"sample_index: {traj.sample_index} outside group of size {traj.group_size}")


def _logprobs_exact(data: bytes, n: int) -> bool:
    values = struct.unpack(f"<{n}f", data)
    return max(values) <= 1e-4 and math.isfinite(sum(values))
