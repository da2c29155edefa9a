"""rollout/vllm_plugin.py on real processes (no vLLM): a child that ran the plugin dies with its parent.

The end-to-end proof with vLLM's own processes is tests/dataplane/test_rollout.py
(test_vllm_engine_processes_die_with_a_sigkilled_rollout).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from asyncrl_workloads.rollout import vllm_plugin

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")

# The "engine core": runs the plugin as vLLM would, prints the parent it will name to its own children.
CHILD = (
    "import os, time; from asyncrl_workloads.rollout import vllm_plugin as p; p.die_with_parent(); "
    "print(os.environ.get(p.PARENT_ENV), flush=True); time.sleep(60)"
)
# The "rollout": names itself the engine's parent, starts the child, prints its pid, waits.
PARENT = (
    "import os, subprocess, sys, time; os.environ[{env!r}] = {parent}; "
    "c = subprocess.Popen([sys.executable, '-c', {child!r}]); print(c.pid, flush=True); time.sleep(60)"
)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def start(parent_pid_expr: str) -> tuple[subprocess.Popen[str], int]:
    code = PARENT.format(env=vllm_plugin.PARENT_ENV, parent=parent_pid_expr, child=CHILD)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def wait_gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def test_a_child_that_ran_the_plugin_dies_with_its_parent_and_names_itself_parent() -> None:
    proc, child = start("str(os.getpid())")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == str(child)  # its own children will follow it
        assert alive(child)
        proc.kill()
        proc.wait()
        assert wait_gone(child), "the child outlived its SIGKILLed parent"
    finally:
        proc.kill()
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_child_whose_parent_is_already_gone_ends_itself() -> None:
    # The variable names a pid that is not the child's parent: as if the parent died before the plugin ran.
    proc, child = start("'1'")
    try:
        assert wait_gone(child), "the orphan did not end itself"
    finally:
        proc.kill()
        proc.wait()
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_without_the_variable_nothing_changes() -> None:
    env = {k: v for k, v in os.environ.items() if k != vllm_plugin.PARENT_ENV}
    code = (
        "import ctypes, os; from asyncrl_workloads.rollout import vllm_plugin as p; p.die_with_parent(); "
        "sig = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(sig)); print(sig.value, os.getpid())"
    )  # prctl(PR_GET_PDEATHSIG)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "0"
