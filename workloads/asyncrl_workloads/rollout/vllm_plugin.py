"""A vLLM general plugin: the engine's processes die with the rollout that started them.

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
"""

from __future__ import annotations

import multiprocessing
import os
import signal

from asyncrl_workloads.local import process

PARENT_ENV = "ASYNCRL_ENGINE_PARENT"


def die_with_parent() -> None:
    """The entry point vLLM calls (``[project.entry-points."vllm.general_plugins"]``)."""
    parent = os.environ.get(PARENT_ENV, "")
    spawner = multiprocessing.parent_process()
    if not parent.isdigit() or spawner is None or spawner.pid != int(parent):
        return  # not an engine process of an asyncrl rollout
    if not process.kill_on_parent_death():
        return  # not Linux, or the kernel refused: nothing else to do (the pod still reaps it)
    if os.getppid() != int(parent):
        os.kill(os.getpid(), signal.SIGKILL)  # the parent died before we asked: an orphan already
    os.environ[PARENT_ENV] = str(os.getpid())
