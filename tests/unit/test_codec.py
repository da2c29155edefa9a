"""The bus wire format: round trips, version checks, field-level errors, NATS names."""

from __future__ import annotations

import json
import struct

import pytest
from asyncrl_workloads.bus import codec, subjects, trajectory


def make(**overrides):
    fields = dict(
        id=trajectory.trajectory_id("demo", 1, "17", 3),
        job="demo",
        replica=1,
        group_id="demo:r1:p17",
        group_size=4,
        sample_index=3,
        prompt_ids=[1, 40, 41],
        response_ids=[50, 51, 2],
        behaviour_logprobs=[-0.1234567, -2.5, -7.0],
        versions=[3, 3, 4],
        mask=[1, 1, 1],
        reward=0.3,
        created_at=1_700_000_000.25,
    )
    fields.update(overrides)
    return trajectory.Trajectory(**fields)


def test_round_trip_is_exact_for_engine_float32_logprobs():
    import struct

    f32 = [struct.unpack("f", struct.pack("f", x))[0] for x in (-0.1234567, -2.5, -7.0)]
    traj = make(behaviour_logprobs=f32)
    assert codec.decode_trajectory(codec.encode_trajectory(traj)) == traj


def test_ids_are_stable_and_distinguish_sample_and_attempt():
    assert trajectory.trajectory_id("j", 0, "p", 1) == trajectory.trajectory_id("j", 0, "p", 1)
    ids = {trajectory.trajectory_id("j", r, "p", s, a) for r in (0, 1) for s in (0, 1) for a in (0, 1)}
    assert len(ids) == 8


def test_partial_rollout_versions_give_the_oldest_version():
    assert make(versions=[3, 3, 5]).oldest_version == 3


def _split(data: bytes) -> tuple[bytes, dict, bytes]:
    head_len = struct.unpack_from("<I", data, 4)[0]
    return data[:4], json.loads(data[8 : 8 + head_len]), data[8 + head_len :]


def _join(prefix: bytes, header: dict, body: bytes) -> bytes:
    head = json.dumps(header).encode()
    return prefix[:4] + struct.pack("<I", len(head)) + head + body


