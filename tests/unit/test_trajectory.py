"""The trajectory type: packed arrays behind list attributes, whole-array validation, pickling."""

from __future__ import annotations

import array
import math
import pickle
import struct

import pytest
from asyncrl_workloads.bus import codec, trajectory


def make(**overrides):
    fields = dict(
        id="demo:r0:p1:s0:a0",
        job="demo",
        replica=0,
        group_id="demo:p1",
        group_size=2,
        sample_index=1,
        prompt_ids=[1, 70000, 2**31 - 1],
        response_ids=[5, 6, 7, 8],
        behaviour_logprobs=[-0.5, -1.25, 0.0, -100.0],
        versions=[2, 2, 3, 3],
        mask=[1, 0, 1, 1],
        reward=1.0,
        created_at=1.5,
    )
    fields.update(overrides)
    return trajectory.Trajectory(**fields)


def test_attributes_are_the_lists_it_was_built_from():
    traj = make()
    assert traj.prompt_ids == [1, 70000, 2**31 - 1] and type(traj.prompt_ids) is list
    assert traj.behaviour_logprobs == [-0.5, -1.25, 0.0, -100.0]
    assert traj.versions == [2, 2, 3, 3] and traj.mask == [1, 0, 1, 1]
    assert traj.prompt_ids + traj.response_ids == [1, 70000, 2**31 - 1, 5, 6, 7, 8]
    assert (traj.oldest_version, traj.newest_version) == (2, 3)


def test_packed_arrays_are_the_wire_layout_and_arrays_build_the_same_trajectory():
    traj = make()
    assert traj.packed[1] == struct.pack("<4i", 5, 6, 7, 8) and traj.packed[4] == b"\x01\x00\x01\x01"
    same = make(
        response_ids=array.array("i", [5, 6, 7, 8]),
        behaviour_logprobs=array.array("f", [-0.5, -1.25, 0.0, -100.0]),
        mask=array.array("B", [1, 0, 1, 1]),
    )
    assert same == traj


def test_logprobs_are_float32_from_construction_on():
    traj = make(behaviour_logprobs=[-0.1, -1.0, -1.0, -1.0])
    f32 = struct.unpack("f", struct.pack("f", -0.1))[0]
    assert traj.behaviour_logprobs[0] == f32 != -0.1
    assert codec.decode_trajectory(codec.encode_trajectory(traj)) == traj


EDGE = [
    0.0, -0.0, 5e-5, 1e-4, 1.0001e-4, 1.3e-4, 0.5, 3e38, math.inf, math.nan,
    -1e-30, -3e38, -3.4e38, -math.inf, -math.nan, 1e-40, -1e-40,
]  # fmt: skip


@pytest.mark.parametrize("value", EDGE)
def test_logprob_validation_is_exactly_finite_and_at_most_1e_4(value):
    f32 = struct.unpack("<f", struct.pack("<f", value))[0]
    valid = math.isfinite(f32) and f32 <= 1e-4  # the rule, on the float32 the trajectory holds
    build = lambda: make(behaviour_logprobs=[-1.0, f32, -2.0, -3.0])  # noqa: E731
    if valid:
        assert build().behaviour_logprobs[1] == f32
    else:
        with pytest.raises(trajectory.InvalidTrajectory, match="^behaviour_logprobs:"):
            build()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"prompt_ids": [2**31]}, "prompt_ids"),
        ({"response_ids": [1, 2, 3, "4"]}, "response_ids"),
        ({"mask": [1, 1, 1, -1]}, "mask"),
        ({"behaviour_logprobs": [-1e39, -1.0, -1.0, -1.0]}, "behaviour_logprobs"),
        ({"versions": [0, 0, 0, -(2**31)]}, "versions"),
        ({"versions": [0, 0, 0]}, "versions"),
        ({"prompt_ids": []}, "prompt_ids"),
        ({"id": ""}, "id"),
    ],
)
def test_values_that_do_not_pack_or_fit_name_the_field(overrides, field):
    with pytest.raises(trajectory.InvalidTrajectory, match=f"^{field}:"):
        make(**overrides)


def test_from_packed_validates_too():
    good = make()
    bad_mask = (*good.packed[:4], b"\x01\x00\x02\x01")
    with pytest.raises(trajectory.InvalidTrajectory, match="^mask: entries must be 0 or 1"):
        trajectory.Trajectory.from_packed(**_scalars(good), packed=bad_mask)
    with pytest.raises(trajectory.InvalidTrajectory, match="^versions: 3 bytes are not whole"):
        trajectory.Trajectory.from_packed(**_scalars(good), packed=(*good.packed[:3], b"\x00" * 3, b"\x01"))


def _scalars(traj):
    names = ("id", "job", "replica", "group_id", "group_size", "sample_index", "reward", "created_at")
    return {n: getattr(traj, n) for n in names}


def test_pickles_for_the_trainer_ranks_without_its_cached_lists():
    traj = make()
    bare = len(pickle.dumps(traj))
    assert traj.response_ids and traj.oldest_version == 2  # caches filled
    data = pickle.dumps(traj)
    assert len(data) == bare
    back = pickle.loads(data)
    assert back == traj and back.response_ids == [5, 6, 7, 8] and back.oldest_version == 2


def test_is_immutable():
    with pytest.raises(AttributeError):
        make().reward = 2.0  # type: ignore[misc]
