"""One job's pods as local processes, for the e2e tests that hit single "pods" with signals
(tests/e2e/test_faults.py, tests/e2e/test_rollouts_first.py).

Each process is started as its pod starts it (``python -m asyncrl_workloads.entrypoints.<role>
--config job.json``, identity from env) in a process group of its own, so a signal reaches the whole
"pod" (a rollout's vLLM engine processes too). A real nats-server and the seeded tiny model come with
the job; the trainer writes its step log, which the tests read. With ``nats_credentials`` the job's bus is
an external nats-server that requires credentials (operator mode, asyncrl_testing.natsauth), named as
``bus.nats`` {managed: false, url, credentialsSecret}, and every process presents a user's ``.creds`` file
through ``ASYNCRL_NATS_CREDS``, as a pod presents the Secret the operator mounts.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

from asyncrl_api import config
from asyncrl_workloads import tinymodel
from asyncrl_workloads.local import natsserver, process

from asyncrl_testing import jobs, natsauth, netfaults, procfs

REPO = pathlib.Path(__file__).resolve().parents[2]
Steps = list[dict[str, Any]]
STOP_GRACE_S = 10.0
"""Seconds ``LocalJob.stop`` gives all the job's processes together to exit on SIGTERM."""
SNAPSHOTS_S = (90.0, 240.0)
"""Seconds into a wait at which ``LocalJob.wait`` records what every process is doing."""


