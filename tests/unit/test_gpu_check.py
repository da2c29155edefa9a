"""tools/gpu-check's dry run: the plan for a lent GPU machine covers every GPU-marked test and benchmark.

The dry run itself checks the inputs (files, the benchmarks' flags against their --help, pytest
collecting the gpu tests); this runs it as a user does and reads the plan it prints.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
GPU_CHECK = REPO / "tools" / "gpu-check"


def gpu_marked_files() -> set[str]:
    marked = re.compile(r"pytest\.mark\.gpu\b")
    return {
        str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py") if marked.search(p.read_text())
    }


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    out = tmp_path_factory.mktemp("gpu-check")
    return subprocess.run(
        [sys.executable, str(GPU_CHECK), "--dry-run", "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=800,
    )  # fmt: skip


def test_the_dry_run_checks_its_inputs_and_finds_them_all(dry_run: subprocess.CompletedProcess[str]) -> None:
    assert dry_run.returncode == 0, dry_run.stdout + dry_run.stderr
    assert "inputs ok" in dry_run.stdout.splitlines()[-1]


def test_the_plan_runs_every_gpu_marked_test_file_with_pytest(
    dry_run: subprocess.CompletedProcess[str],
) -> None:
    planned = set(re.findall(r"-m pytest -m gpu .*? (tests/\S+\.py)", dry_run.stdout))
    assert gpu_marked_files() == planned
    assert len(planned) >= 3  # trainer, megatron, weight sync today


def test_the_plan_holds_the_three_benchmarks_and_fits_ten_minutes(
    dry_run: subprocess.CompletedProcess[str],
) -> None:
    steps = re.findall(r"^\s*\d+\. (\S+)\s+(\d+) s", dry_run.stdout, re.M)
    names = [name for name, _ in steps]
    assert names[0] == "preflight"
    assert {"bench-agent-cuda", "bench-weightsync-nccl", "bench-memory-7b"} <= set(names)
    assert sum(int(budget) for _, budget in steps) <= 600
    assert "--hidden 3584" in dry_run.stdout  # 7B-class width


def test_no_step_is_blocked_by_a_flag_its_script_lacks(dry_run: subprocess.CompletedProcess[str]) -> None:
    blocked = [line for line in dry_run.stdout.splitlines() if "[blocked" in line]
    assert not blocked, blocked  # bench-weightsync-nccl was, until bench_weightsync.py took --backend
    assert re.search(r"bench_weightsync\.py --backend nccl ", dry_run.stdout)
