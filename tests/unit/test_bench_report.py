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


def _memory_row(mode: str, peak: int, step_s: float | None) -> dict[str, object]:
    kinds = {"Parameter": 2**30, "Gradient": 0, "Optstate": 2**31, "Activation": 2**29, "Temp": 2**28}
    return {"tokens": 4096, "setting": "all on", "mode": mode, "peak_bytes": peak, "kinds": kinds,
            "step_s": step_s, "bound_bytes": 2**31, "ratio": peak / 2**31}  # fmt: skip


def test_the_memory_section_has_a_row_per_run_the_cross_check_and_the_lora_ratios() -> None:
    settings = {"off": {"logprob_chunk_tokens": 0}, "all on": {"logprob_chunk_tokens": 1024}}
    shape = {
        "vocab": 151936,
        "hidden": 768,
        "layers": 12,
        "heads": 12,
        "kv_heads": 4,
        "head_dim": 64,
        "mlp": 2048,
    }
    runs = [_memory_row("fake", 3 * 2**30, None), _memory_row("real", 3 * 2**30 + 2**20, 61.25)]
    result = {"params": 192_200_000, "shape": shape, "settings": settings, "rows": runs}
    lora = [
        {"payload": "full", "bytes": 100 * 2**20, "syncs": 5, "transfer_ms": 400.0, "round_ms": 500.0},
        {"payload": "lora", "bytes": 2 * 2**20, "syncs": 5, "transfer_ms": 10.0, "round_ms": 50.0},
        {"payload": "lora / full", "bytes": 0.02, "transfer_ms": 0.025, "round_ms": 0.1},
    ]
    lines = bench_report.memory_section(result, lora)
    assert lines[0] == "## Trainer memory and scale"
    assert "**192.2M parameters**" in lines[2] and "1024-token chunks" in lines[2]
    rows = [line for line in lines if line.startswith("| 4096 ")]
    assert rows == [
        "| 4096 | all on | fake | 3.00 | 2.00 | **1.50** | 1.00 / 2.00 / 0.50 / 0.25 | not timed (fake) |",
        "| 4096 | all on | real | 3.00 | 2.00 | **1.50** | 1.00 / 2.00 / 0.50 / 0.25 | 61.2 |",
    ]
    check = next(line for line in lines if line.startswith("Cross-check"))
    assert "(fake ÷ real 0.9997)" in check
    assert lines[-1].endswith("whole round 50.0 ms ÷ 500.0 ms = **0.100** (goal ≤ 0.05).")
    assert "payload 2.0 MiB ÷ 100.0 MiB = **0.0200**; transfer 10.0 ms ÷ 400.0 ms = **0.025**" in lines[-1]


def test_the_gateway_job_row_has_the_ratio_the_trainers_wait_and_where_the_cpu_goes() -> None:
    def side(rate: float, wait: float, cpu: dict[str, float]) -> dict[str, object]:
        return {"samples_per_s": rate, "wait_per_step_s": wait, "cpu_ms_per_sample": cpu}

    rounds = [
        {"ratio": 0.6, "sides": {"agent": side(50.0, 0.3, {"engine": 5.0}), "gateway": side(30.0, 2.1, {})}},
        {"ratio": 0.4, "sides": {"gateway": side(20.0, 3.0, {"agent": 9.5, "nats": 0.1}),
                                 "agent": side(50.0, 0.4, {"engine": 5.2})}},
    ]  # fmt: skip
    res = {"ratio": 0.5, "rounds": rounds, "settings": {"steps": 25, "skip": 5}}
    (row, parts) = bench_report._gateway_job_rows(res)
    assert row[0] == "Gateway job" and row[2].startswith("**0.5** = median of 2 rounds (0.6, 0.4;")
    assert "gateway 30.0/s, trainer wait 2.1 s/step" in row[2] and row[4] == "**pass**"
    assert parts[2] == "CPU ms per trained sample by role (last round): gateway: agent 9.5; agent: engine 5.2"
    assert bench_report._gateway_job_rows(None)[0][3] == "≥ 0.5"