class LocalJob:
    """The processes of one job, its nats-server and the trainer's step log."""

    def __init__(
        self, tmp: pathlib.Path, name: str, spec: dict[str, Any], nats_credentials: bool = False
    ) -> None:
        """``spec``: merged over ``jobs.BASE_SPEC`` (the model path is filled in)."""
        self.tmp = tmp
        model = tinymodel.create_tiny_model(tmp / "model", seed=0)
        self.creds: pathlib.Path | None = None
        server_config = None
        if nats_credentials:
            auth = natsauth.Operator.create()
            account = auth.account("asyncrl")
            server_config = tmp / "nats-server.conf"
            server_config.write_text(auth.server_config([account]))
            self.creds = account.user(name).write_creds(tmp / "user.creds")
        self.nats = natsserver.start(
            store_dir=tmp / "nats", log_path=tmp / "nats.log", config_file=server_config
        )
        patch: dict[str, Any] = {"model": {"path": str(model)}}
        if nats_credentials:
            external = {"managed": False, "url": self.nats.url, "credentialsSecret": "nats-creds"}
            patch["bus"] = {"nats": external}
        full = jobs.deep_merge(jobs.BASE_SPEC, jobs.deep_merge(spec, patch))
        cfg = config.JobConfig(
            name=name, namespace="test", spec=full,
            endpoints=config.Endpoints(
                nats_url=self.nats.url, trainer_host="127.0.0.1",
                weight_sync_port=process.free_port(), torch_master_port=process.free_port(),
            ),
        )  # fmt: skip
        self.config = tmp / "job.json"
        self.config.write_text(config.dumps(cfg))
        self.steps_path = tmp / "steps.jsonl"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.metrics_ports: dict[str, int] = {}
        """Each process's /metrics port, by name (a restarted process gets a new one)."""

    def start(self, name: str, replica: int | None = None) -> None:
        """Start the trainer (``replica`` None) or rollout ``replica`` as process ``name``."""
        role = "trainer" if replica is None else "rollout"
        env = {
            **os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in ("operator", "workloads", "tools")),
            "ASYNCRL_ROLE": role, "ASYNCRL_METRICS_PORT": str(process.free_port()),
        }  # fmt: skip
        self.metrics_ports[name] = int(env["ASYNCRL_METRICS_PORT"])
        if self.creds is not None:
            env[config.NATS_CREDS_ENV] = str(self.creds)
        cpus = None
        if replica is None:
            env["ASYNCRL_STEP_LOG"] = str(self.steps_path)
        else:
            env["ASYNCRL_REPLICA"] = str(replica)
            cpus = process.rollout_cpus(replica)  # a core per rollout, as pods get their own CPUs
            env.update(process.engine_core_env(cpus))
        with (self.tmp / f"{name}.log").open("a") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", f"asyncrl_workloads.entrypoints.{role}", "--config", str(self.config)],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=process.child_setup(False, cpus),
            )  # fmt: skip

    def signal(self, name: str, sig: int) -> None:
        os.killpg(self.procs[name].pid, sig)  # the whole "pod": the process and its vLLM engine

    def crash_bus(self, outage_s: float, keep_store: bool = True) -> None:
        """SIGKILL the job's nats-server and start it again ``outage_s`` later on the same port, on the
        same JetStream store (a NATS pod the kubelet restarts, its store on a volume) or, without
        ``keep_store``, on an empty one (an emptyDir NATS pod replaced)."""
        store = self.tmp / "nats" if keep_store else self.tmp / f"nats-empty-{time.monotonic_ns()}"
        self.nats = netfaults.crash_nats(self.nats, outage_s, store, self.tmp / "nats-restarted.log")

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def steps(self) -> Steps:
        if not self.steps_path.exists():
            return []
        return [json.loads(line) for line in self.steps_path.read_text().splitlines() if line.endswith("}")]

    def stream_messages(self) -> int:
        """Samples waiting in the job's stream (nats-server's monitoring endpoint)."""
        url = f"http://127.0.0.1:{self.nats.monitor_port}/jsz"
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(json.load(response).get("messages", 0))

    def wait(
        self, what: str, check: Callable[[Steps], Any], timeout: float, alive: Iterable[str] | None = None
    ) -> Any:
        """Poll ``check(steps)`` until it returns something truthy; the processes named in ``alive``
        (default: all started) must not exit meanwhile.

        A wait still going after each of ``SNAPSHOTS_S`` seconds records ``diagnose()`` into
        ``snapshots.txt`` in the job's directory (and into the failure message): a stall that ends
        before the timeout still leaves what the processes were doing."""
        start = time.monotonic()
        deadline = start + timeout
        names = list(self.procs) if alive is None else list(alive)
        pending = [s for s in SNAPSHOTS_S if s < timeout]
        snapshots: list[str] = []
        while time.monotonic() < deadline:
            if pending and time.monotonic() - start > pending[0]:
                snapshots.append(f"=== {what}: still waiting after {pending.pop(0)} s\n{self.diagnose()}")
                with (self.tmp / "snapshots.txt").open("a") as out:
                    out.write(snapshots[-1] + "\n")
            for name in names:
                code = self.procs[name].poll()
                assert code is None, f"{name} exited ({code}) waiting for {what}: {self.log(name)[-3000:]}"
            found = check(self.steps())
            if found:
                return found
            time.sleep(0.5)
        last = [
            {k: v for k, v in step.items() if k not in ("ids", "staleness")} for step in self.steps()[-1:]
        ]
        earlier = "\n".join(snapshots)
        raise AssertionError(f"timed out waiting for {what}; last step: {last}\n{earlier}\n{self.diagnose()}")

    def diagnose(self) -> str:
        """What every process of the job is doing: exit code, or the state and kernel wait channel of
        each process in its group, a Python stack dump (py-spy, when installed) and its log's tail.
        For a failed wait: a process that hangs silently otherwise leaves nothing to go on."""
        out = []
        for name, proc in self.procs.items():
            code = proc.poll()
            out.append(f"--- {name} (pid {proc.pid}): {'running' if code is None else f'exited {code}'}")
            if code is None:
                out.extend(_group_states(proc.pid))
                out.append(_py_spy_dump(proc.pid))
                out.append(_kernel_stack(proc.pid))
            log_text = self.log(name) if (self.tmp / f"{name}.log").exists() else "(no log)"
            out.append(f"log: {len(log_text)} chars; last lines:\n" + "\n".join(log_text.splitlines()[-12:]))
        out.append(_busiest())
        return "\n".join(out)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM every "pod", then SIGKILL what is left of each group after ``grace_s`` in all (the
        tests' teardown: no test checks a graceful stop through here; 30 s per process cost CI ~2 min)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                for sig in (signal.SIGCONT, signal.SIGTERM):
                    os.killpg(proc.pid, sig)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # leftovers of the group (vLLM engine processes)
        self.nats.stop()


def _group_states(pgid: int) -> list[str]:
    """Per process in group ``pgid`` (from /proc): state, CPU seconds used, context switches (a
    starved process has few and little CPU; a spinning one much CPU), allowed CPUs, wait channel."""
    lines = []
    for pid in pathlib.Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = procfs.stat_fields(pid.name)
            if int(fields[2]) != pgid:
                continue
            status = dict(
                line.split(":", 1) for line in (pid / "status").read_text().splitlines() if ":" in line
            )
            switches = (
                f"{status['voluntary_ctxt_switches'].strip()}/{status['nonvoluntary_ctxt_switches'].strip()}"
            )
            cmd = procfs.cmdline(pid.name)
            lines.append(
                f"  pid {pid.name} state {fields[0]} cpu {procfs.cpu_seconds(pid.name, fields):.1f}s threads"
                f" {status['Threads'].strip()} ctxsw vol/invol {switches} cpus"
                f" {status['Cpus_allowed_list'].strip()} wchan {(pid / 'wchan').read_text() or '-'} {cmd}"
            )
    return lines or [f"  (no process in group {pgid})"]


def _kernel_stack(pid: int) -> str:
    try:
        return "  kernel stack:\n" + pathlib.Path(f"/proc/{pid}/stack").read_text()[-1500:]
    except OSError as exc:
        return f"  (no kernel stack: {exc})"


def _busiest(interval: float = 2.0, top: int = 12) -> str:
    """The load average and the processes on the whole machine that used the most CPU over ``interval``
    seconds: what else competes for the cores (an orphan of an earlier test, a busy server)."""

    def sample() -> dict[str, tuple[float, str]]:
        seen = {}
        for pid in pathlib.Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                seen[pid.name] = (procfs.cpu_seconds(pid.name), procfs.cmdline(pid.name, 100))
        return seen

    before = sample()
    time.sleep(interval)
    after = sample()
    used = sorted(
        ((cpu - before.get(pid, (cpu, ""))[0], cpu, pid, cmd) for pid, (cpu, cmd) in after.items()),
        reverse=True,
    )
    lines = [
        f"--- machine: load {pathlib.Path('/proc/loadavg').read_text().strip()}; {_pressure()}",
        f"busiest over {interval} s:",
    ]
    lines += [
        f"  {d / interval:5.0%} of a core (total {c:.0f}s) pid {p} {cmd}" for d, c, p, cmd in used[:top]
    ]
    return "\n".join(lines)


def _py_spy_dump(pid: int) -> str:
    spy = shutil.which("py-spy") or str(pathlib.Path(sys.executable).with_name("py-spy"))
    if not os.path.exists(spy):
        return "  (py-spy not installed: no stack dump)"
    try:
        done = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "  (py-spy dump timed out)\n" + _gdb_stacks(pid)
    return (done.stdout + done.stderr)[-4000:]


def _pressure() -> str:
    """MemAvailable and the kernel's pressure stall averages (share of the last 10 s in which some task
    waited for CPU, memory or I/O): a process starved by reclaim looks busy but makes no progress."""
    parts = []
    with contextlib.suppress(OSError, StopIteration):
        meminfo = pathlib.Path("/proc/meminfo").read_text().splitlines()
        parts.append(" ".join(next(line for line in meminfo if line.startswith("MemAvailable")).split()))
    for kind in ("cpu", "memory", "io"):
        with contextlib.suppress(OSError, IndexError):
            some = pathlib.Path(f"/proc/pressure/{kind}").read_text().split()[1]  # "avg10=12.34"
            parts.append(f"{kind} pressure {some}")
    return ", ".join(parts)


def _gdb_stacks(pid: int) -> str:
    """Native stacks of every thread, for when py-spy cannot read the interpreter (e.g. a process
    spinning in a C extension's initializer during import)."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "  (no gdb: no native stacks)"
    try:
        done = subprocess.run(
            [gdb, "-q", "-p", str(pid), "--batch", "-iex", "set auto-load off",
             "-ex", "thread apply all bt 25"],
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "  (gdb timed out)"
    return "  native stacks (gdb):\n" + done.stdout[-6000:]


def syncs(steps: Steps) -> Steps:
    return [s["sync"] for s in steps if s.get("sync")]


def synced_with(members: set[str], after_version: int = 0) -> Callable[[Steps], Any]:
    """A sync after ``after_version`` whose members are exactly ``members``, each acking the trainer's
    checksum (a check for ``LocalJob.wait``)."""

    def check(steps: Steps) -> Any:
        for sync in syncs(steps):
            acked = {str(m) for m in sync.get("members", [])}
            if sync["version"] > after_version and acked == members:
                assert set(sync["checksums"]) == members
                assert all(c == sync["trainer_checksum"] for c in sync["checksums"].values())
                return sync
        return None

    return check
