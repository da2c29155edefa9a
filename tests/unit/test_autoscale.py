"""The elastic-rollout decision (asyncrl_api/autoscale.py) on recorded signal traces: a starved trainer
scales up by at most maxStep per window, a blocked fleet scales down one at a time, noise inside the
stabilisation windows changes nothing, min/max always hold, and nothing moves until every replica is
ready and a window of reports since the last change was seen."""

from __future__ import annotations

import dataclasses

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
    """Feed the samples one report at a time, as the operator does (``History``), applying each change
    at once; a sample's ready count is capped at the replicas asked for."""
    history, decisions = autoscale.History(), []
    for sample in samples:
        history.add(dataclasses.replace(sample, ready_replicas=min(sample.ready_replicas, replicas)))
        d = history.decide(s, replicas, sample.at)
        history.applied(s, replicas, d, sample.at)
        replicas = d.replicas
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


def run_fleet(
    s: autoscale.AutoscaleSpec,
    replicas: int,
    rate_of: dict[int, float],
    wait: float,
    seconds: int,
    reported: dict[int, float] | None = None,
) -> list[tuple[float, int, autoscale.Decision]]:
    """``run`` where the trainer consumes ``rate_of[replicas]`` samples/s (its cumulative count in each
    report) and reports ``reported[replicas]`` as its recent-steps samplesPerSecond (default: the same)."""
    history, out, consumed = autoscale.History(), [], 0.0
    for i in range(int(seconds / 10)):
        at = i * 10.0
        consumed += 10 * rate_of[replicas]
        rate = (reported or rate_of)[replicas]
        history.add(Signals(at, wait, 0.0, replicas, rate, int(consumed)))
        d = history.decide(s, replicas, at)
        history.applied(s, replicas, d, at)
        out.append((at, replicas, d))
        replicas = d.replicas
    return out


def test_a_scale_up_that_does_not_raise_consumed_samples_is_undone_and_not_tried_again_at_once() -> None:
    # the trainer waits, but a second replica slows it (they share cores): 470/s with 1, 375/s with 2
    s = spec(maxReplicas=2, scaleUpRetrySeconds=600)
    out = run_fleet(s, 1, {1: 470.0, 2: 375.0}, wait=0.3, seconds=1500)
    reasons = [d.reason for _, _, d in out]
    up = reasons.index("ScaleUp")
    undone = reasons.index("ScaleUpUndone")
    assert out[up][2].replicas == 2 and out[up][2].baseline == 470.0
    assert set(reasons[up + 1 : undone]) == {"Judging"}  # a whole up window with both replicas ready
    assert out[undone][0] - out[up][0] >= 60
    d = out[undone][2]
    assert d.replicas == 1 and "375.0 with 2 replicas against 470.0 with 1" in d.message
    # held at 1 for scaleUpRetrySeconds although the trainer still waits, then tried again
    held = [(at, d) for at, _, d in out if out[undone][0] < at < out[undone][0] + 600]
    assert held and {d.reason for _, d in held} <= {"AtCeiling", "NoSignals"}
    assert {d.replicas for _, d in held} == {1}
    assert "held at 1" in held[-1][1].message
    again = [at for at, _, d in out if d.reason == "ScaleUp" and at > out[undone][0]]
    assert again and again[0] >= out[undone][0] + 600


def test_a_scale_up_that_pays_is_kept_and_the_fleet_grows_on() -> None:
    s = spec(maxReplicas=3)
    out = run_fleet(s, 1, {1: 100.0, 2: 190.0, 3: 270.0}, wait=0.5, seconds=600)
    assert [d.replicas for _, _, d in out if d.reason == "ScaleUp"] == [2, 3]
    assert "ScaleUpUndone" not in {d.reason for _, _, d in out}
    kept = [d for _, _, d in out if d.judged == "kept"]
    assert len(kept) == 2 and "the scale-up to 2 is kept" in kept[0].message
    # a gain below minScaleUpGain is undone; null turns the probation off (HPA's behaviour)
    small = run_fleet(spec(maxReplicas=2, minScaleUpGain=0.1), 1, {1: 100.0, 2: 105.0}, 0.5, 300)
    assert "ScaleUpUndone" in {d.reason for _, _, d in small}
    off = run_fleet(spec(maxReplicas=2, minScaleUpGain=None), 1, {1: 100.0, 2: 50.0}, 0.5, 300)
    assert {d.reason for _, _, d in off} >= {"ScaleUp"} and "ScaleUpUndone" not in {
        d.reason for _, _, d in off
    }
    assert off[-1][2].replicas == 2
    # the trainer's own samplesPerSecond covers its last steps, which after a change may still be steps
    # from before it (long steps): the cumulative count decides, so a scale-up that pays is kept
    lagging = run_fleet(spec(maxReplicas=2), 1, {1: 100.0, 2: 190.0}, 0.5, 300, reported={1: 100.0, 2: 100.0})
    assert "ScaleUpUndone" not in {d.reason for _, _, d in lagging} and lagging[-1][2].replicas == 2
    # a trainer that does not report samples/s (an older image): nothing to judge, the scale-up stays
    blind = run(spec(maxReplicas=2), 1, trace([(0.6, 0.0)] * 30, ready=2))
    assert blind[-1].replicas == 2 and "ScaleUpUndone" not in {d.reason for d in blind}


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
