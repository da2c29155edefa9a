"""Versioned wire codec for bus messages, defined once and imported by both sides.

The rollout publisher calls `encode_trajectory`; the trainer consumer calls `decode_trajectory`; the
trainer announces versions with `encode_announcement` and rollouts read them with `decode_announcement`.

Format (version 1): `b"ARL" + u8 wire version + u32 header length (little endian) + header + arrays`.
The header is UTF-8 JSON: `{"kind": ..., scalars..., "lengths": {array: n}}`; the arrays follow in a
fixed order as raw little-endian bytes - token ids and versions int32, mask uint8, behaviour logprobs
float32 (the engine computes them in fp32, so this round-trips exactly). That is how a Trajectory holds
its arrays in memory (trajectory.ARRAYS), so encoding joins bytes and decoding slices them: no
per-element Python work on either side, no base64, no JSON numbers. A 512-token trajectory is ~7.5 kB;
the bus benchmark (tools/asyncrl_testing/bench_bus.py) measures the whole path against raw nats-py.
A reader rejects any other version byte with CodecError rather than guessing; the format is pinned
byte for byte by tests/unit/test_codec.py.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from asyncrl_workloads.bus import trajectory as trajectory_mod

WIRE_VERSION = 1
_MAGIC = b"ARL"
_PREFIX = struct.Struct("<3sBI")  # magic, wire version, header length
_SCALARS = ("id", "job", "replica", "group_id", "group_size", "sample_index", "reward", "created_at")
# The body is the trajectory's packed arrays as they are (trajectory.ARRAYS: names, order, item types).
_ARRAYS = tuple((name, trajectory_mod.ITEMSIZE[code]) for name, code in trajectory_mod.ARRAYS)
_JSON = json.JSONEncoder(separators=(",", ":"))


class CodecError(ValueError):
    """A message that is not a valid bus message of a known wire version."""


def _frame(header: dict[str, Any], *body: bytes) -> bytes:
    head = _JSON.encode(header).encode()
    return b"".join((_PREFIX.pack(_MAGIC, WIRE_VERSION, len(head)), head, *body))


def _unframe(data: bytes, kind: str) -> tuple[dict[str, Any], memoryview]:
    if len(data) < _PREFIX.size:
        raise CodecError("not a bus message: too short")
    magic, version, head_len = _PREFIX.unpack_from(data)
    if magic != _MAGIC:
        raise CodecError("not a bus message: bad magic")
    if version != WIRE_VERSION:
        raise CodecError(f"v: unsupported wire version {version} (this reader knows {WIRE_VERSION})")
    view = memoryview(data)
    try:
        header = json.loads(bytes(view[_PREFIX.size : _PREFIX.size + head_len]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"header: not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise CodecError("header: must be a JSON object")
    if header.get("kind") != kind:
        raise CodecError(f"kind: expected {kind!r}, got {header.get('kind')!r}")
    return header, view[_PREFIX.size + head_len :]


def encode_trajectory(traj: trajectory_mod.Trajectory) -> bytes:
    header: dict[str, Any] = {"kind": "trajectory"}
    for name in _SCALARS:
        header[name] = getattr(traj, name)
    lengths = {name: len(data) // size for (name, size), data in zip(_ARRAYS, traj.packed, strict=True)}
    header["lengths"] = lengths
    return _frame(header, *traj.packed)


def decode_trajectory(data: bytes) -> trajectory_mod.Trajectory:
    header, body = _unframe(data, "trajectory")
    packed = []
    try:
        scalars = {name: header[name] for name in _SCALARS}
        lengths = header["lengths"]
        offset = 0
        for name, size in _ARRAYS:
            count = lengths[name]
            end = offset + int(count) * size
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
    try:
        return trajectory_mod.Trajectory.from_packed(**scalars, packed=tuple(packed))
    except trajectory_mod.InvalidTrajectory as exc:
        raise CodecError(str(exc)) from exc
    except TypeError as exc:
        raise CodecError(f"trajectory fields: {exc}") from exc


def encode_announcement(version: int, step: int, created_at: float) -> bytes:
    """Trainer rank 0 -> rollouts: policy `version` (made after trainer `step`) is about to be broadcast."""
    return _frame({"kind": "weights", "version": version, "step": step, "created_at": created_at})


def decode_announcement(data: bytes) -> dict[str, Any]:
    header, _ = _unframe(data, "weights")
    for name in ("version", "step", "created_at"):
        if name not in header:
            raise CodecError(f"{name}: missing")
    return {
        "version": int(header["version"]),
        "step": int(header["step"]),
        "created_at": float(header["created_at"]),
    }
