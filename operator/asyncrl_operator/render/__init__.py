"""``render(job)``: every Kubernetes object the operator creates for a job, as plain dicts. Pure.

Called by the handlers (which apply the list with server-side apply), by the golden unit tests, and by
the local runner (which runs the StatefulSets' commands as local processes). One builder per kind
lives in its own module; names and labels come from ``render.names``.
"""

from __future__ import annotations

from typing import Any

from asyncrl_api import models

from asyncrl_operator.render import (
    agents,
    configmap,
    disruption,
    gang,
    gateway,
    names,
    nats,
    network,
    rbac,
    rollout,
    services,
    trainer,
)

Manifest = dict[str, Any]

__all__ = ["Manifest", "agents", "configmap", "names", "render"]


def render(job: models.AsyncRLJob) -> list[Manifest]:
    """Objects in apply order: config and identity first, then policies (network, disruption) and
    services, the bus, the trainer gang's PodGroup (with a gang scheduler), the two roles."""
    cfg = configmap.job_config(job)
    config_hash = configmap.config_hash(cfg)
    objects: list[Manifest] = [
        configmap.render_configmap(job, cfg),
        rbac.render_service_account(job),
        rbac.render_role(job),
        rbac.render_role_binding(job),
        network.render_network_policy(job),
        network.render_trainer_egress_policy(job),
        disruption.render_pod_disruption_budget(job, names.TRAINER),
        disruption.render_pod_disruption_budget(job, names.ROLLOUT),
        services.render_trainer_service(job),
        services.render_rollout_service(job),
    ]
    gateway_spec = gateway.spec(job)
    if gateway_spec is not None:
        objects += [
            gateway.render_network_policy(job, gateway_spec),
            gateway.render_service(job, gateway_spec),
        ]
    if job.spec.bus.nats.managed:
        objects += [nats.render_nats_service(job), nats.render_nats_statefulset(job)]
    pod_group = gang.render_pod_group(job)
    if pod_group is not None:  # before the trainer's pods, which name it
        objects.append(pod_group)
    objects += [
        trainer.render_trainer_statefulset(job, config_hash),
        rollout.render_rollout_statefulset(job, config_hash),
    ]
    agent_deployment = agents.render_deployment(job)
    if agent_deployment is not None:  # after the rollouts: agents only start once a gateway serves
        objects += [
            agents.render_network_policy(job),
            disruption.render_pod_disruption_budget(job, names.AGENT),
            agent_deployment,
        ]
    return objects


def optional(job_name: str) -> list[tuple[str, str]]:
    """(kind key, name) of the children only some specs render: the gateway's, the agents' and the PodGroups.
    ``reconcile`` deletes the ones a job's spec no longer renders (agent.loop changed from gateway,
    another schedulerName), so none is left behind."""
    return [
        ("NetworkPolicy", names.gateway(job_name)),
        ("Service", names.gateway(job_name)),
        ("NetworkPolicy", names.agent(job_name)),
        ("PodDisruptionBudget", names.agent(job_name)),
        ("Deployment", names.agent(job_name)),
        (f"{gang.POD_GROUP_KIND}.{gang.COSCHEDULING_GROUP}", names.trainer(job_name)),
        (f"{gang.POD_GROUP_KIND}.{gang.VOLCANO_GROUP}", names.trainer(job_name)),
    ]


def kind_key(obj: Manifest) -> str:
    """How ``apply`` and ``reconcile`` key an object's kind: ``PodGroup.<group>`` for the PodGroups (two
    API groups share that kind), else the kind."""
    if obj["kind"] == gang.POD_GROUP_KIND:
        return f"{obj['kind']}.{obj['apiVersion'].split('/')[0]}"
    return str(obj["kind"])


def kinds_and_names(objects: list[Manifest]) -> list[tuple[str, str]]:
    """(kind, name) of each object, for tests and logs."""
    return [(o["kind"], o["metadata"]["name"]) for o in objects]
