"""A vLLM general plugin: the engine's processes die with the rollout that started them, and on CPU they
do not spin while they wait for each other.

vLLM's front end (the rollout process) spawns the EngineCore process, which spawns the model-runner
worker(s). Neither watches its parent: when the rollout main was SIGKILLed alone (by the kernel's
PR_SET_PDEATHSIG when the local runner or a benchmark driver died, by an OOM kill, by hand), its
``VLLM::EngineCore`` and ``VLLM::Worker`` lived on as orphans - one spun at 40% of a core for 50
minutes on the benchmark machine. In a pod the container runtime reaps them with the pod; outside
one nothing did.

vLLM runs every ``vllm.general_plugins`` entry point once in each of its processes
(``vllm.plugins.load_general_plugins``: the front end, EngineCore.__init__ before it starts its
workers, each worker), and on CPU it spawns them (fresh interpreters, so they load plugins again).
``RolloutEngine.start`` sets ``ASYNCRL_ENGINE_PARENT`` to the rollout's pid while it starts the
engine. A process spawned by ``multiprocessing`` from exactly that pid is a vLLM child: it asks the
kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG), then names itself as the parent its own
children (the workers) must not outlive. If the parent already died before that (the race between
spawn and the plugin), the process ends itself at once. Any other process that merely inherited the
variable (the rollout itself, a trainer or test started later from the same shell) is left alone.

PR_SET_PDEATHSIG follows the parent *thread* that spawned the child: ``RolloutEngine.start`` sets the
variable only when called on the main thread (the rollout's ``asyncio.run``), and vLLM's EngineCore
starts its workers from its main thread. Linux only; elsewhere the plugin does nothing. Where vLLM
forks instead of spawning (``VLLM_WORKER_MULTIPROC_METHOD=fork`` on a GPU whose parent has not touched
CUDA), the child inherits vLLM's "plugins loaded" flag and this does not run again: there the pod's
runtime (or the local runner's process-group kill) is what reaps the engine.

Idle spin (CPU engines only). On CPU vLLM always runs its model in a worker process apart from the
EngineCore (``platforms/cpu.py``: the MP executor), and the two pass every step through a shared-memory
ring (``shm_broadcast.MessageQueue``) whose reader, for ``SpinCondition.busy_loop_s`` (1 s) after each
read, waits by looping on ``sched_yield`` instead of sleeping on the writer's zmq notification. So the
EngineCore spins while the worker runs the forward, and the worker spins while the EngineCore schedules
and while no request is in flight - on the one core a local rollout (and a CPU pod's small CPU request)
has for its front end, EngineCore and worker together, where every spun cycle is one the front end (the
gateway's HTTP server, the agent loop) does not get. Here the readers of an asyncrl rollout's CPU engine
spin ``ASYNCRL_VLLM_BUSY_LOOP_S`` (default 0; vLLM's own 1 s when set to 1) and then sleep in the poll for
the writer's notification, which it sends on every write (``MessageQueue.enqueue``): the wake-up costs
~0.1 ms against steps of milliseconds. The poll is cut into 1 ms slices while steps flow (50 ms when idle):
zmq drops a notification sent before a reader's SUB socket has joined, and without the slices such a
read waited out its whole timeout. Measured on one core, waves of 32 eight-token requests with 50 ms gaps
on the tiny model: the engine's CPU per request 4.55 and 4.02 ms with this against 5.41 and 4.97 ms
with vLLM's spin (two runs each). GPU engines keep vLLM's spin (their hosts have cores to spare, and a
GPU step is short enough for the wake-up to matter).
The patch is on ``SpinCondition.wait``, looked up per call, so readers built before the plugin ran (the
worker's broadcast queue is) get it too.

Exit without the final collection. Both engine processes spent their last seconds in the interpreter's
final cyclic garbage collection over the heap torch, transformers and vLLM leave (py-spy: gc_collect_main
with no Python frame): the worker ~3 s after its parent asked it to exit, the EngineCore past the 5 s its
client waits before it kills it, so every engine shutdown took 5.0 s, and with it every rollout's stop
(a pod's termination, the end of an ``asyncrl run``, every test's engine teardown). An atexit hook freezes
the heap first (``gc.freeze``: the final collection skips frozen objects; vLLM does the same on ROCm): the
process exits with what refcounting frees, and the OS reclaims the rest (the shared-memory rings are
unlinked by vLLM's own shutdown before, not by a collector). Measured on the tiny model: an engine's
shutdown 5.0 s -> 1.5 s, /dev/shm as before. What the interpreter still writes after the last atexit hook
goes to /dev/null: with the collection skipped, triton's nanobind bindings (imported, unused on CPU)
print ~30 lines of "leaked instances/types/functions" at teardown, which would read as an error in every
rollout's log; everything before (vLLM's own shutdown lines included) is written as before.
"""

