"""The trajectory: one sampled response, the unit that travels over the bus.

Built by the rollout worker (one per sample of a group), encoded by bus/codec.py, consumed by the trainer
(trainer/staleness.py, trainer/batcher.py). Arrays line up as follows:

    prompt_ids          (P,)  prompt token ids
    response_ids        (R,)  generated (and, for agent loops, tool-output) token ids
    behaviour_logprobs  (R,)  log pi_behaviour(response_ids[t] | prefix) from the engine that sampled it
    versions            (R,)  policy version that produced response_ids[t] (several with partial rollout)
    mask                (R,)  1 = generated token (trained), 0 = tool output / not trained

The id is stable across retries and redeliveries (see `trajectory_id`): it is the JetStream
`Nats-Msg-Id` (publisher dedup) and the key the trainer records so a sample is never trained twice.
"""

from __future__ import annotations

import dataclasses
import math


class InvalidTrajectory(ValueError):
    """A trajectory whose arrays do not line up or whose fields are out of range."""


def trajectory_id(job: str, replica: int, prompt_key: str, sample_index: int, attempt: int = 0) -> str:
    """Stable id of one sample: the same generation request always maps to the same id."""
    return f"{job}:r{replica}:p{prompt_key}:s{sample_index}:a{attempt}"


@dataclasses.dataclass(frozen=True)
class Trajectory:
    id: str
    job: str
    replica: int
    group_id: str
    """Samples of the same prompt share a group id; GRPO normalises rewards within a group."""
    group_size: int
    """Number of samples the rollout generated for this group (sampling.n)."""
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    behaviour_logprobs: list[float]
    versions: list[int]
    mask: list[int]
    reward: float
    created_at: float
    """Unix time at which the rollout finished the sample (queue age = now - created_at)."""

    def __post_init__(self) -> None:
        validate(self)

    @property
    def oldest_version(self) -> int:
        """The oldest policy version that produced any of the response tokens."""
        return min(self.versions)

    @property
    def newest_version(self) -> int:
        return max(self.versions)


def validate(traj: Trajectory) -> None:
    """Raise InvalidTrajectory naming the first field that is wrong."""
    if not traj.id:
        raise InvalidTrajectory("id: must not be empty")
    if not traj.prompt_ids:
        raise InvalidTrajectory("prompt_ids: must not be empty")
    n = len(traj.response_ids)
    if n == 0:
        raise InvalidTrajectory("response_ids: must not be empty")
    for name in ("behaviour_logprobs", "versions", "mask"):
        if len(getattr(traj, name)) != n:
            raise InvalidTrajectory(f"{name}: length {len(getattr(traj, name))} != len(response_ids) {n}")
    # builtins (C loops) rather than generator expressions: this runs for every message on the bus
    if min(traj.versions) < 0:
        raise InvalidTrajectory("versions: policy versions must be >= 0")
    if min(traj.mask) < 0 or max(traj.mask) > 1:
        raise InvalidTrajectory("mask: entries must be 0 or 1")
    if max(traj.mask) == 0:
        raise InvalidTrajectory("mask: no trainable token")
    if max(traj.behaviour_logprobs) > 1e-4 or not math.isfinite(sum(traj.behaviour_logprobs)):
        raise InvalidTrajectory("behaviour_logprobs: must be finite log-probabilities (<= 0)")
    if not math.isfinite(traj.reward):
        raise InvalidTrajectory("reward: must be finite")
    if traj.group_size < 1 or not 0 <= traj.sample_index < traj.group_size:
        raise InvalidTrajectory(f"sample_index: {traj.sample_index} outside group of size {traj.group_size}")
