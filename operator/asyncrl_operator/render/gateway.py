"""The agent gateway (spec.agent.loop gateway): each rollout replica serves an OpenAI-compatible API.

Called by ``render.render`` (the Service and the NetworkPolicy), ``render.rollout`` (the container's
port and env) and ``render.services`` (the port on the rollout's headless Service). Like ``nats``, one
optional component's pieces live together, and a job without a gateway renders none of them.

- Agents open sessions through the ClusterIP Service ``<job>-gateway`` (any ready replica, with the
  admin key). A session is sticky to the replica that opened it: the replica hands out its own
  address, ``ASYNCRL_GATEWAY_URL`` = the pod's DNS name through the rollout's headless Service. A group
  the replica cannot admit goes to its peers, found through ``ASYNCRL_GATEWAY_PEER_URL`` (every pod's DNS
  name, with ``{replica}`` for the ordinal).
- The admin key reaches the container only as a ``secretKeyRef`` env var (``render.secrets``): its value
  is in no rendered object; the operator only checks that the Secret and key exist.
- The NetworkPolicy ``<job>-gateway``: the job's own policy (``render.network``) admits only the job's
  pods (and metrics), but an agent is some other pod of the namespace. This second policy selects the
  rollout pods only and admits the gateway port from every pod of the job's namespace; policies are
  unions, so a port rule on the job's policy would also have opened the port on the trainer and NATS.
  Agents in other namespaces need a policy of the user's own.
"""

from __future__ import annotations

from typing import Any

from asyncrl_api import config, models, task

from asyncrl_operator.render import names, secrets

PORT_NAME = "gateway"
PEER_URL_ENV = config.GATEWAY_PEER_URL_ENV
"""The peers' URL template (read by the workloads' gateway/service.py, which names it too)."""


def spec(job: models.AsyncRLJob) -> task.GatewaySpec | None:
    """The gateway's settings when the job's agent loop is the gateway, else None."""
    agent = job.spec.agent
    if agent is None or agent.loop != "gateway":
        return None
    return agent.gateway


def container_port(gateway: task.GatewaySpec) -> dict[str, Any]:
    return {"name": PORT_NAME, "containerPort": gateway.port, "protocol": "TCP"}


def service_port(gateway: task.GatewaySpec) -> dict[str, Any]:
    return {"name": PORT_NAME, "port": gateway.port, "targetPort": gateway.port, "protocol": "TCP"}


def env(job: models.AsyncRLJob, gateway: task.GatewaySpec) -> list[dict[str, Any]]:
    """The admin key (from its Secret), the pod's own gateway URL and its peers'. Goes after
    ``pods.identity_env``: the kubelet expands $(POD_NAME) only from variables defined earlier in the list."""
    return [
        secrets.secret_env(config.GATEWAY_ADMIN_KEY_ENV, gateway.admin_key_secret),
        {"name": config.GATEWAY_URL_ENV, "value": names.gateway_pod_url(job.metadata.name, gateway.port)},
        {"name": PEER_URL_ENV, "value": names.gateway_peer_url(job.metadata.name, gateway.port)},
    ]


def render_service(job: models.AsyncRLJob, gateway: task.GatewaySpec) -> dict[str, Any]:
    """ClusterIP Service ``<job>-gateway`` over the ready rollout pods: where agents open sessions."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": names.metadata(job, names.gateway(job.metadata.name), names.GATEWAY),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector(job.metadata.name, names.ROLLOUT),
            "ports": [service_port(gateway)],
        },
    }


def render_network_policy(job: models.AsyncRLJob, gateway: task.GatewaySpec) -> dict[str, Any]:
    """The gateway port of the rollout pods, open to every pod of the job's namespace."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": names.metadata(job, names.gateway(job.metadata.name), "network"),
        "spec": {
            "podSelector": {"matchLabels": names.selector(job.metadata.name, names.ROLLOUT)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {}}],  # every pod of this namespace (no namespaceSelector)
                    "ports": [{"protocol": "TCP", "port": gateway.port}],
                }
            ],
        },
    }