def encode_v1(traj: trajectory.Trajectory) -> bytes:
    """Version 1 as an older rollout wrote it (spelled out here: the codec no longer writes it)."""
    header = {"kind": "trajectory"}
    for name in ("id", "job", "replica", "group_id", "group_size", "sample_index", "reward", "created_at"):
        header[name] = getattr(traj, name)
    sizes = {"prompt_ids": 4, "response_ids": 4, "behaviour_logprobs": 4, "versions": 4, "mask": 1}
    arrays = zip(sizes, traj.packed, strict=True)
    header["lengths"] = {name: len(data) // sizes[name] for name, data in arrays}
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"ARL\x01" + struct.pack("<I", len(head)) + head + b"".join(traj.packed)


FIXED = struct.Struct("<3sBB3xiiiddIIIIIIII")


def _fields_v2(data: bytes) -> list:
    return list(FIXED.unpack_from(data))


def _with_fields_v2(data: bytes, fields: list, tail: bytes | None = None) -> bytes:
    return FIXED.pack(*fields) + (data[FIXED.size :] if tail is None else tail)


def test_an_unknown_wire_version_is_rejected():
    data = bytearray(codec.encode_trajectory(make()))
    data[3] = 3
    with pytest.raises(codec.CodecError, match="^v: unsupported wire version 3"):
        codec.decode_trajectory(bytes(data))


def test_version_1_trajectories_are_still_read():
    """A trainer reads what an older rollout left in the durable stream."""
    traj = make(behaviour_logprobs=[-0.5, -2.5, -7.0])
    assert codec.decode_trajectory(encode_v1(traj)) == traj


def test_misaligned_arrays_name_the_field_v1():
    prefix, header, body = _split(encode_v1(make()))
    header["lengths"]["versions"] = 1
    with pytest.raises(codec.CodecError, match="trailing bytes"):
        codec.decode_trajectory(_join(prefix, header, body))
    header["lengths"]["versions"] = 1
    header["lengths"]["mask"] = 11  # consumes the 8 bytes the shorter versions left: aligned, wrong lengths
    with pytest.raises(codec.CodecError, match=r"^versions: length 1 != len\(response_ids\) 3"):
        codec.decode_trajectory(_join(prefix, header, body))
    header["lengths"]["mask"] = 1000
    with pytest.raises(codec.CodecError, match="^mask: 1000 elements do not fit"):
        codec.decode_trajectory(_join(prefix, header, body))


def test_misaligned_arrays_name_the_field_v2():
    data = codec.encode_trajectory(make())
    fields = _fields_v2(data)  # [..., id, job, group_id lengths, prompt, response, logprobs, versions, mask]
    fields[-2] = 1  # versions
    with pytest.raises(codec.CodecError, match="trailing bytes"):
        codec.decode_trajectory(_with_fields_v2(data, fields))
    fields[-1] = 11  # mask takes the 8 bytes the shorter versions left: aligned, wrong lengths
    with pytest.raises(codec.CodecError, match=r"^versions: length 1 != len\(response_ids\) 3"):
        codec.decode_trajectory(_with_fields_v2(data, fields))
    fields[-1] = 1000
    with pytest.raises(codec.CodecError, match="^mask: 1000 elements do not fit"):
        codec.decode_trajectory(_with_fields_v2(data, fields))


def _v2_garbage() -> list[tuple[bytes, str]]:
    data = codec.encode_trajectory(make())
    fields = _fields_v2(data)
    out = [(data[: FIXED.size - 1], "header: truncated")]
    other_kind = _with_fields_v2(data, [*fields[:2], 2, *fields[3:]])
    out.append((other_kind, "kind: expected 'trajectory' \\(1\\), got 2"))
    too_long = list(fields)
    too_long[8] = 10_000  # id length
    out.append((_with_fields_v2(data, too_long), "^id: 10000 bytes do not fit"))
    id_bytes = make().id.encode()
    out.append((_with_fields_v2(data, fields, b"\xff" * len(id_bytes) + data[FIXED.size + len(id_bytes) :]),
                "^id: not UTF-8"))  # fmt: skip
    out.append((data + b"\x00", "^arrays: 1 trailing bytes"))
    return out


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\xff\xfe", "too short"),
        (b'{"v": 1, "kind": "trajectory", "id": "x"}', "bad magic"),
        (b"ARL\x01\x03\x00\x00\x00[1]", "header: must be a JSON object"),
        (b"ARL\x01\x02\x00\x00\x00\xff\xfe", "header: not JSON"),
        (codec.encode_announcement(1, 1, 0.0), "kind: expected 'trajectory'"),
        (b'ARL\x01\x16\x00\x00\x00{"kind": "trajectory"}', "id: missing"),
        *_v2_garbage(),
    ],
)
def test_garbage_is_a_codec_error(data, match):
    with pytest.raises(codec.CodecError, match=match):
        codec.decode_trajectory(data)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"mask": [1, 2, 1]}, "mask"),
        ({"mask": [0, 0, 0]}, "mask"),
        ({"behaviour_logprobs": [0.5, -1.0, -1.0]}, "behaviour_logprobs"),
        ({"reward": float("nan")}, "reward"),
        ({"sample_index": 4}, "sample_index"),
        ({"versions": [-1, 0, 0]}, "versions"),
        ({"response_ids": []}, "response_ids"),
    ],
)
def test_invalid_trajectories_are_refused_at_construction(overrides, field):
    with pytest.raises(trajectory.InvalidTrajectory, match=f"^{field}:"):
        make(**overrides)


def test_announcement_round_trip():
    data = codec.encode_announcement(7, 21, 123.5)
    assert codec.decode_announcement(data) == {"version": 7, "step": 21, "created_at": 123.5}
    with pytest.raises(codec.CodecError, match="kind"):
        codec.decode_announcement(codec.encode_trajectory(make()))


def test_names_are_sanitised_and_per_job():
    assert subjects.stream_name("team-a", "math.v2") == "ARL_team-a_math_v2"
    assert subjects.trajectory_subject("team-a", "math.v2") == "asyncrl.team-a.math_v2.traj"
    assert subjects.weights_subject("ns", "j") == "asyncrl.ns.j.weights"
    assert subjects.stream_name("a", "b") != subjects.stream_name("b", "a")


