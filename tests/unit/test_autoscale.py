"""The elastic-rollout decision (asyncrl_api/autoscale.py) on recorded signal traces: a starved trainer
scales up by at most maxStep per window, a blocked fleet scales down one at a time, noise inside the
stabilisation windows changes nothing, min/max always hold, and nothing moves until every replica is
ready and a window of reports since the last change was seen."""

from __future__ import annotations

import pydantic
import pytest
from asyncrl_api import autoscale, models
from asyncrl_testing import jobs

Signals = autoscale.Signals


def spec(**kw: object) -> autoscale.AutoscaleSpec:
    base = {"minReplicas": 1, "maxReplicas": 4, "scaleUpStabilizationSeconds": 60,
            "scaleDownStabilizationSeconds": 120}  # fmt: skip
    return autoscale.AutoscaleSpec.model_validate({**base, **kw})


def trace(
    values: list[tuple[float, float]], ready: int, start: float = 0.0, every: float = 10.0
) -> list[Signals]:
    return [Signals(start + i * every, w, b, ready) for i, (w, b) in enumerate(values)]


def run(s: autoscale.AutoscaleSpec, replicas: int, samples: list[Signals]) -> list[autoscale.Decision]:
    """Feed the samples one report at a time, as the operator does, applying each change at once."""
    decisions, last_change = [], None
    for i, sample in enumerate(samples):
        seen = list(samples[: i + 1])
        seen[-1] = Signals(sample.at, sample.trainer_wait_fraction, sample.rollout_blocked_fraction,
                           min(sample.ready_replicas, replicas))  # fmt: skip
        d = autoscale.decide(s, replicas, seen, last_change, sample.at)
        if d.replicas != replicas:
            replicas, last_change = d.replicas, sample.at
        decisions.append(d)
    return decisions


def test_a_starved_trainer_scales_up_by_at_most_max_step_per_window() -> None:
    starved = trace([(0.6, 0.0)] * 30, ready=8)  # 300 s of a trainer waiting 60% of the time
    d = run(spec(maxStep=1), 1, starved)
    changes = [x for x in d if x.reason == "ScaleUp"]
    assert [c.replicas for c in changes] == [2, 3, 4]  # one per covered window, then maxReplicas
    assert all("trainer starved" in c.message and "wait 0.60" in c.message for c in changes)
    assert d[5].reason == "Stabilizing" and d[5].replicas == 1  # 50 s of the 60 s window seen
    wide = run(spec(maxStep=4), 1, starved)
    assert [x.replicas for x in wide if x.reason == "ScaleUp"] == [3, 4]  # ceil(1 * 0.9 / 0.4) = 3


def test_a_blocked_fleet_scales_down_one_at_a_time_to_min() -> None:
    blocked = trace([(0.0, 0.95)] * 40, ready=4)
    d = run(spec(), 4, blocked)
    assert [x.replicas for x in d if x.reason == "ScaleDown"] == [3, 2, 1]
    assert d[-1].replicas == 1 and d[-1].reason == "Stable" and "at minReplicas 1" in d[-1].message


def test_noise_inside_the_window_changes_nothing() -> None:
    # a weight sync or a checkpoint: one slow report in every 5 among busy ones
    noisy = trace([(0.7, 0.0) if i % 5 == 0 else (0.02, 0.3) for i in range(60)], ready=2)
    assert {x.replicas for x in run(spec(), 2, noisy)} == {2}
    # alternating starved / blocked never holds a whole window either way
    flapping = trace([(0.5, 0.0), (0.0, 0.99)] * 30, ready=2)
    assert {x.replicas for x in run(spec(), 2, flapping)} == {2}


def test_nothing_moves_until_the_replicas_are_ready_and_a_window_was_seen_since_the_change() -> None:
    s = spec()
    starved = trace([(0.9, 0.0)] * 20, ready=1)  # the second replica never becomes ready
    d = run(s, 2, starved)
    assert {x.reason for x in d} == {"WaitingForReplicas"} and {x.replicas for x in d} == {2}
    assert autoscale.decide(s, 2, [], None, 0.0).reason == "NoSignals"
    old = trace([(0.9, 0.0)] * 10, ready=2)
    assert autoscale.decide(s, 2, old, last_change_at=1000.0, now=1001.0).reason == "NoSignals"


def test_min_and_max_always_hold() -> None:
    s = spec(minReplicas=2, maxReplicas=3)
    assert autoscale.decide(s, 1, [], None, 0.0).replicas == 2
    assert autoscale.decide(s, 5, [], None, 0.0).replicas == 3
    assert {x.replicas for x in run(s, 3, trace([(0.9, 0.0)] * 30, ready=3))} == {3}
    assert {x.replicas for x in run(s, 2, trace([(0.0, 1.0)] * 30, ready=2))} == {2}


def test_admission_refuses_nonsense_at_the_field() -> None:
    with pytest.raises(pydantic.ValidationError, match="minReplicas must not exceed maxReplicas"):
        spec(minReplicas=3, maxReplicas=2)
    with pytest.raises(pydantic.ValidationError, match="maxStep"):
        spec(maxStep=0)
    with pytest.raises(pydantic.ValidationError, match="maxReplicas"):
        autoscale.AutoscaleSpec.model_validate({"minReplicas": 1})
    job = models.AsyncRLJob.model_validate(
        jobs.make_job("a", "ns", rollout={"autoscale": {"maxReplicas": 3}})
    )
    assert job.spec.rollout.autoscale is not None and job.spec.rollout.autoscale.min_replicas == 1


def node(gpus: str, unschedulable: bool = False, **labels: str) -> dict[str, object]:
    return {"metadata": {"labels": labels}, "spec": {"unschedulable": unschedulable},
            "status": {"allocatable": {"cpu": "64", "nvidia.com/gpu": gpus}}}  # fmt: skip


def test_max_replicas_beyond_what_the_gpu_nodes_hold_is_a_warning() -> None:
    nodes = [node("8", pool="a"), node("8", pool="b"), node("4", pool="a"), node("8", True, pool="a"),
             {"metadata": {"labels": {"pool": "a"}}, "status": {"allocatable": {"cpu": "8"}}}]  # fmt: skip
    assert (
        autoscale.replicas_that_fit(nodes, 2, {}) == 4 + 4 + 2
    )  # the cordoned node and the CPU node hold none
    assert autoscale.replicas_that_fit(nodes, 3, {"pool": "a"}) == 2 + 1  # 8//3 + 4//3, selector respected
    assert autoscale.replicas_that_fit(nodes, 1, {"pool": "c"}) == 0
    assert autoscale.fit_warning(10, 10, 2) == ""
    warning = autoscale.fit_warning(4, 3, 3)
    assert "maxReplicas 4 can never be scheduled" in warning and "at most 3 replicas of 3" in warning
