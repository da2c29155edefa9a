"""Trainer rank 0's teacher (spec.teacher): per-token logprobs of the generated tokens, for distillation.

Called by entrypoints/trainer.py (`preflight`, before torch is loaded) and trainer/loop.py (`Teacher.fetch`
once per step, on the step's chosen batch, and `Teacher.gave_up` after it). Trajectories do not carry
teacher logprobs on the bus: the trainer asks the teacher for them (docs/rewards.md),
as prime-rl does.

For each trajectory the teacher scores prompt + response in one completions call with prompt logprobs on
the token ids (vLLM's `prompt_logprobs`, max_tokens 1; endpoints/client.py); position P + t of the answer
is log pi_T(response_ids[t] | prompt, response[:t]), t < R. All calls of a step run at once on the
endpoint room's own event-loop thread (endpoints/runner.py), bounded there by the endpoint's
maxConcurrency and rateLimit, with its retries.

A trajectory whose call finally fails, or whose answer does not line up with its tokens, is reported in
`Fetched.failed`: the loop drops it (dropped{reason="reward_error"}) instead of training it with a made-up
teacher value. An endpoint that has failed every call for giveUpAfterSeconds ends the trainer (`GaveUp`:
entrypoints/trainer.py exits 3 with its line in the termination message, which the operator shows in the
EndpointsReady condition).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Sequence

from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.bus import trajectory as trajectory_mod
from asyncrl_workloads.endpoints import client as client_mod
from asyncrl_workloads.endpoints import errors, runner, settings

log = logging.getLogger(__name__)


class GaveUp(Exception):
    """The teacher failed all calls for giveUpAfterSeconds, or the preflight; str(): the classified line."""

    def __init__(self, error: errors.EndpointError) -> None:
        super().__init__(error.line())
        self.error = error


@dataclasses.dataclass(frozen=True)
class Fetched:
    logprobs: dict[str, list[float]]
    """Trajectory id -> (R,) teacher logprob of each response token, aligned with its response_ids."""
    failed: dict[str, str]
    """Trajectory id -> why the teacher gave no logprobs for it (the classified line)."""


def response_logprobs(
    traj: trajectory_mod.Trajectory, prompt_logprobs: Sequence[float | None]
) -> list[float]:
    """The teacher's logprobs of the response tokens out of its per-position prompt logprobs of
    prompt + response (the client checked the length); ValueError for a missing or non-finite value."""
    out = prompt_logprobs[len(traj.prompt_ids) : len(traj.prompt_ids) + len(traj.response_ids)]
    values = [v for v in out if v is not None and math.isfinite(v) and v <= 1e-4]
    if len(values) != len(traj.response_ids):
        raise ValueError("a response token has no finite logprob <= 0 in the teacher's answer")
    return [float(v) for v in values]


def preflight(endpoint: settings.Endpoint) -> None:
    """The one-token prompt-logprobs check, before the trainer loads anything; GaveUp when it fails."""

    async def check() -> None:
        client = client_mod.Client(endpoint, None)
        try:
            await client.preflight("prompt_logprobs")
        finally:
            await client.close()

    try:
        asyncio.run(check())
    except errors.EndpointError as exc:
        raise GaveUp(exc) from exc


class Teacher:
    """The teacher client of trainer rank 0, on its own event-loop thread (start/close around training)."""

    def __init__(self, endpoint: settings.Endpoint, metrics: metrics_mod.Bound | None) -> None:
        self.endpoint = endpoint
        self.runner = runner.Runner()
        self.metrics = metrics
        self.client: client_mod.Client | None = None

    def start(self) -> None:
        self.runner.start()
        self.client = self.runner.submit(self._make_client()).result()

    async def _make_client(self) -> client_mod.Client:
        return client_mod.Client(self.endpoint, self.metrics)  # made on the loop that will use it

    def close(self) -> None:
        if self.client is not None:
            self.runner.call(self.client.close())
        self.runner.stop()

    async def fetch(self, trajs: Sequence[trajectory_mod.Trajectory]) -> Fetched:
        """The teacher's response logprobs of every trajectory (awaited from the trainer's loop)."""
        return await self.runner.run(self._fetch(list(trajs)))

    def gave_up(self) -> errors.EndpointError | None:
        return self.client.gave_up() if self.client is not None else None

    async def _fetch(self, trajs: list[trajectory_mod.Trajectory]) -> Fetched:
        assert self.client is not None, "Teacher.start() first"
        client = self.client
        answers = await asyncio.gather(
            *(client.prompt_logprobs(t.prompt_ids + t.response_ids) for t in trajs), return_exceptions=True
        )
        got: dict[str, list[float]] = {}
        failed: dict[str, str] = {}
        for traj, answer in zip(trajs, answers, strict=True):
            if isinstance(answer, errors.EndpointError):
                failed[traj.id] = answer.line()
            elif isinstance(answer, BaseException):
                raise answer  # a bug, not an endpoint failure: never swallowed
            else:
                try:
                    got[traj.id] = response_logprobs(traj, answer)
                except ValueError as exc:
                    failed[traj.id] = errors.bad_response(self.endpoint, "", str(exc)).line()
        return Fetched(got, failed)
