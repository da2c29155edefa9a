"""One group of samples on its way to the bus: scored, then turned into trajectories.

Called by the rollout worker (``worker.RolloutWorker._group``) for every group it admitted: its own
(one vLLM request with ``n`` samples, or ``n`` agent-loop episodes) and the gateway's (``n`` sessions).

Score first, publish after: ``group_size`` counts only the samples that are published, or the trainer waits
for a group member that never comes. A sample is left out when nothing was generated (an empty completion
or episode), when the reward function raised on it (logged), and when it is a gateway session's with
neither a reward the agent set nor a record to score it against (``asyncrl_gateway_unrewarded_total``). A
reward the agent set through the gateway is taken as it is; every other sample is scored by the job's
reward function on the group's record.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.bus import trajectory as trajectory_mod
from asyncrl_workloads.episode import recorder
from asyncrl_workloads.rewards import loader as reward_loader

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Sample:
    """One sample of a group, single-turn or an agent episode; arrays line up (R,) as a Trajectory's."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    mask: list[int]
    text: str
    """What the reward scores: the completion, or the episode's last assistant turn."""
    episode: recorder.Episode | None = None
    reward: float | None = None
    """Set by the agent through the gateway; None: the job's reward function scores the sample."""


def score(
    samples: Sequence[Sample],
    record: Mapping[str, Any] | None,
    reward_fn: reward_loader.RewardFn,
    metrics: metrics_mod.Bound,
    index: int,
) -> list[tuple[int, Sample, float]]:
    """(position in the group, sample, reward) of the samples that will be published."""
    kept: list[tuple[int, Sample, float]] = []
    for i, c in enumerate(samples):
        if 1 not in c.mask:  # nothing generated (an empty completion or episode)
            continue
        if c.reward is not None:
            kept.append((i, c, c.reward))
            continue
        if record is None:  # a gateway session with neither a reward nor a record to score
            metrics.gateway_unrewarded.inc()
            continue
        try:
            kept.append((i, c, reward_loader.score(reward_fn, record, c.text, c.episode)))
        except Exception:  # a buggy reward skips the sample, not the replica
            log.exception("reward function failed on group %d sample %d; sample skipped", index, i)
    return kept


def trajectories(
    kept: Sequence[tuple[int, Sample, float]], job: str, replica: int, key: str
) -> list[trajectory_mod.Trajectory]:
    """The group's trajectories; ``key`` (incarnation.index) makes their ids unique and stable, and
    ``sample_index`` counts kept samples (< group_size)."""
    group_id = f"{job}:r{replica}:{key}"
    return [
        trajectory_mod.Trajectory(
            id=trajectory_mod.trajectory_id(job, replica, key, i),
            job=job,
            replica=replica,
            group_id=group_id,
            group_size=len(kept),
            sample_index=j,
            prompt_ids=c.prompt_ids,
            response_ids=c.response_ids,
            behaviour_logprobs=c.logprobs,
            versions=c.versions,
            mask=c.mask,
            reward=reward,
            created_at=time.time(),
        )  # fmt: skip
        for j, (i, c, reward) in enumerate(kept)
    ]
