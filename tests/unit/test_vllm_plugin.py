"""rollout/vllm_plugin.py on real processes (no vLLM): a child that ran the plugin dies with its parent.

The children are spawned with ``multiprocessing`` (as vLLM spawns its EngineCore and workers on CPU).
The end-to-end proof with vLLM's own processes is tests/dataplane/test_rollout.py
(test_vllm_engine_processes_die_with_a_sigkilled_rollout).
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from asyncrl_testing import procfs
from asyncrl_workloads.rollout import vllm_plugin

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")

# The "engine core": runs the plugin as vLLM would (after ``delay`` s), reports what it ended up with.
CHILD = """
import ctypes, os, time
from asyncrl_workloads.rollout import vllm_plugin as p

def main(delay):
    time.sleep(delay)
    p.die_with_parent()
    sig = ctypes.c_int()
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
    print(sig.value, os.environ.get(p.PARENT_ENV), flush=True)
    time.sleep(60)
"""
# The "rollout": names ``parent`` as the engine's parent, spawns the child, prints its pid; then waits,
# or (``leave``) exits at once without joining it.
PARENT = """
import multiprocessing, os, sys, time
sys.path.insert(0, {tmp!r})
import engine_child
if __name__ == "__main__":
    os.environ[{env!r}] = {parent}
    child = multiprocessing.get_context("spawn").Process(target=engine_child.main, args=({delay},))
    child.start()
    print(child.pid, flush=True)
    os._exit(0) if {leave} else time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        return procfs.stat_fields(pid)[0] != "Z"
    except FileNotFoundError:
        return False


def start(
    tmp: pathlib.Path, parent: str, delay: float = 0.0, leave: bool = False
) -> tuple[subprocess.Popen[str], int]:
    (tmp / "engine_child.py").write_text(CHILD)
    code = PARENT.format(tmp=str(tmp), env=vllm_plugin.PARENT_ENV, parent=parent, delay=delay, leave=leave)
    (tmp / "parent.py").write_text(code)
    proc = subprocess.Popen([sys.executable, str(tmp / "parent.py")], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def wait_gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def cleanup(proc: subprocess.Popen[str], child: int) -> None:
    proc.kill()
    proc.wait()
    if alive(child):
        os.kill(child, signal.SIGKILL)


def test_an_engine_child_dies_with_its_parent_and_names_itself_parent_of_its_own(tmp_path) -> None:
    proc, child = start(tmp_path, "str(os.getpid())")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split() == [str(int(signal.SIGKILL)), str(child)]
        proc.kill()
        proc.wait()
        assert wait_gone(child), "the child outlived its SIGKILLed parent"
    finally:
        cleanup(proc, child)


def test_an_engine_child_whose_parent_is_already_gone_ends_itself(tmp_path) -> None:
    proc, child = start(tmp_path, "str(os.getpid())", delay=1.0, leave=True)  # gone before the plugin runs
    try:
        assert wait_gone(child), "the orphan did not end itself"
    finally:
        cleanup(proc, child)


def test_a_process_that_only_inherited_the_variable_is_left_alone(tmp_path) -> None:
    # The variable names the test runner: the spawned child's parent is another process, so it is no
    # engine of that rollout (a trainer started from a shell that once ran an engine, say).
    proc, child = start(tmp_path, repr(str(os.getpid())))
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split() == ["0", str(os.getpid())]
        assert alive(child)
    finally:
        cleanup(proc, child)


def test_a_cpu_engines_idle_reader_sleeps_in_short_polls_instead_of_spinning() -> None:
    """vLLM's SpinCondition (a real one, on a real zmq SUB socket nobody publishes to): patched, a reader
    spins 0 s and polls in slices, so a read with no timeout comes back within the idle slice (the loop
    around it checks the ring again); vLLM's own wait would block in the poll until a notification."""
    import threading

    import zmq
    from vllm.distributed.device_communicators import shm_broadcast
    from vllm.utils.network_utils import get_open_zmq_ipc_path

    context = zmq.Context()
    cond = shm_broadcast.SpinCondition(True, context, get_open_zmq_ipc_path())
    original = shm_broadcast.SpinCondition.wait
    try:
        vllm_plugin.quiet_idle_readers()
        assert shm_broadcast.SpinCondition.wait is not original
        cond.last_read = time.monotonic() - 10  # idle: vLLM's wait would poll with no timeout
        returned = threading.Event()
        threading.Thread(target=lambda: (cond.wait(None), returned.set()), daemon=True).start()
        assert returned.wait(2.0) and cond.busy_loop_s == 0
    finally:
        shm_broadcast.SpinCondition.wait = original  # type: ignore[method-assign]
        cond.cancel()
        context.destroy(linger=0)


EXIT_HOOK = """
import atexit, sys
from asyncrl_workloads.rollout import vllm_plugin
if sys.argv[1] == "hook":
    atexit.register(vllm_plugin.exit_without_final_collection)

class Cycle:
    def __del__(self):
        print("collected at exit", flush=True)  # only the interpreter's final collection frees a cycle

c = Cycle()
c.me = c
del c
atexit.register(lambda: print("written at exit", file=sys.stderr, flush=True))  # runs before the hook
"""


@pytest.mark.parametrize("hook", [True, False])
def test_an_engine_process_exits_without_the_final_collection(hook: bool) -> None:
    """vllm_plugin.exit_without_final_collection: the interpreter's last cyclic collection (3-5 s of an
    engine process's exit on vLLM's heap) is skipped, and what teardown writes after the hook is dropped,
    while what atexit hooks registered later (vLLM's own) write still arrives."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", EXIT_HOOK, "hook" if hook else "none"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "written at exit" in out.stderr
    assert ("collected at exit" in out.stdout) is not hook, out.stdout
