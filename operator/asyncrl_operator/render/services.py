"""Headless Services: the trainer's (stable DNS for rank 0 = torch master + weight-sync rendezvous)
and the rollout's (stable DNS per replica, metrics discovery, a gateway session's own replica).

Called by ``render.render``. Both publish not-ready addresses: ranks must resolve each other before
any of them is Ready (the rendezvous happens during start-up).
"""

from __future__ import annotations

from typing import Any

from asyncrl_api import config, models

from asyncrl_operator.render import gateway, names


def _headless(job: models.AsyncRLJob, name: str, role: str, ports: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": names.metadata(job, name, role),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": names.selector(job.metadata.name, role),
            "ports": ports,
        },
    }


def _port(name: str, port: int) -> dict[str, Any]:
    return {"name": name, "port": port, "targetPort": port, "protocol": "TCP"}


def render_trainer_service(job: models.AsyncRLJob) -> dict[str, Any]:
    ports = [
        _port("torch", config.DEFAULT_TORCH_MASTER_PORT),
        _port("weight-sync", job.spec.weight_sync.port),
        _port("metrics", config.DEFAULT_METRICS_PORT),
    ]
    return _headless(job, names.trainer(job.metadata.name), names.TRAINER, ports)


def render_rollout_service(job: models.AsyncRLJob) -> dict[str, Any]:
    ports = [_port("metrics", config.DEFAULT_METRICS_PORT)]
    gateway_spec = gateway.spec(job)
    if gateway_spec is not None:
        ports.append(gateway.service_port(gateway_spec))
    return _headless(job, names.rollout(job.metadata.name), names.ROLLOUT, ports)
