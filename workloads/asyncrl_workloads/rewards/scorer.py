"""The job's reward, whole: a rule function, a judge, or both weighted (``spec.reward``).

Built once per rollout replica by ``rollout/main.py`` (``build``; the judge's endpoint is checked with the
one-token preflight before NATS and the engine start) and called by ``rollout/group.py`` for every sample
the replica publishes, concurrently for the samples of a group. A rule function may be ``async def``; a
plain one runs inline (rule functions are cheap string checks; one that is not should be async).

    reward = function(record, response[, episode])                          reward.type function
             (or verl's compute_score(data_source, solution_str, ground_truth, extra_info): rewards/loader.py)
    reward = judge                                                          reward.type judge
    reward = functionWeight * function(...) + judge.weight * judge          judge with a function

Failures raise: ``judge.JudgeError`` (unreadable reply, missing record field), ``EndpointError`` (the
endpoint failed past its retries) or whatever the rule function raised. The caller drops the sample and
counts it; nothing here invents a reward. ``gave_up()`` tells the rollout that the judge has failed for
longer than ``giveUpAfterSeconds`` (it exits with the classified line, which the operator shows).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from asyncrl_api import config as config_mod
from asyncrl_api import task as task_api

from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.endpoints import client as client_mod
from asyncrl_workloads.endpoints import errors as errors_mod
from asyncrl_workloads.endpoints import runner as runner_mod
from asyncrl_workloads.endpoints import settings as endpoint_settings
from asyncrl_workloads.rewards import judge as judge_mod
from asyncrl_workloads.rewards import loader


class Judge:
    """One judge endpoint: builds the messages, calls the endpoint on the runner's loop, parses."""

    def __init__(
        self,
        spec: task_api.JudgeSpec,
        client: client_mod.Client,
        runner: runner_mod.Runner,
        prompt_key: str,
    ) -> None:
        self.spec, self.client, self.runner, self.prompt_key = spec, client, runner, prompt_key

    async def close(self) -> None:
        """Close the client's connections on the runner's loop, before the runner stops: left to the
        garbage collector, the SDK would schedule its close on whatever loop runs then (the engine's) and
        fail there."""
        await self.runner.run(self.client.close())

    async def preflight(self) -> None:
        """The one-token check ("ping", max_tokens 1); EndpointError when the endpoint is not usable."""
        await self.runner.run(self.client.preflight("chat"))

    async def score(
        self, record: Mapping[str, Any], response: str, conversation: Sequence[Mapping[str, Any]] | None
    ) -> float:
        messages = judge_mod.build_messages(self.spec, record, response, conversation, self.prompt_key)
        reply = await self.runner.run(
            self.client.chat(messages, max_tokens=self.spec.max_tokens, temperature=self.spec.temperature)
        )
        return judge_mod.parse_score(self.spec, reply)


class Scorer:
    def __init__(
        self,
        function: loader.RewardFn | None,
        judge: Judge | None = None,
        function_weight: float = 1.0,
        ground_truth_key: str = loader.DEFAULT_GROUND_TRUTH_KEY,
        metrics: metrics_mod.Bound | None = None,
    ) -> None:
        """``ground_truth_key``: the record field a verl-style function gets as ground_truth;
        ``metrics``: where a dict result's extra keys go (``asyncrl_reward_extra{key}``)."""
        if function is None and judge is None:
            raise ValueError("a reward needs a function, a judge or both")
        self.function, self.judge, self.function_weight = function, judge, function_weight
        self.ground_truth_key, self.metrics = ground_truth_key, metrics

    async def score(self, record: Mapping[str, Any], response: str, episode: Any = None) -> float:
        """The sample's reward (see the module docstring); ``episode`` is the agent loop's recorder or
        a gateway session's (its ``messages`` are the conversation the judge reads), None otherwise."""
        return (await self.evaluate(record, response, episode)).value

    async def evaluate(self, record: Mapping[str, Any], response: str, episode: Any = None) -> loader.Scored:
        """``score`` with the rule function's extras (a dict result's numeric keys), which also go to
        ``asyncrl_reward_extra{key}``; validation writes them into its generations rows."""
        total = 0.0
        extras: Mapping[str, float] = {}
        if self.function is not None:
            result = await call_function(self.function, record, response, episode, self.ground_truth_key)
            extras = result.extras
            if self.metrics is not None:
                for key, extra in extras.items():
                    self.metrics.reward_extra_by(key).observe(extra)
            total += result.value * (self.function_weight if self.judge is not None else 1.0)
        if self.judge is not None:
            conversation = getattr(episode, "messages", None) if episode is not None else None
            total += self.judge.spec.weight * await self.judge.score(record, response, conversation)
        return loader.Scored(total, extras)

    def gave_up(self) -> errors_mod.EndpointError | None:
        """The judge's last error once it has failed for longer than giveUpAfterSeconds, else None."""
        return self.judge.client.gave_up() if self.judge is not None else None


async def call_function(
    fn: loader.RewardFn,
    record: Mapping[str, Any],
    response: str,
    episode: Any,
    ground_truth_key: str = loader.DEFAULT_GROUND_TRUTH_KEY,
) -> loader.Scored:
    """``loader.call`` for sync and ``async def`` rule functions alike, its result as a ``Scored``."""
    result = loader.call(fn, record, response, episode, ground_truth_key)
    if inspect.isawaitable(result):
        result = await result
    return loader.scored(result, response)


def resolve_function(reward: task_api.RewardSpec, prompts: str) -> loader.RewardFn | None:
    """The rule function of the job: reward.function, a builtin task's reward for type function, or
    None for a judge alone (LoadError: a reference that does not load)."""
    if reward.type == "judge":
        return loader.load_reward(reward.function) if reward.function else None
    return loader.resolve(reward.function, prompts)


def record_fields(reward: task_api.RewardSpec, function: loader.RewardFn | None) -> dict[str, str]:
    """The record fields every record must hold for this reward, each with the spec field naming it:
    a verl-style function's ground truth (reward.groundTruthKey). RewardLoadError: groundTruthKey set
    for a function that does not read it."""
    if function is not None and loader.is_verl_style(function):
        key = reward.ground_truth_key or loader.DEFAULT_GROUND_TRUTH_KEY
        return {key: "spec.reward.groundTruthKey" if reward.ground_truth_key else "verl's ground_truth"}
    if reward.ground_truth_key is not None:
        raise loader.RewardLoadError(
            f"spec.reward.groundTruthKey: only a verl-style reward.function (one with a solution_str"
            f" parameter) reads it; {reward.function!r} takes (record, response)"
        )
    return {}


def build(
    cfg: config_mod.JobConfig,
    function: loader.RewardFn | None,
    metrics: metrics_mod.Bound | None,
    records: Sequence[Mapping[str, Any]] | None,
) -> tuple[Scorer, runner_mod.Runner | None]:
    """The job's scorer and, for a judge, the started runner the caller stops at exit (ValueError: a
    template placeholder nothing fills)."""
    reward = cfg.spec.reward
    truth = reward.ground_truth_key or loader.DEFAULT_GROUND_TRUTH_KEY
    if reward.type != "judge":
        return Scorer(function, ground_truth_key=truth, metrics=metrics), None
    spec = reward.judge_settings()
    judge_mod.check_template(spec, records[0].keys() if records else None)
    endpoint = endpoint_settings.judge(cfg.spec)
    runner = runner_mod.Runner(name="judge")
    runner.start()
    client = client_mod.Client(endpoint, metrics)
    judge = Judge(spec, client, runner, cfg.spec.data.prompt_key)
    return Scorer(function, judge, reward.function_weight, truth, metrics), runner
