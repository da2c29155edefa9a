"""`asyncrl run JOB.yaml`: run an AsyncRLJob on this machine, with no cluster.

Called by `asyncrl_workloads.cli`. The operator's own `render(job)` decides what runs: the ConfigMap's
job.json and the trainer/rollout StatefulSets' containers become local processes (`pods.expand`), so
what runs here is exactly what the operator would create. Around them the runner provides what the
cluster would: an embedded nats-server (for `bus.nats.managed: true`), the tiny model when
`spec.model.create` asks for one, a run directory, restarts of a failed rollout (as the StatefulSet
controller would), live progress and a clean stop.

Run directory layout: job.yaml (the job as run), rendered.yaml (render's output), job.json (the config
with local endpoints), pods.json (argv/env of every process), logs/<pod>.log, nats/ (JetStream store),
steps.jsonl (trainer step log), progress.json (trainer progress report), metrics.jsonl (one record per
poll, see `progress`), validation.jsonl (with spec.data.validation: every validation sample, written by
the trainer, see trainer/validation.py), checkpoints/ (unless --keep-checkpoint-path), summary.json; for
a gateway job also gateway.json (mode 0600: the front URL, the replicas' URLs and the admin key, also
printed at start; see `gateway`). A gateway job's front URL, which spreads the agents' groups over the
rollout replicas as the gateway's Service does on a cluster, is served by the runner itself (`front`).

With --containers (`Options.containers`) each pod runs in its rendered image under podman or docker
instead (`containers`: the image, command, env, user and read-only root filesystem the pod would get,
host network, the run dir, model and checkpoint path mounted at the same paths); the rest is the same.

Local deviations from the job as written, all deliberate: trainer.checkpoint.path moves into the run
dir (so a new run starts fresh and re-running the same --run-dir resumes), --max-steps and
--rollout-replicas override spec fields before rendering, --mlflow URI sets spec.tracking.mlflow
(experiment: the job's name unless the spec names one). Ctrl-C or SIGTERM stops every process group
(SIGTERM, then SIGKILL after a grace period); children also die with the runner (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

import pydantic
import yaml
from asyncrl_api import models

from asyncrl_workloads import termination
from asyncrl_workloads.local import containers, elastic, front, gateway, natsserver, pods, process, progress

STOP_GRACE_S = 15.0
ROLLOUT_RESTARTS = 3
"""Restarts of one rollout before the run fails (the operator counts failurePolicy.maxRestarts instead)."""
RESTART_BACKOFF_S = 10.0
"""The kubelet's CrashLoopBackOff: 10 s before the first restart, doubling, at most 300 s."""
RESTART_BACKOFF_CAP_S = 300.0
CONFIG_ERROR_EXIT = 2  # the entry points' "bad config" code: restarting cannot help
LOCAL_ENV_DEFAULTS = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

RUN_FILE_ENVS = {
    "ASYNCRL_STEP_LOG": "steps.jsonl",
    "ASYNCRL_PROGRESS_FILE": "progress.json",
    "ASYNCRL_VALIDATION_LOG": "validation.jsonl",
}
"""Files in the run dir the trainer writes (the runner reads them): env var -> file name."""


class JobFileError(ValueError):
    """The job file cannot be read or does not validate; the message names the field."""


@dataclasses.dataclass
class Options:
    job_file: pathlib.Path
    run_dir: pathlib.Path | None = None
    max_steps: int | None = None
    rollout_replicas: int | None = None
    timeout_s: float | None = None
    poll_interval_s: float = 2.0
    keep_checkpoint_path: bool = False
    containers: bool = False  # run each pod in its image (`containers`) instead of as a local process
    mlflow: str | None = None
    """--mlflow URI: sets spec.tracking.mlflow.trackingURI (experiment: the job's name unless set)."""


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def load_job(options: Options, run_dir: pathlib.Path) -> tuple[models.AsyncRLJob, dict[str, Any]]:
    """Read, override (see module docstring) and validate the job; returns the model and the raw dict."""
    try:
        raw = yaml.safe_load(options.job_file.read_text())
    except OSError as exc:
        raise JobFileError(f"{options.job_file}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise JobFileError(f"{options.job_file}: not valid YAML ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("spec"), dict):
        raise JobFileError(f"{options.job_file}: expected an AsyncRLJob with a spec")
    raw.setdefault("metadata", {}).setdefault("namespace", "default")
    if not options.keep_checkpoint_path:
        _set(raw, ("spec", "trainer", "checkpoint", "path"), str((run_dir / "checkpoints").resolve()))
    if options.max_steps is not None:
        _set(raw, ("spec", "maxSteps"), options.max_steps)
    if options.rollout_replicas is not None:
        _set(raw, ("spec", "rollout", "replicas"), options.rollout_replicas)
    if options.mlflow is not None:
        _set(raw, ("spec", "tracking", "mlflow", "trackingURI"), options.mlflow)
        mlflow = raw["spec"]["tracking"]["mlflow"]
        mlflow.setdefault("experiment", str(raw["metadata"].get("name") or "asyncrl"))
    try:
        return models.AsyncRLJob.model_validate(raw), raw
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(job)'}: {e['msg']}" for e in exc.errors())
        raise JobFileError(f"{options.job_file}: {problems}") from None


