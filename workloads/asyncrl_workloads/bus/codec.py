"""Versioned wire codec for bus messages, defined once and imported by both sides.

The rollout publisher calls `encode_trajectory`; the trainer consumer calls `decode_trajectory`; the
trainer announces versions with `encode_announcement` and rollouts read them with `decode_announcement`;
rollout replica 0 sends validation runs with `encode_validation` and the trainer reads them with
`decode_validation`.

Every message starts with `b"ARL"` and a u8 wire version. Two versions exist:

- version 2 (trajectories, written since 2026-12): a fixed little-endian header, `FIXED_V2`: u8 kind
  (1 = trajectory), 3 pad bytes, int32 replica, group_size, sample_index, float64 reward, created_at,
  u32 byte lengths of id, job, group_id, u32 element counts of the five arrays; then id, job and
  group_id as UTF-8; then the arrays.
- version 1 (announcements, validation messages; trajectories written before): `u32 header length +
  header + arrays`, the header UTF-8 JSON `{"kind": ..., scalars..., "lengths": {array: n}}`. Still
  read for trajectories, so a trainer reads what an older rollout left in a durable stream.

The arrays follow in a fixed order as raw little-endian bytes - token ids and versions int32, mask
uint8, behaviour logprobs float32 (the engine computes them in fp32, so this round-trips exactly).
That is how a Trajectory holds its arrays in memory (trajectory.ARRAYS), so encoding joins bytes and
decoding slices them: no per-element Python work on either side, no base64, no JSON numbers. Version
2 replaced the JSON header on the hot path: it cost ~9 us to write and ~19 us to read per message
(timeit; ~3-5 and ~11 us now, validation included), a measurable part of the bus's overhead against
raw nats-py (tools/asyncrl_testing/bench_bus.py, P4). A 512-token trajectory is ~7.5 kB. A reader
rejects any other version byte with CodecError rather than guessing; both formats are pinned byte for
byte by tests/unit/test_codec.py. A trainer from before version 2 cannot read it: it acks such
messages as invalid (counted, dropped{reason="invalid"}), so a running job moved across that change
should get its new trainer before its new rollouts (or be suspended while it is moved).
"""

from __future__ import annotations

import json
import struct
from typing import Any

from asyncrl_workloads.bus import trajectory as trajectory_mod

WIRE_VERSION = 2
"""What `encode_trajectory` writes; announcements are written as version 1."""
_MAGIC = b"ARL"
_PREFIX = struct.Struct("<3sBI")  # v1: magic, wire version, header length
FIXED_V2 = struct.Struct("<3sBB3xiiiddIIIIIIII")
"""v2: magic, version, kind, (pad), replica, group_size, sample_index, reward, created_at, byte
lengths of id / job / group_id, element counts of the arrays in trajectory.ARRAYS order."""
_KIND_TRAJECTORY = 1
_INT32 = range(-(2**31), 2**31)
_SCALARS = ("id", "job", "replica", "group_id", "group_size", "sample_index", "reward", "created_at")
# The body is the trajectory's packed arrays as they are (trajectory.ARRAYS: names, order, item types).
_ARRAYS = tuple((name, trajectory_mod.ITEMSIZE[code]) for name, code in trajectory_mod.ARRAYS)
_V1_TYPES = {
    "id": (str,),
    "job": (str,),
    "group_id": (str,),
    "replica": (int,),
    "group_size": (int,),
    "sample_index": (int,),
    "reward": (int, float, bool),
    "created_at": (int, float),
}
_JSON = json.JSONEncoder(separators=(",", ":"))


class CodecError(ValueError):
    """A message that is not a valid bus message of a known wire version."""


def _frame(header: dict[str, Any], *body: bytes) -> bytes:
    """A version 1 message."""
    head = _JSON.encode(header).encode()
    return b"".join((_PREFIX.pack(_MAGIC, 1, len(head)), head, *body))