from __future__ import annotations

import atexit
import gc
import multiprocessing
import os
import signal
import sys
import time

from asyncrl_workloads.local import process

PARENT_ENV = "ASYNCRL_ENGINE_PARENT"
BUSY_LOOP_ENV = "ASYNCRL_VLLM_BUSY_LOOP_S"
BUSY_POLL_MS = 1
"""The longest a reader sleeps in one poll while steps flow (the writer's notification wakes it sooner)."""
IDLE_AFTER_S = 1.0
IDLE_POLL_MS = 50
"""... and after IDLE_AFTER_S without a read (no request in flight): 20 wake-ups a second while idle."""


def die_with_parent() -> None:
    """The entry point vLLM calls (``[project.entry-points."vllm.general_plugins"]``)."""
    parent = os.environ.get(PARENT_ENV, "")
    spawner = multiprocessing.parent_process()
    if not parent.isdigit() or spawner is None or spawner.pid != int(parent):
        return  # not an engine process of an asyncrl rollout
    quiet_idle_readers()
    atexit.register(exit_without_final_collection)
    if not process.kill_on_parent_death():
        return  # not Linux, or the kernel refused: nothing else to do (the pod still reaps it)
    if os.getppid() != int(parent):
        os.kill(os.getpid(), signal.SIGKILL)  # the parent died before we asked: an orphan already
    os.environ[PARENT_ENV] = str(os.getpid())


def exit_without_final_collection() -> None:
    """The engine process's last atexit hook (registered first): freeze the heap so that the interpreter's
    final collection skips it, then send what finalization still writes to stderr to /dev/null (module
    docstring)."""
    gc.freeze()
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)


def quiet_idle_readers() -> None:
    """On a CPU engine, its shared-memory readers spin ``ASYNCRL_VLLM_BUSY_LOOP_S`` (default 0) after a
    read instead of vLLM's 1 s before they sleep on the writer's notification (module docstring)."""
    from vllm.distributed.device_communicators import shm_broadcast
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or getattr(shm_broadcast.SpinCondition.wait, "asyncrl", False):
        return
    busy = float(os.environ.get(BUSY_LOOP_ENV, "0"))
    wait = shm_broadcast.SpinCondition.wait

    def quiet_wait(self: shm_broadcast.SpinCondition, timeout_ms: int | None = None) -> None:
        if not self.is_reader:
            return wait(self, timeout_ms)
        self.busy_loop_s = busy
        # a notification sent before the reader's SUB socket joined is lost (zmq's slow joiner): poll
        # in short slices so such a write waits a millisecond, not the read's whole timeout
        idle = time.monotonic() - self.last_read > IDLE_AFTER_S
        cap = IDLE_POLL_MS if idle else BUSY_POLL_MS
        return wait(self, cap if timeout_ms is None else min(timeout_ms, cap))

    quiet_wait.asyncrl = True  # type: ignore[attr-defined]
    shm_broadcast.SpinCondition.wait = quiet_wait  # type: ignore[method-assign]
