"""The rollout StatefulSet: one vLLM engine per pod, ``nvidia.com/gpu`` per replica.

Called by ``render.render``. Replicas follow ``spec.rollout.replicas`` (the scale subresource), or 0
while the job is suspended or finished. Each pod is independent: the StatefulSet controller replaces
a failed one alone, and it re-joins weight sync at the next policy version. In a gateway job each pod
also serves the agent gateway (``render.gateway``: its port, admin key and own URL); a judge-rewarded
job's pods get the judge's API key (``render.secrets``).
"""

from __future__ import annotations

from typing import Any

from asyncrl_api import models

from asyncrl_operator.render import gateway, names, pods, secrets, security

ENTRY_POINT = "asyncrl-rollout"


def desired_replicas(job: models.AsyncRLJob) -> int:
    """0 while suspended or finished, else spec.rollout.replicas."""
    return 0 if pods.stopped(job) else job.spec.rollout.replicas


def render_rollout_statefulset(job: models.AsyncRLJob, config_hash: str) -> dict[str, Any]:
    name = job.metadata.name
    spec = job.spec.rollout
    env = pods.identity_env(names.ROLLOUT) + pods.code_env(job) + secrets.rollout_env(job)
    ports = [pods.metrics_port()]
    gateway_spec = gateway.spec(job)
    if gateway_spec is not None:
        env += gateway.env(job, gateway_spec)
        ports.append(gateway.container_port(gateway_spec))
    container = {
        "name": names.ROLLOUT,
        "image": spec.image,
        "command": pods.command(ENTRY_POINT),
        "env": env,
        "ports": ports,
        "resources": pods.resources(spec.gpus_per_replica, spec.resources),
        "volumeMounts": pods.volume_mounts(job, names.ROLLOUT),
        "startupProbe": pods.startup_probe(),
        "livenessProbe": pods.liveness_probe(),
        "readinessProbe": pods.readiness_probe("/readyz"),
        "securityContext": security.container_security_context(),
        "terminationMessagePolicy": pods.TERMINATION_MESSAGE_POLICY,
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": pods.volumes(job, names.ROLLOUT),
        "securityContext": security.pod_security_context(),
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
        **pods.scheduling(job, spec.node_selector, spec.tolerations),
    }
    replicas = desired_replicas(job)
    return pods.statefulset(job, names.ROLLOUT, names.rollout(name), replicas, config_hash, pod_spec)