def default_run_dir(job_file: pathlib.Path) -> pathlib.Path:
    return pathlib.Path("runs") / f"{job_file.stem}-{time.strftime('%Y%m%d-%H%M%S')}"


class Supervisor:
    """The job's local processes: started in role order, rollouts restarted, all stopped together.

    A rollout that exits (other than with the config error, exit 2) is restarted as the kubelet restarts a
    crashing container: after a back-off of 10 s, doubling to at most 300 s, up to ROLLOUT_RESTARTS times.
    Each process gets a termination-message file (``logs/<pod>.termination-log``, through
    ``termination.PATH_ENV``, the run dir being mounted at the same path in containers): what it wrote there
    (an endpoint's classified line before exit 3) is said the moment it exits, as ``kubectl describe``
    shows a container's last termination message, so the first failure already names the cause."""

    def __init__(
        self,
        local_pods: list[pods.LocalPod],
        base_env: dict[str, str],
        logs: pathlib.Path,
        say: Callable[[str], None],
        engine: containers.Engine | None = None,
        backoff_s: float = RESTART_BACKOFF_S,
    ) -> None:
        self.local_pods = local_pods
        self.base_env = base_env
        self.logs = logs
        self.say = say
        self.engine = engine  # None: local processes; else each pod in its image (base_env unused)
        self.backoff_s = backoff_s
        self.children: dict[str, process.Child] = {}
        self.restarts: dict[str, int] = dict.fromkeys((p.name for p in local_pods), 0)
        self.restart_at: dict[str, float] = {}
        """Pods waiting out their back-off: name -> time.monotonic() of the restart."""
        self.wanted_rollouts = 0
        """The rollout replicas asked for by scale_rollouts (spec.rollout.autoscale)."""
        self.parked: set[str] = set()
        """Rollout pods planned but not running (spec.rollout.autoscale: ordinals beyond the replicas
        asked for); a parked pod that is still stopping is not restarted."""

    def termination_log(self, pod: pods.LocalPod) -> pathlib.Path:
        return self.logs / f"{pod.name}.termination-log"

    def start(self, pod: pods.LocalPod) -> None:
        log = self.logs / f"{pod.name}.log"
        message = self.termination_log(pod)
        message.unlink(missing_ok=True)  # a new container starts with an empty message, as in a pod
        pod = dataclasses.replace(pod, env={**pod.env, termination.PATH_ENV: str(message)})
        if self.engine is not None:
            self.children[pod.name] = self.engine.start(pod, log)
            return
        env = {**self.base_env, **pod.env}
        if pod.role == pods.AGENT_ROLE:
            env["PATH"] = pods.agent_path(env)  # the CLIs tools/setup.sh installed, as in an agent image
        self.children[pod.name] = process.Child(pod.name, pod.argv, log, env=env, cpus=pod.cpus)

    def start_all(self) -> None:
        for pod in self.local_pods:
            if pod.name not in self.parked:
                self.start(pod)

    def running(self) -> list[pods.LocalPod]:
        """The pods started and not parked."""
        return [p for p in self.local_pods if p.name not in self.parked and p.name in self.children]

    def scale_rollouts(self, replicas: int) -> None:
        """Run rollout ordinals 0..replicas-1: start parked ones below, SIGTERM running ones above (the
        highest first, as a StatefulSet scales down); a stopped one is reaped by stop_all."""
        for pod in sorted((p for p in self.local_pods if p.role == "rollout"), key=lambda p: -p.replica):
            if pod.replica >= replicas and pod.name not in self.parked:
                self.parked.add(pod.name)
                self.restart_at.pop(pod.name, None)
                child = self.children.get(pod.name)
                if child is not None and child.poll() is None:
                    child.process.send_signal(signal.SIGTERM)
        self.wanted_rollouts = replicas
        self._unpark()

    def _unpark(self) -> None:
        """Start the parked rollouts below the replicas asked for (one still stopping from an earlier
        scale-down waits for a later check)."""
        for pod in self.local_pods:
            if pod.role != "rollout" or pod.name not in self.parked or pod.replica >= self.wanted_rollouts:
                continue
            child = self.children.get(pod.name)
            if child is not None and child.poll() is None:
                continue
            self.parked.discard(pod.name)
            self.restarts[pod.name] = 0
            self.start(pod)

    def check(self, now: float | None = None) -> tuple[str, str] | None:
        """None while the job runs; ("done", why) when the trainer finished; ("failed", why) on failure."""
        now = time.monotonic() if now is None else now
        if self.parked:
            self._unpark()
        for pod in self.local_pods:
            if pod.name in self.parked or pod.name not in self.children:
                continue
            if pod.name in self.restart_at:
                if now >= self.restart_at[pod.name]:
                    del self.restart_at[pod.name]
                    self.start(pod)
                continue
            code = self.children[pod.name].poll()
            if code is None:
                continue
            why = self.exit_reason(pod, code)
            if pod.role == "trainer" and code == 0:
                return "done", f"{pod.name} finished"
            if (
                pod.role == "trainer"
                or code == CONFIG_ERROR_EXIT
                or self.restarts[pod.name] >= ROLLOUT_RESTARTS
            ):
                return "failed", why
            self.restarts[pod.name] += 1
            wait = min(RESTART_BACKOFF_CAP_S, self.backoff_s * 2 ** (self.restarts[pod.name] - 1))
            self.restart_at[pod.name] = now + wait
            first = why.splitlines()[0]
            self.say(f"{first}; restarting in {wait:g}s ({self.restarts[pod.name]}/{ROLLOUT_RESTARTS})")
        return None

    def exit_reason(self, pod: pods.LocalPod, code: int) -> str:
        """``<pod> exited with code N: <termination message>`` (when there is one), then its log's tail."""
        try:
            message = self.termination_log(pod).read_text().strip()
        except OSError:
            message = ""
        said = f": {message}" if message else ""
        tail = process.log_tail(self.children[pod.name].log_path, 15)
        return f"{pod.name} exited with code {code}{said}\nlast log lines:\n{tail}"

    def stop_all(self, grace: float = STOP_GRACE_S) -> None:
        """Stop like the kubelet: SIGTERM each pod's main process (not its helpers, e.g. vLLM's engine
        core, which the main process shuts down itself), then SIGKILL each whole process group still
        alive after `grace` seconds. Names the pods that needed the SIGKILL. In containers the SIGTERM goes
        through `podman run`'s signal proxy and the SIGKILL step is `podman rm -f` of every pod's container
        (also of one whose `podman run` is gone)."""
        children = list(self.children.values())
        for child in children:
            if child.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(
            child.poll() is None or process.group_alive(child.pgid) for child in children
        ):
            time.sleep(0.1)
        late = [child.name for child in children if child.poll() is None or process.group_alive(child.pgid)]
        if late:
            self.say(f"asyncrl: {', '.join(late)} did not stop within {grace:.0f}s: killed")
        if self.engine is not None:
            self.engine.remove(self.engine.names(self.local_pods))
        for child in children:
            child.signal(signal.SIGKILL)  # no-op for groups already gone
        for child in children:
            child.stop(grace=5.0)  # reaps the leader


