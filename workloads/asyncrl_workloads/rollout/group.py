"""One group of samples on its way to the bus: scored, then turned into trajectories.

Called by the rollout worker (``worker.RolloutWorker._group``) for every group it admitted: its own
(one vLLM request with ``n`` samples, or ``n`` agent-loop episodes) and the gateway's (``n`` sessions).

Score first, publish after: ``group_size`` counts only the samples that are published, or the trainer waits
for a group member that never comes. A sample is left out when nothing was generated (an empty completion
or episode), when its reward failed (the rule function raised, the judge's endpoint failed past its
retries or its reply was unreadable: counted ``dropped{reason="reward_error"}``, never given a made-up
reward), and when it is a gateway session's with neither a reward the agent set, nor a record, nor a judge
to score it (``asyncrl_gateway_unrewarded_total``). A reward the agent set through the gateway is taken as
it is; every other sample is scored by the job's scorer (``rewards/scorer.py``) on the group's record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.bus import trajectory as trajectory_mod
from asyncrl_workloads.episode import recorder
from asyncrl_workloads.rewards import scorer as scorer_mod

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


async def score(
    samples: Sequence[Sample],
    record: Mapping[str, Any] | None,
    scorer: scorer_mod.Scorer,
    metrics: metrics_mod.Bound,
    index: int,
) -> list[tuple[int, Sample, float]]:
    """(position in the group, sample, reward) of the samples that will be published; the samples are
    scored concurrently (a judge's calls overlap)."""
    todo: list[tuple[int, Sample]] = []
    given: list[tuple[int, Sample, float]] = []
    for i, c in enumerate(samples):
        if 1 not in c.mask:  # nothing generated (an empty completion or episode)
            continue
        if c.reward is not None:
            given.append((i, c, c.reward))
        elif record is None and scorer.judge is None:  # a gateway session nothing can score
            metrics.gateway_unrewarded.inc()
        else:
            todo.append((i, c))
    results = await asyncio.gather(
        *(scorer.score(record or {}, c.text, c.episode) for _, c in todo), return_exceptions=True
    )
    kept = list(given)
    for (i, c), result in zip(todo, results, strict=True):
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result  # cancellation and the like are not the sample's fault
            metrics.dropped["reward_error"].inc()
            _log_reward_error(result, index, i)
        else:
            kept.append((i, c, result))
    kept.sort(key=lambda item: item[0])
    return kept


_logged_kinds: set[str] = set()


def _log_reward_error(exc: Exception, index: int, i: int) -> None:
    """A failed reward drops the sample (counted); the first failure of each kind is logged with its
    traceback, later ones in one line."""
    kind = getattr(exc, "kind", None) or type(exc).__name__
    if kind not in _logged_kinds:
        _logged_kinds.add(kind)
        log.error(
            "reward failed on group %d sample %d; sample dropped (reward_error)", index, i, exc_info=exc
        )
    else:
        log.warning("reward failed on group %d sample %d (%s: %s); sample dropped", index, i, kind, exc)


def group_id(job: str, replica: int, key: str) -> str:
    """The id every trajectory of a group carries on the bus (and the gateway's /rl/groups answers)."""
    return f"{job}:r{replica}:{key}"


def trajectories(
    kept: Sequence[tuple[int, Sample, float]], job: str, replica: int, key: str
) -> list[trajectory_mod.Trajectory]:
    """The group's trajectories; ``key`` (incarnation.index) makes their ids unique and stable, and
    ``sample_index`` counts kept samples (< group_size)."""
    group_id_ = group_id(job, replica, key)
    return [
        trajectory_mod.Trajectory(
            id=trajectory_mod.trajectory_id(job, replica, key, i),
            job=job,
            replica=replica,
            group_id=group_id_,
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
