"""The trainer StatefulSet: a gang of pods (one per node) wired like torchrun.

Called by ``render.render``. Pods start in parallel; rank = pod ordinal (label
apps.kubernetes.io/pod-index via the downward API), MASTER_ADDR = trainer rank 0's stable DNS name
in the headless Service. With one process per pod (CPU, or one GPU) the container runs
``asyncrl-trainer`` directly with RANK/WORLD_SIZE/LOCAL_RANK set; with several GPUs per pod it runs
``torchrun --no-python asyncrl-trainer`` so each GPU gets its own process and torchrun sets the ranks.
A failed trainer pod restarts the whole gang (the handlers delete every trainer pod). With spec.teacher
the pods get the teacher's API key (``render.secrets``).
"""

from __future__ import annotations

from typing import Any

from asyncrl_api import config, models

from asyncrl_operator.render import names, pods, secrets, security

ENTRY_POINT = "asyncrl-trainer"


def desired_replicas(job: models.AsyncRLJob) -> int:
    """0 while suspended or finished, else spec.trainer.replicas."""
    return 0 if pods.stopped(job) else job.spec.trainer.replicas


def trainer_env(job: models.AsyncRLJob) -> list[dict[str, Any]]:
    """Identity env plus the torchrun-style variables."""
    spec = job.spec.trainer
    name, namespace = job.metadata.name, job.metadata.namespace
    env = pods.identity_env(names.TRAINER)
    env += [
        pods.field_env("NODE_RANK", f"metadata.labels['{names.POD_INDEX}']"),
        {"name": "NNODES", "value": str(spec.replicas)},
        {"name": "NPROC_PER_NODE", "value": str(spec.nproc_per_node())},
        {"name": "MASTER_ADDR", "value": names.trainer_host(name, namespace)},
        {"name": "MASTER_PORT", "value": str(config.DEFAULT_TORCH_MASTER_PORT)},
    ]
    if spec.nproc_per_node() == 1:
        env += [
            pods.field_env("RANK", f"metadata.labels['{names.POD_INDEX}']"),
            {"name": "LOCAL_RANK", "value": "0"},
            {"name": "WORLD_SIZE", "value": str(spec.world_size())},
        ]
    if spec.backend == "megatron":
        # megatron-core's tensor-parallel overlap assumes one CUDA work queue (it warns at start-up,
        # and orders communication before compute by it); harmless on CPU
        env.append({"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1"})
    if job.spec.tracking is not None:  # the run's uid tag (the config holds the job's name, not its uid)
        env.append({"name": "ASYNCRL_JOB_UID", "value": job.metadata.uid})
    return env


def trainer_command(job: models.AsyncRLJob) -> list[str]:
    """The container command (see the module docstring)."""
    spec = job.spec.trainer
    if spec.nproc_per_node() == 1:
        return pods.command(ENTRY_POINT)
    return [
        "torchrun",
        f"--nnodes={spec.replicas}",
        f"--nproc-per-node={spec.nproc_per_node()}",
        "--node-rank=$(NODE_RANK)",
        "--master-addr=$(MASTER_ADDR)",
        "--master-port=$(MASTER_PORT)",
        "--no-python",
        *pods.command(ENTRY_POINT),
    ]


def render_trainer_statefulset(job: models.AsyncRLJob, config_hash: str) -> dict[str, Any]:
    name = job.metadata.name
    spec = job.spec.trainer
    ports = [
        {"name": "torch", "containerPort": config.DEFAULT_TORCH_MASTER_PORT, "protocol": "TCP"},
        {"name": "weight-sync", "containerPort": job.spec.weight_sync.port, "protocol": "TCP"},
        pods.metrics_port(),
    ]
    container = {
        "name": names.TRAINER,
        "image": spec.image,
        "command": trainer_command(job),
        "env": trainer_env(job) + pods.code_env(job) + secrets.trainer_env(job),
        "ports": ports,
        "resources": pods.resources(spec.gpus_per_replica, spec.resources),
        "volumeMounts": pods.volume_mounts(job, names.TRAINER),
        "startupProbe": pods.startup_probe(),
        "livenessProbe": pods.liveness_probe(),
        "readinessProbe": pods.readiness_probe("/metrics"),
        "securityContext": security.container_security_context(),
        "terminationMessagePolicy": pods.TERMINATION_MESSAGE_POLICY,
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": pods.volumes(job, names.TRAINER),
        "securityContext": security.pod_security_context(),
        "serviceAccountName": names.trainer(name),
        "automountServiceAccountToken": True,
        "terminationGracePeriodSeconds": 60,
        **pods.scheduling(job, spec.node_selector, spec.tolerations),
    }
    replicas = desired_replicas(job)
    return pods.statefulset(job, names.TRAINER, names.trainer(name), replicas, config_hash, pod_spec)