class Terminal:
    """Progress output: one rewritten line on a terminal, one line per poll otherwise."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self._open = False

    def status(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K" + text)
            self._open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def say(self, text: str) -> None:
        if self._open:
            self.stream.write("\n")
            self._open = False
        self.stream.write(text + "\n")
        self.stream.flush()


def run(options: Options, stream: TextIO = sys.stdout) -> int:
    """Run the job until the trainer finishes, a process fails, the timeout passes, or a signal arrives."""
    from asyncrl_operator import render  # the operator's renderer: what runs here is what it would create

    from asyncrl_workloads import tinymodel

    out = Terminal(stream)
    run_dir = (options.run_dir or default_run_dir(options.job_file)).resolve()
    job, raw = load_job(options, run_dir)  # before anything is written: a bad job leaves nothing behind
    engine_path = containers.find_engine(os.environ) if options.containers else None
    spec = job.spec
    local_gateway = gateway.plan(spec, os.environ)
    if spec.rollout.autoscale is not None and local_gateway is not None:  # refused, not ignored
        raise JobFileError(
            "spec.rollout.autoscale: asyncrl run does not resize the rollouts of a gateway job (its agents "
            "are given the replicas' URLs at start); remove it to run locally, the operator applies it"
        )
    busy = gateway.busy_ports(local_gateway) if local_gateway is not None else []
    if busy:
        raise JobFileError(
            f"spec.agent.gateway.port: port(s) {', '.join(map(str, busy))} in use on this machine "
            f"(the front URL serves on port, rollout replica i on port + 1 + i); choose another port"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "job.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    manifests = render.render(job)
    (run_dir / "rendered.yaml").write_text(yaml.safe_dump_all(manifests, sort_keys=False))
    out.say(f"asyncrl: running job {job.metadata.name!r} in {run_dir}")

    model_dir = pathlib.Path(spec.model.path)
    if spec.model.create is not None:
        started = time.monotonic()
        tinymodel.create_from_spec(model_dir, spec.model.create)
        out.say(f"asyncrl: tiny model ready at {model_dir} ({time.monotonic() - started:.1f}s)")
    elif not (model_dir / "config.json").is_file():
        raise JobFileError(f"spec.model.path: no model at {model_dir} (config.json missing)")

    stop = threading.Event()
    reason = {"why": "stopped"}

    def on_signal(signum: int, _frame: Any) -> None:
        reason["why"] = signal.Signals(signum).name
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    nats = None
    supervisor = None
    gateway_front = None
    outcome, detail = "stopped", ""
    stop_seconds = 0.0
    try:
        if spec.bus.nats.managed:
            nats = natsserver.start(store_dir=run_dir / "nats", log_path=run_dir / "logs" / "nats-server.log")
            nats_url = nats.url
        else:
            nats_url = str(spec.bus.nats.url)
        cfg = pods.localize_config(
            pods.job_json(manifests), nats_url, process.free_port(), process.free_port(), process.free_port()
        )
        config_path = run_dir / "job.json"
        config_path.write_text(cfg.model_dump_json(by_alias=True, exclude_none=True, indent=2))
        elastic_spec = spec.rollout.autoscale
        planned = {"rollout": elastic_spec.max_replicas} if elastic_spec is not None else None
        local_pods = pods.expand(
            manifests, config_path, cfg, process.free_port, planned, gateway=local_gateway, environ=os.environ
        )
        local_pods += pods.expand_agents(manifests, cfg, local_gateway, os.environ)
        (run_dir / "pods.json").write_text(pods.describe(local_pods))
        info_path = gateway.write_info(local_gateway, run_dir) if local_gateway is not None else None
        if local_gateway is not None:  # up before the agents: it answers 503 until a replica serves
            gateway_front = front.Front(local_gateway.base_port, local_gateway.urls).start()
        base_env = {
            **LOCAL_ENV_DEFAULTS,
            **os.environ,
            **{name: str(run_dir / file) for name, file in RUN_FILE_ENVS.items()},
        }
        engine = None
        if engine_path is not None:
            engine = container_engine(engine_path, run_dir, spec, local_pods, base_env)
        supervisor = Supervisor(local_pods, base_env, run_dir / "logs", out.say, engine)
        scaler = None
        if elastic_spec is not None:  # rollouts planned up to maxReplicas, the first `replicas` started
            scaler = elastic.Elastic(
                elastic_spec, spec.rollout.replicas, run_dir / RUN_FILE_ENVS["ASYNCRL_PROGRESS_FILE"],
                supervisor.scale_rollouts, out.say,
            )  # fmt: skip
            supervisor.wanted_rollouts = scaler.replicas
            supervisor.parked = {
                p.name for p in local_pods if p.role == "rollout" and p.replica >= scaler.replicas
            }
        supervisor.start_all()
        out.say(
            f"asyncrl: started {', '.join(p.name for p in local_pods)} (logs in {run_dir / 'logs'}); "
            "Ctrl-C stops"
        )
        if local_gateway is not None and info_path is not None:
            for line in local_gateway.lines(info_path):
                out.say(line)
        outcome, detail = _watch(options, spec.max_steps, supervisor, run_dir, stop, out, scaler)
        if outcome == "stopped":
            detail = reason["why"] if stop.is_set() else detail
    finally:
        stopping = time.monotonic()
        if supervisor is not None:
            out.say("asyncrl: stopping processes ...")
            supervisor.stop_all()
        if gateway_front is not None:
            gateway_front.stop()
        if nats is not None:
            nats.stop()
        stop_seconds = time.monotonic() - stopping
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = {
        "outcome": outcome,
        "detail": detail,
        "runDir": str(run_dir),
        "stopSeconds": round(stop_seconds, 2),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    out.say(f"asyncrl: {outcome}: {detail} (all processes stopped in {stop_seconds:.1f}s)")
    out.say(f"asyncrl: metrics in {run_dir / 'metrics.jsonl'}; curves: asyncrl plot {run_dir}")
    if outcome == "failed":
        return 1
    if reason["why"] in ("SIGINT", "SIGTERM"):
        return 128 + int(signal.Signals[reason["why"]])  # the shell's convention: 130, 143
    return 0


def container_engine(
    path: str,
    run_dir: pathlib.Path,
    spec: models.AsyncRLJobSpec,
    local_pods: list[pods.LocalPod],
    base_env: dict[str, str],
) -> containers.Engine:
    """The pods' engine: their run-wide env is the runner's defaults (the user's value of each wins, as
    in a local run) and the run dir's file paths, not the rest of this environment."""
    run_env = {name: base_env[name] for name in (*LOCAL_ENV_DEFAULTS, *RUN_FILE_ENVS)}
    containers.open_for_pods(run_dir)
    containers.open_for_pods(pathlib.Path(spec.trainer.checkpoint.path))
    mounts = containers.job_mounts(run_dir, spec, local_pods)
    return containers.Engine(path, containers.run_id(run_dir), mounts, run_env, dict(os.environ))


