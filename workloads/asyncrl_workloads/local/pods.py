"""The operator's rendered objects turned into local processes: one `LocalPod` per StatefulSet replica.

Called by `runner` (and unit-tested on its own: pure, no I/O). Input is the list `render(job)` returns;
only the ConfigMap `job.json` and the rollout/trainer StatefulSets are used (the managed NATS StatefulSet
is replaced by the embedded nats-server). For each replica the container's env is resolved the way the
kubelet would: plain values as given, downward-API `fieldRef`s filled with the pod's local identity
(pod-index label = ordinal, metadata.name = `<statefulset>-<ordinal>`, metadata.namespace), `$(VAR)`
references in the command expanded from that env. Local differences, all explicit here:

- the config path argument (/etc/asyncrl/job.json) points at the run dir's copy, whose `endpoints`
  name 127.0.0.1 and the runner's free ports (`localize_config`);
- MASTER_ADDR/MASTER_PORT (torch's default group) become 127.0.0.1 and the local torch master port;
- each process gets its own metrics port through ASYNCRL_METRICS_PORT (they share one host);
- a gateway job's rollout replica i serves the gateway on spec port + 1 + i at 127.0.0.1
  (`local.gateway`: ASYNCRL_GATEWAY_PORT and ASYNCRL_GATEWAY_URL replace the pod's DNS name, and
  ASYNCRL_GATEWAY_PEER_URL lists every replica's URL instead of the pods' DNS template; the spec port
  is the runner's front URL, as the Service's on a cluster), and the admin key's `secretKeyRef` resolves to
  the run's key (the only Secret a local run has);
- an endpoint's API key (the judge's on rollouts, the teacher's on trainers: a `secretKeyRef` env var named
  in `ENDPOINT_KEY_ENVS`) is the runner's own variable of that name, or left unset when it has none (the
  endpoint then gets no key; one that wants a key answers 401 and the message names the Secret);
- the NATS ``.creds`` path of bus.nats.credentialsSecret (`config.NATS_CREDS_ENV`, the Secret's mount in
  a pod) is the runner's own variable of that name, a file on this host, when it has one;
- a bare console-script name (asyncrl-trainer) resolves to the running interpreter's scripts dir.

Each `LocalPod` also carries the rendered container as a container engine runs it (`PodContainer`, used by
`asyncrl run --containers`, see `containers`): the image, the same argv with argv[0] left to the image's
PATH, the securityContext's user, groups and read-only root filesystem, and the emptyDir mount paths.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from typing import Any

from asyncrl_api import config

from asyncrl_workloads.local import gateway as gateway_mod
from asyncrl_workloads.local import process

ROLE_LABEL = "asyncrl.dev/role"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
ROLES = ("trainer", "rollout")  # start order: the trainer hosts the weight-sync rendezvous
AGENT_ROLE = "agent"  # spec.agent.workers: the Deployment's pods, started after the rollouts
ENDPOINT_KEY_ENVS = (config.JUDGE_API_KEY_ENV, config.TEACHER_API_KEY_ENV)
SECRET_ENVS = (*ENDPOINT_KEY_ENVS, gateway_mod.ADMIN_KEY_ENV)
"""Env vars whose values `describe` leaves out of pods.json."""
_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class RenderedJobError(ValueError):
    """The rendered objects lack something the runner needs (a bug in render or an unknown field)."""


@dataclasses.dataclass(frozen=True)
class PodContainer:
    """The rendered container as a container engine runs it (`containers.run_argv`)."""

    image: str
    argv: tuple[str, ...]  # command + args as `LocalPod.argv`, but argv[0] is the image's own console script
    user: str | None = None  # "uid[:gid]": runAsUser/runAsGroup, the container's over the pod's
    groups: tuple[int, ...] = ()  # the pod's fsGroup and supplementalGroups
    read_only_root: bool = False  # readOnlyRootFilesystem
    empty_dirs: tuple[str, ...] = ()  # mountPaths of the container's emptyDir volumes
    host_paths: tuple[str, ...] = ()  # bind-mounted read-only at the same paths (`host_arguments`)


@dataclasses.dataclass(frozen=True)
class LocalPod:
    """One process to run: what the kubelet would start for one replica of a role."""

    name: str
    role: str
    replica: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    metrics_port: int
    cpus: frozenset[int] | None = None  # started with this CPU affinity (a CPU rollout's own core)
    container: PodContainer | None = None  # the same pod in its image (`asyncrl run --containers`)
    secret_envs: frozenset[str] = frozenset()  # env names from a Secret: masked in pods.json


def job_json(manifests: list[dict[str, Any]]) -> str:
    """The `job.json` text of the rendered ConfigMap."""
    for manifest in manifests:
        if manifest.get("kind") == "ConfigMap" and config.CONFIGMAP_KEY in manifest.get("data", {}):
            return str(manifest["data"][config.CONFIGMAP_KEY])
    raise RenderedJobError(f"render() produced no ConfigMap with key {config.CONFIGMAP_KEY}")


def localize_config(
    text: str, nats_url: str, weight_sync_port: int, torch_master_port: int, metrics_port: int
) -> config.JobConfig:
    """The rendered config with `endpoints` pointing at this machine."""
    rendered = config.JobConfig.model_validate_json(text)
    endpoints = config.Endpoints(
        nats_url=nats_url,
        trainer_host="127.0.0.1",
        weight_sync_port=weight_sync_port,
        torch_master_port=torch_master_port,
        metrics_port=metrics_port,
    )
    return rendered.model_copy(update={"endpoints": endpoints})


def role_statefulsets(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """role -> StatefulSet for the trainer and rollout roles."""
    found = {}
    for manifest in manifests:
        role = manifest.get("metadata", {}).get("labels", {}).get(ROLE_LABEL)
        if manifest.get("kind") == "StatefulSet" and role in ROLES:
            found[role] = manifest
    missing = [role for role in ROLES if role not in found]
    if missing:
        raise RenderedJobError(f"render() produced no StatefulSet for role(s) {', '.join(missing)}")
    return {role: found[role] for role in ROLES}


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined names are replaced, `$$` is a literal `$`, others stay."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VAR_REF.sub(replace, text)


def field_value(path: str, pod_name: str, namespace: str, ordinal: int, labels: Mapping[str, str]) -> str:
    """The downward-API value of `fieldRef.fieldPath` for a local pod."""
    simple = {
        "metadata.name": pod_name,
        "metadata.namespace": namespace,
        "spec.nodeName": "localhost",
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    if path in simple:
        return simple[path]
    match = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
    if match:
        key = match.group(1)
        if key == POD_INDEX_LABEL:
            return str(ordinal)
        if key in labels:
            return labels[key]
    raise RenderedJobError(f"env fieldRef {path!r} has no local equivalent")


def container_env(
    container: Mapping[str, Any],
    pod_name: str,
    namespace: str,
    ordinal: int,
    labels: Mapping[str, str],
    secrets: Mapping[tuple[str, str], str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The container's env as the kubelet resolves it (in order; later entries may use earlier ones).
    `secrets`: (Secret name, key) -> value, the Secrets this local run has; `environ`: the runner's own
    environment, where an endpoint's API key (`ENDPOINT_KEY_ENVS`) and the NATS creds path come from."""
    env: dict[str, str] = {}
    secrets = secrets or {}
    environ = environ or {}
    for item in container.get("env", []):
        source = item.get("valueFrom", {})
        secret = source.get("secretKeyRef", {})
        if item["name"] == config.NATS_CREDS_ENV and item["name"] in environ:
            env[item["name"]] = environ[item["name"]]
        elif "value" in item:
            env[item["name"]] = expand_vars(str(item["value"]), env)
        elif "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            env[item["name"]] = field_value(path, pod_name, namespace, ordinal, labels)
        elif (secret.get("name"), secret.get("key")) in secrets:
            env[item["name"]] = secrets[(secret["name"], secret["key"])]
        elif secret and item["name"] == config.GATEWAY_ADMIN_KEY_ENV:
            raise RenderedJobError(f"env {item['name']!r}: the gateway's admin key needs the run's key")
        elif secret or "configMapKeyRef" in source:
            if item["name"] in environ:  # the runner's own variable of that name, else unset
                env[item["name"]] = environ[item["name"]]
        else:
            raise RenderedJobError(
                f"env {item.get('name')!r}: only value, fieldRef, and Secret or ConfigMap keys (the runner's "
                "own variable of that name) are supported locally"
            )
    return env