def _version(data: bytes) -> int:
    if len(data) < _PREFIX.size:
        raise CodecError("not a bus message: too short")
    if data[:3] != _MAGIC:
        raise CodecError("not a bus message: bad magic")
    return data[3]


def _unframe(data: bytes, kind: str) -> tuple[dict[str, Any], memoryview]:
    """A version 1 message: its JSON header (of `kind`) and its body."""
    _, _, head_len = _PREFIX.unpack_from(data)
    view = memoryview(data)
    try:
        header = json.loads(bytes(view[_PREFIX.size : _PREFIX.size + head_len]))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, the int digit limit
        raise CodecError(f"header: not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise CodecError("header: must be a JSON object")
    if header.get("kind") != kind:
        raise CodecError(f"kind: expected {kind!r}, got {header.get('kind')!r}")
    return header, view[_PREFIX.size + head_len :]


def encode_trajectory(traj: trajectory_mod.Trajectory) -> bytes:
    """Version 2 (see the module docstring)."""
    try:
        strings = (traj.id.encode(), traj.job.encode(), traj.group_id.encode())
    except (UnicodeEncodeError, AttributeError) as exc:
        raise CodecError(f"id/job/group_id: not encodable as UTF-8: {exc}") from exc
    counts = [len(data) // size for (_, size), data in zip(_ARRAYS, traj.packed, strict=True)]
    try:
        fixed = FIXED_V2.pack(
            _MAGIC, WIRE_VERSION, _KIND_TRAJECTORY, traj.replica, traj.group_size, traj.sample_index,
            traj.reward, traj.created_at, *map(len, strings), *counts,
        )  # fmt: skip
    except struct.error as exc:
        for name in ("replica", "group_size", "sample_index"):
            value = getattr(traj, name)
            if isinstance(value, int) and value not in _INT32:  # ints only: `in range` is linear for floats
                raise CodecError(f"{name}: {value} does not fit an int32") from exc
        raise CodecError(f"trajectory fields: {exc}") from exc
    return b"".join((fixed, *strings, *traj.packed))


def decode_trajectory(data: bytes) -> trajectory_mod.Trajectory:
    """Version 2, or version 1 (written by an older rollout)."""
    if type(data) is not bytes:  # memoryview has no .decode; bytearray slices would be mutable, unhashable
        data = bytes(data)
    version = _version(data)
    if version == 1:
        return _decode_trajectory_v1(data)
    if version != WIRE_VERSION:
        raise CodecError(f"v: unsupported wire version {version} (this reader knows 1 and {WIRE_VERSION})")
    if len(data) < FIXED_V2.size:
        raise CodecError("header: truncated")
    _, _, kind, replica, group_size, sample_index, reward, created_at, *lengths = FIXED_V2.unpack_from(data)
    if kind != _KIND_TRAJECTORY:
        raise CodecError(f"kind: expected 'trajectory' ({_KIND_TRAJECTORY}), got {kind}")
    offset = FIXED_V2.size
    strings = []
    for name, length in zip(("id", "job", "group_id"), lengths, strict=False):
        end = offset + length
        if end > len(data):
            raise CodecError(f"{name}: {length} bytes do not fit the message")
        try:
            strings.append(data[offset:end].decode())
        except UnicodeDecodeError as exc:
            raise CodecError(f"{name}: not UTF-8: {exc}") from exc
        offset = end
    packed = []
    for (name, size), count in zip(_ARRAYS, lengths[3:], strict=True):
        end = offset + count * size
        if end > len(data):
            raise CodecError(f"{name}: {count} elements do not fit the message")
        packed.append(data[offset:end])
        offset = end
    if offset != len(data):
        raise CodecError(f"arrays: {len(data) - offset} trailing bytes")
    id_, job, group_id = strings
    try:
        return trajectory_mod.Trajectory.from_packed(
            id_, job, replica, group_id, group_size, sample_index, reward, created_at, tuple(packed)
        )
    except trajectory_mod.InvalidTrajectory as exc:
        raise CodecError(str(exc)) from exc


def _decode_trajectory_v1(data: bytes) -> trajectory_mod.Trajectory:
    header, body = _unframe(data, "trajectory")
    packed = []
    try:
        scalars = {name: header[name] for name in _SCALARS}
        lengths = header["lengths"]
        offset = 0
        for name, size in _ARRAYS:
            count = lengths[name]
            if type(count) is not int:
                raise CodecError(f"{name}: element count {count!r} is not an integer")
            end = offset + count * size
            if end > len(body) or count < 0:
                raise CodecError(f"{name}: {count} elements do not fit the message")
            packed.append(bytes(body[offset:end]))
            offset = end
    except KeyError as exc:
        raise CodecError(f"{exc.args[0]}: missing") from exc
    except (ValueError, TypeError) as exc:
        if isinstance(exc, CodecError):
            raise
        raise CodecError(f"lengths: malformed: {exc}") from exc
    if offset != len(body):
        raise CodecError(f"arrays: {len(body) - offset} trailing bytes")
    for name, types in _V1_TYPES.items():  # what v2's struct enforces; JSON carries any type
        if type(scalars[name]) not in types:
            expected = " or ".join(t.__name__ for t in types)
            raise CodecError(f"{name}: {type(scalars[name]).__name__} is not {expected}")
    scalars["reward"], scalars["created_at"] = float(scalars["reward"]), float(scalars["created_at"])
    try:
        return trajectory_mod.Trajectory.from_packed(**scalars, packed=tuple(packed))
    except trajectory_mod.InvalidTrajectory as exc:
        raise CodecError(str(exc)) from exc
    except TypeError as exc:
        raise CodecError(f"trajectory fields: {exc}") from exc


def encode_announcement(version: int, step: int, created_at: float) -> bytes:
    """Trainer rank 0 -> rollouts: policy `version` (made after trainer `step`) is about to be broadcast.
    Version 1 (JSON header): a few a minute, where a self-describing header costs nothing."""
    return _frame({"kind": "weights", "version": version, "step": step, "created_at": created_at})


def decode_announcement(data: bytes) -> dict[str, Any]:
    version = _version(data)
    if version == WIRE_VERSION and len(data) > 4 and data[4] == _KIND_TRAJECTORY:
        raise CodecError("kind: expected 'weights', got 'trajectory'")
    if version != 1:
        raise CodecError(f"v: unsupported wire version {version} for an announcement (this reader knows 1)")
    header, _ = _unframe(data, "weights")
    for name in ("version", "step", "created_at"):
        if name not in header:
            raise CodecError(f"{name}: missing")
    return {
        "version": int(header["version"]),
        "step": int(header["step"]),
        "created_at": float(header["created_at"]),
    }


VALIDATION_PARTS = ("sample", "result")
"""A validation run is sent as one `sample` message per generated record, then one `result`."""


def encode_validation(part: str, body: dict[str, Any]) -> bytes:
    """Rollout replica 0 -> trainer rank 0: one part of a validation run (rollout/validation.py says
    what each holds). Version 1 (JSON header, no arrays): a few per validation run."""
    if part not in VALIDATION_PARTS:
        raise CodecError(f"part: {part!r} is not one of {VALIDATION_PARTS}")
    return _frame({**body, "kind": "validation", "part": part})


def decode_validation(data: bytes) -> tuple[str, dict[str, Any]]:
    """(part, body) of a validation message; CodecError for anything else."""
    if _version(data) != 1:
        raise CodecError("v: unsupported wire version for a validation message (this reader knows 1)")
    header, body = _unframe(data, "validation")
    if len(body):
        raise CodecError(f"arrays: {len(body)} trailing bytes")
    part = header.pop("part", None)
    if part not in VALIDATION_PARTS:
        raise CodecError(f"part: {part!r} is not one of {VALIDATION_PARTS}")
    del header["kind"]
    return part, header
