"""``render(job)``: every Kubernetes object the operator creates for a job, as plain dicts. Pure.

Called by the handlers (which apply the list with server-side apply), by the golden unit tests, and by
the local runner (which runs the StatefulSets' commands as local processes). One builder per kind
lives in its own module; names and labels come from ``render.names``.
"""

from __future__ import annotations

from typing import Any

from asyncrl_api import models

from asyncrl_operator.render import configmap, names, nats, network, rbac, rollout, services, trainer

Manifest = dict[str, Any]

__all__ = ["Manifest", "configmap", "names", "render"]


def render(job: models.AsyncRLJob) -> list[Manifest]:
    """Objects in apply order: config and identity first, then services, the bus, the two roles."""
    cfg = configmap.job_config(job)
    config_hash = configmap.config_hash(cfg)
    objects: list[Manifest] = [
        configmap.render_configmap(job, cfg),
        rbac.render_service_account(job),
        rbac.render_role(job),
        rbac.render_role_binding(job),
        network.render_network_policy(job),
        services.render_trainer_service(job),
        services.render_rollout_service(job),
    ]
    if job.spec.bus.nats.managed:
        objects += [nats.render_nats_service(job), nats.render_nats_statefulset(job)]
    objects += [
        trainer.render_trainer_statefulset(job, config_hash),
        rollout.render_rollout_statefulset(job, config_hash),
    ]
    return objects


def kinds_and_names(objects: list[Manifest]) -> list[tuple[str, str]]:
    """(kind, name) of each object, for tests and logs."""
    return [(o["kind"], o["metadata"]["name"]) for o in objects]