def pod_container(pod_spec: Mapping[str, Any], container: Mapping[str, Any], argv: list[str]) -> PodContainer:
    """The container's image, user, groups, root filesystem and emptyDir mounts, as the kubelet would run
    it; `argv` is its command with variables expanded and the config path localized."""
    pod_context = pod_spec.get("securityContext") or {}
    own = container.get("securityContext") or {}
    uid = own.get("runAsUser", pod_context.get("runAsUser"))
    gid = own.get("runAsGroup", pod_context.get("runAsGroup"))
    user = None if uid is None else str(uid) if gid is None else f"{uid}:{gid}"
    groups = ([pod_context["fsGroup"]] if "fsGroup" in pod_context else []) + list(
        pod_context.get("supplementalGroups") or []
    )
    empty = {v["name"] for v in pod_spec.get("volumes") or [] if "emptyDir" in v}
    return PodContainer(
        image=str(container["image"]),
        argv=tuple(argv),
        user=user,
        groups=tuple(int(g) for g in dict.fromkeys(groups)),
        read_only_root=bool(own.get("readOnlyRootFilesystem", False)),
        empty_dirs=tuple(m["mountPath"] for m in container.get("volumeMounts") or [] if m["name"] in empty),
    )


def host_arguments(argv: list[str], cwd: pathlib.Path) -> tuple[list[str], tuple[str, ...]]:
    """An agent worker's command for its image under --containers: each argument that names an existing
    file or directory relative to `cwd` (`python3 examples/agents/lookup_agent.py`, as `asyncrl run` reads
    it) made absolute, and the directories to bind-mount read-only at the same paths for them (a file's
    own directory, so the modules beside a script import; a directory itself; none inside another).
    Nothing else of `cwd` goes into the container."""
    out, wanted = [], []
    for arg in argv:
        path = cwd / arg
        if arg and not arg.startswith(("-", "/")) and "=" not in arg and path.exists():
            path = path.resolve()
            wanted.append(path if path.is_dir() else path.parent)
            arg = str(path)
        out.append(arg)
    mounts: list[pathlib.Path] = []
    for path in sorted(set(wanted), key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(m) for m in mounts):
            mounts.append(path)
    return out, tuple(str(m) for m in mounts)


