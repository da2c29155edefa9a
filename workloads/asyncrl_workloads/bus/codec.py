"""Versioned wire codec for bus messages, defined once and imported by both sides.

The rollout publisher calls `encode_trajectory`; the trainer consumer calls `decode_trajectory`; the
trainer announces versions with `encode_announcement` and rollouts read them with `decode_announcement`.

Format (version 1): a UTF-8 JSON object `{"v": 1, "kind": "trajectory", ...scalars..., "arrays": {...}}`
where each array is little-endian packed and base64 encoded: token ids and versions as int32, the mask as
uint8, behaviour logprobs as float32 (the engine computes them in fp32, so this round-trips exactly).
Packing keeps a 1k-token trajectory at ~7 kB instead of ~20 kB of JSON numbers, and decoding is one
`array.frombytes` per field. A reader rejects any other `v` with CodecError rather than guessing.
"""

from __future__ import annotations

import array
import base64
import json
import sys
from typing import Any

from asyncrl_workloads.bus import trajectory as trajectory_mod

WIRE_VERSION = 1

# (field, array typecode): "i" int32, "f" float32, "B" uint8.
_ARRAYS = (
    ("prompt_ids", "i"),
    ("response_ids", "i"),
    ("behaviour_logprobs", "f"),
    ("versions", "i"),
    ("mask", "B"),
)
_SCALARS = ("id", "job", "replica", "group_id", "group_size", "sample_index", "reward", "created_at")


class CodecError(ValueError):
    """A message that is not a valid bus message of a known wire version."""


def _pack(values: list[Any], typecode: str) -> str:
    arr = array.array(typecode, values)
    if sys.byteorder != "little":
        arr.byteswap()
    return base64.b64encode(arr.tobytes()).decode("ascii")


def _unpack(text: str, typecode: str) -> list[Any]:
    arr = array.array(typecode)
    arr.frombytes(base64.b64decode(text, validate=True))
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tolist()


def encode_trajectory(traj: trajectory_mod.Trajectory) -> bytes:
    body: dict[str, Any] = {"v": WIRE_VERSION, "kind": "trajectory"}
    for name in _SCALARS:
        body[name] = getattr(traj, name)
    body["arrays"] = {name: _pack(getattr(traj, name), code) for name, code in _ARRAYS}
    return json.dumps(body, separators=(",", ":")).encode()


def _load(data: bytes, kind: str) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"not a JSON bus message: {exc}") from exc
    if not isinstance(body, dict):
        raise CodecError("bus message must be a JSON object")
    if body.get("v") != WIRE_VERSION:
        raise CodecError(f"v: unsupported wire version {body.get('v')!r} (this reader knows {WIRE_VERSION})")
    if body.get("kind") != kind:
        raise CodecError(f"kind: expected {kind!r}, got {body.get('kind')!r}")
    return body


def decode_trajectory(data: bytes) -> trajectory_mod.Trajectory:
    body = _load(data, "trajectory")
    fields: dict[str, Any] = {}
    try:
        for name in _SCALARS:
            fields[name] = body[name]
        arrays = body["arrays"]
        for name, code in _ARRAYS:
            fields[name] = _unpack(arrays[name], code)
    except KeyError as exc:
        raise CodecError(f"{exc.args[0]}: missing") from exc
    except (ValueError, TypeError) as exc:
        raise CodecError(f"arrays: malformed packed array: {exc}") from exc
    try:
        return trajectory_mod.Trajectory(**fields)
    except trajectory_mod.InvalidTrajectory as exc:
        raise CodecError(str(exc)) from exc
    except TypeError as exc:
        raise CodecError(f"trajectory fields: {exc}") from exc


def encode_announcement(version: int, step: int, created_at: float) -> bytes:
    """Trainer rank 0 -> rollouts: policy `version` (made after trainer `step`) is about to be broadcast."""
    body = {"v": WIRE_VERSION, "kind": "weights", "version": version, "step": step, "created_at": created_at}
    return json.dumps(body, separators=(",", ":")).encode()


def decode_announcement(data: bytes) -> dict[str, Any]:
    body = _load(data, "weights")
    for name in ("version", "step", "created_at"):
        if name not in body:
            raise CodecError(f"{name}: missing")
    return {
        "version": int(body["version"]),
        "step": int(body["step"]),
        "created_at": float(body["created_at"]),
    }