PINNED_ARRAYS = (
    struct.pack("<3i", 1, 40, 41)  # prompt_ids
    + struct.pack("<3i", 50, 51, 2)  # response_ids
    + struct.pack("<3f", -0.5, -2.5, -7.0)  # behaviour_logprobs
    + struct.pack("<3i", 3, 3, 4)  # versions
    + bytes([1, 1, 1])  # mask
)
"""The arrays of the pinned trajectory, laid out the same in both wire versions."""


def test_wire_format_v1_is_pinned_byte_for_byte():
    """Spelled out independently of the codec: what older rollouts wrote is still read."""
    traj = make(behaviour_logprobs=[-0.5, -2.5, -7.0])
    header = {
        "kind": "trajectory",
        "id": traj.id,
        "job": "demo",
        "replica": 1,
        "group_id": "demo:r1:p17",
        "group_size": 4,
        "sample_index": 3,
        "reward": 0.3,
        "created_at": 1_700_000_000.25,
        "lengths": {"prompt_ids": 3, "response_ids": 3, "behaviour_logprobs": 3, "versions": 3, "mask": 3},
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    wire = b"ARL\x01" + struct.pack("<I", len(head)) + head + PINNED_ARRAYS
    assert encode_v1(traj) == wire
    assert codec.decode_trajectory(wire) == traj


def test_wire_format_v2_is_pinned_byte_for_byte():
    """Spelled out independently of the codec: a v2 reader elsewhere must keep reading what we write."""
    traj = make(behaviour_logprobs=[-0.5, -2.5, -7.0])
    strings = (traj.id.encode(), b"demo", b"demo:r1:p17")
    fixed = (
        b"ARL"
        + bytes([2, 1, 0, 0, 0])  # version 2, kind 1 (trajectory), 3 pad bytes
        + struct.pack("<iii", 1, 4, 3)  # replica, group_size, sample_index
        + struct.pack("<dd", 0.3, 1_700_000_000.25)  # reward, created_at
        + struct.pack("<3I", *map(len, strings))
        + struct.pack("<5I", 3, 3, 3, 3, 3)  # prompt, response, logprobs, versions, mask counts
    )
    wire = fixed + b"".join(strings) + PINNED_ARRAYS
    assert codec.encode_trajectory(traj) == wire
    assert codec.decode_trajectory(wire) == traj


def _v1_with(**header_overrides) -> bytes:
    prefix, header, body = _split(encode_v1(make()))
    header.update(header_overrides)
    return _join(prefix, header, body)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (_v1_with(id=[1]), "^id: list is not str"),
        (_v1_with(group_id=None), "^group_id: NoneType is not str"),
        (_v1_with(replica="x"), "^replica: str is not int"),
        (_v1_with(sample_index=0.5), "^sample_index: float is not int"),
        (_v1_with(group_size=True), "^group_size: bool is not int"),
        (_v1_with(created_at="x"), "^created_at: str is not int or float"),
        (_v1_with(lengths={"prompt_ids": float("inf")}), "^prompt_ids: element count inf is not an integer"),
        (b"ARL\x01" + struct.pack("<I", 5000) + b"9" * 5000, "^header: not JSON"),  # over the digit limit
        (b"ARL\x01" + struct.pack("<I", 200_000) + b"[" * 200_000, "^header: not JSON"),  # nesting
    ],
)
def test_a_hostile_v1_message_is_a_codec_error_not_a_crash(data, match):
    """What an older rollout (or anyone) wrote is read by the trainer, which counts a CodecError as
    an invalid sample and acks it; any other exception, or a wrongly typed id, would crash it."""
    with pytest.raises(codec.CodecError, match=match):
        codec.decode_trajectory(data)


def test_a_memoryview_or_bytearray_decodes_like_bytes():
    data = codec.encode_trajectory(make())
    for view in (memoryview(data), bytearray(data)):
        traj = codec.decode_trajectory(view)  # type: ignore[arg-type]
        assert traj == make() and all(type(p) is bytes for p in traj.packed)


def test_fields_the_wire_cannot_carry_are_named_at_once():
    with pytest.raises(codec.CodecError, match="^replica: 4294967296 does not fit"):
        codec.encode_trajectory(make(replica=2**32))
    with pytest.raises(codec.CodecError, match="^trajectory fields"):  # a float: no scan of the int32 range
        codec.encode_trajectory(make(replica=1.5))
    with pytest.raises(codec.CodecError, match="^id/job/group_id: not encodable"):
        codec.encode_trajectory(make(id="a\ud800b"))