def resolve_executable(name: str) -> str:
    """A console script from this interpreter's environment, else from PATH, else unchanged."""
    if "/" in name:
        return name
    beside = pathlib.Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    return shutil.which(name) or name


CLI_AGENTS = ("claude-code", "codex")
"""tools/setup.sh's npm CLIs, each in $ASYNCRL_CACHE (default ~/.cache/asyncrl)/<name>/node_modules/.bin."""


def agent_path(environ: Mapping[str, str]) -> str:
    """A local agent worker's PATH: the runner's, then the bin directories of tools/setup.sh's CLIs that
    exist, so a sessionCommand's `claude` or `codex` runs as in an agent image that has it on its PATH
    (one on the runner's PATH wins)."""
    cache = pathlib.Path(environ.get("ASYNCRL_CACHE") or pathlib.Path.home() / ".cache" / "asyncrl")
    bins = [cache / cli / "node_modules" / ".bin" for cli in CLI_AGENTS]
    return os.pathsep.join([environ.get("PATH", os.defpath), *(str(b) for b in bins if b.is_dir())])


def expand(
    manifests: list[dict[str, Any]],
    config_path: pathlib.Path,
    cfg: config.JobConfig,
    next_port: Callable[[], int],
    replicas: Mapping[str, int] | None = None,
    gateway: gateway_mod.LocalGateway | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[LocalPod]:
    """Every replica of the trainer and rollout StatefulSets as a `LocalPod` (trainer first).

    `cfg` is the localized config (its torch master port is used); `next_port` hands out metrics ports;
    `replicas` overrides a role's replica count (default: the StatefulSet's spec.replicas); `gateway`:
    a gateway job's local admin key and ports; `environ`: the runner's environment (endpoint API keys).
    """
    secrets = gateway.secrets() if gateway is not None else {}
    pods: list[LocalPod] = []
    for role, statefulset in role_statefulsets(manifests).items():
        count = (replicas or {}).get(role, int(statefulset["spec"].get("replicas", 1)))
        template = statefulset["spec"]["template"]
        labels = template.get("metadata", {}).get("labels", {})
        containers = template["spec"]["containers"]
        if len(containers) != 1:
            raise RenderedJobError(f"{role} pods have {len(containers)} containers; the runner runs one")
        container = containers[0]
        for ordinal in range(count):
            pod_name = f"{statefulset['metadata']['name']}-{ordinal}"
            env = container_env(container, pod_name, cfg.namespace, ordinal, labels, secrets, environ)
            if role == "rollout" and gateway is not None:
                env.update(gateway.pod_env(ordinal))
            if "MASTER_ADDR" in env:
                env["MASTER_ADDR"] = "127.0.0.1"
            if "MASTER_PORT" in env:
                env["MASTER_PORT"] = str(cfg.endpoints.torch_master_port)
            cpus = None
            if role == "rollout" and cfg.spec.rollout.gpus_per_replica == 0:
                cpus = process.rollout_cpus(ordinal)
                env.update(process.engine_core_env(cpus))
            metrics_port = next_port()
            env["ASYNCRL_METRICS_PORT"] = str(metrics_port)
            argv = [expand_vars(arg, env) for arg in container["command"] + container.get("args", [])]
            argv = [str(config_path) if arg == config.MOUNT_PATH else arg for arg in argv]
            in_image = pod_container(template["spec"], container, argv)
            argv[0] = resolve_executable(argv[0])
            pods.append(LocalPod(pod_name, role, ordinal, tuple(argv), env, metrics_port, cpus, in_image))
    return pods


def expand_agents(
    manifests: list[dict[str, Any]],
    cfg: config.JobConfig,
    gateway: gateway_mod.LocalGateway | None,
    environ: Mapping[str, str] | None = None,
) -> list[LocalPod]:
    """The agent workers' Deployment (spec.agent.workers) as `workers.replicas` local pods: started with
    the rest (an agent waits for the gateway itself; the operator holds them at 0 until a rollout serves),
    ASYNCRL_GATEWAY_URL is the run's front URL (the Service's on a cluster), the admin key the run's; a
    Secret or ConfigMap key of the worker's env is the runner's own variable of that name; envFrom is not
    resolved locally. Relative paths in the command are the current directory's, as in `asyncrl run`; a
    sessionCommand's `claude` or `codex` not on PATH is the one tools/setup.sh installed (`agent_path`,
    which the runner sets for local processes). No metrics port (0)."""
    workers = cfg.spec.agent.workers if cfg.spec.agent is not None else None
    deployment = next((m for m in manifests if m.get("kind") == "Deployment"), None)
    if workers is None or deployment is None or gateway is None:
        return []
    template = deployment["spec"]["template"]
    labels = template.get("metadata", {}).get("labels", {})
    container = template["spec"]["containers"][0]
    out = []
    for ordinal in range(workers.replicas):
        pod_name = f"{deployment['metadata']['name']}-{ordinal}"
        env = container_env(container, pod_name, cfg.namespace, ordinal, labels, gateway.secrets(), environ)
        env.pop("HOME", None)  # the pod's emptyDir; locally the user's own
        env[config.GATEWAY_URL_ENV] = gateway.front_url
        argv = [expand_vars(arg, env) for arg in container.get("command", []) + container.get("args", [])]
        if not argv:
            raise RenderedJobError("spec.agent.workers: a local run needs command or sessionCommand")
        in_argv, paths = host_arguments(argv, pathlib.Path.cwd())
        in_image = dataclasses.replace(pod_container(template["spec"], container, in_argv), host_paths=paths)
        argv[0] = resolve_executable(argv[0])
        hidden = frozenset(
            e["name"] for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})
        )
        out.append(LocalPod(pod_name, AGENT_ROLE, ordinal, tuple(argv), env, 0, None, in_image, hidden))
    return out


def describe(pods: list[LocalPod]) -> str:
    """A JSON summary (written to the run dir, so a run says exactly what it started); keys are left out
    (`SECRET_ENVS`: the gateway's admin key is in the run dir's gateway.json, readable by its owner only;
    endpoint keys in the user's environment only)."""
    return json.dumps(
        [
            {
                "name": p.name,
                "role": p.role,
                "replica": p.replica,
                "argv": list(p.argv),
                "env": {
                    k: "(secret)" if k in {*SECRET_ENVS, *p.secret_envs} else v for k, v in p.env.items()
                },  # noqa: E501
                "metricsPort": p.metrics_port,
                "cpus": sorted(p.cpus) if p.cpus is not None else None,
            }
            for p in pods
        ],
        indent=2,
    )
