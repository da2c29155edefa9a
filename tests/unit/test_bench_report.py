"""bench_report's verdicts: a median of paired ratios passes or misses only when its bootstrap
interval lies on one side of the goal."""

from __future__ import annotations

from asyncrl_testing import bench_report


def test_the_interval_of_identical_ratios_is_that_ratio() -> None:
    assert bench_report.median_ci([0.97] * 8) == (0.97, 0.97)


def test_verdicts_follow_the_interval_not_the_median_alone() -> None:
    assert bench_report._verdict_ci([0.96, 0.97, 0.98, 0.99, 1.0, 1.01], 0.95)[1] == "**pass**"
    assert bench_report._verdict_ci([0.85, 0.86, 0.87, 0.88, 0.9, 0.91], 0.95)[1] == "**miss**"
    # median 0.96 (above the goal), but the rounds straddle it widely
    straddling = [0.72, 0.8, 0.9, 0.96, 0.96, 1.02, 1.1, 1.3]
    text, verdict = bench_report._verdict_ci(straddling, 0.95)
    assert verdict == "**inconclusive**"
    lo, hi = (float(x) for x in text.rsplit(" ", 1)[1].split("–"))
    assert lo < 0.95 < hi


def test_the_interval_is_the_same_on_every_render() -> None:
    values = [0.91, 0.963, 0.972, 0.973, 0.833, 0.85]
    assert bench_report.median_ci(values) == bench_report.median_ci(values)
    lo, hi = bench_report.median_ci(values)
    assert min(values) <= lo <= sorted(values)[2] and sorted(values)[3] <= hi <= max(values)