def _watch(
    options: Options,
    max_steps: int | None,
    supervisor: Supervisor,
    run_dir: pathlib.Path,
    stop: threading.Event,
    out: Terminal,
    scaler: elastic.Elastic | None = None,
) -> tuple[str, str]:
    """Poll until an end condition; append one progress record per poll to metrics.jsonl (with the
    rollout replicas asked for and ready when spec.rollout.autoscale resizes them)."""
    tracker = progress.Tracker(max_steps)
    step_log = progress.StepLog(run_dir / "steps.jsonl")
    started = time.monotonic()
    result: tuple[str, str] | None = None
    with (run_dir / "metrics.jsonl").open("a") as metrics_log:
        while result is None:
            stop.wait(options.poll_interval_s)
            result = supervisor.check()
            running = supervisor.running()
            texts = {p.name: progress.scrape(p.metrics_port) for p in running if p.metrics_port}
            entry = tracker.record(texts, step_log.read_new())
            if scaler is not None:
                rollouts = [p for p in running if p.role == "rollout"]
                ready = sum(1 for p in rollouts if elastic.ready(p.metrics_port))
                scaler.poll(ready)
                entry.update(rolloutReplicasDesired=scaler.replicas, rolloutReplicasReady=ready)
                if scaler.history.samples:  # the decision's signals, as the trainer last reported them
                    latest = scaler.history.samples[-1]
                    entry.update(
                        trainerWaitFraction=latest.trainer_wait_fraction,
                        rolloutBlockedFraction=latest.rollout_blocked_fraction,
                        trainerSamplesPerSecond=latest.samples_per_second,
                    )
                if scaler.last is not None:
                    entry["autoscaleReason"] = scaler.last.reason
            metrics_log.write(json.dumps(entry) + "\n")
            metrics_log.flush()
            out.status(progress.line(entry))
            if stop.is_set():
                result = ("stopped", "signal")
            elif options.timeout_s is not None and time.monotonic() - started > options.timeout_s:
                result = ("stopped", f"--timeout {options.timeout_s:.0f}s reached")
    return result
