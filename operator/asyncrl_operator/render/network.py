"""The NetworkPolicies of a job's pods: what may reach them (ingress) and what they may reach (egress).

Called by ``render.render``. Ingress: every port is open to the job's own pods (NCCL picks ephemeral
ports between trainer ranks, so a port list would break it); from anywhere else only the metrics ports
(Prometheus) are reachable. A gateway job adds ``render.gateway``'s policy: the gateway port of the
rollout pods, open to the agents' pods in the namespace.

Egress, the job's policy ``<job>-net`` (every pod of the job):

- the job's own pods, every port: the managed NATS server, the trainer's weight-sync and torch master
  ports (rank 0), NCCL between ranks;
- DNS, port 53 (UDP and TCP) to anywhere: the cluster's DNS is a Service in kube-system on most
  clusters but a node-local cache on a link-local address on others, so no selector names it portably;
- an external NATS server (bus.nats.url) and the judge and teacher endpoints (reward.endpoint,
  teacher.endpoint): a policy cannot name a host, so a URL whose host is an IP address gets exactly
  that address and port, and one with a host name gets its port to any address. Port-only is the
  narrowest rule that survives the name's address changing; the name is still what the client dials.

``<job>-trainer-egress`` (trainer pods only): TCP 443 and 6443 to anywhere, for rank 0's progress
reports to the API server (``asyncrl_workloads.trainer.progress``). The ``kubernetes`` Service's
address is rewritten to the API server's own (often port 6443) before the policy sees it, and that
address is not known when rendering.

Anything else is refused, a tool's web API included. Policies add up: to let a job's pods reach more,
add a NetworkPolicy of your own that selects ``asyncrl.dev/job: <job>`` and allows it.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from typing import Any

from asyncrl_api import config, models

from asyncrl_operator.render import configmap, names, nats

DNS_PORT = 53
API_SERVER_PORTS = (443, 6443)
"""The ``kubernetes`` Service's port, and the API server's usual own port behind it."""
DEFAULT_PORTS = {"nats": configmap.NATS_PORT, "tls": configmap.NATS_PORT, "http": 80, "https": 443}


def job_pods(job: models.AsyncRLJob) -> dict[str, Any]:
    """The job's own pods: rollout, trainer, NATS, but not its agent workers (``render.agents``), which
    run the user's code and reach only the gateway port (``render.gateway``'s policy)."""
    return {
        "matchLabels": {names.JOB: names.label_value(job.metadata.name)},
        "matchExpressions": [{"key": names.ROLE, "operator": "NotIn", "values": [names.AGENT]}],
    }


def url_rule(url: str) -> dict[str, Any]:
    """An egress rule for one URL: its IP address and port, or its port to anywhere for a host name."""
    parsed = urllib.parse.urlsplit(url)
    port = parsed.port or DEFAULT_PORTS[parsed.scheme]
    rule: dict[str, Any] = {"ports": [{"protocol": "TCP", "port": port}]}
    try:
        address = ipaddress.ip_address(parsed.hostname or "")
    except ValueError:
        return rule  # a host name: the port, to any address
    prefix = 32 if address.version == 4 else 128
    return {"to": [{"ipBlock": {"cidr": f"{address}/{prefix}"}}], **rule}


def endpoint_urls(job: models.AsyncRLJob) -> list[str]:
    """The URLs the job's pods dial outside the job: an external NATS server, the judge, the teacher."""
    spec = job.spec
    urls = [] if spec.bus.nats.managed or spec.bus.nats.url is None else [spec.bus.nats.url]
    if spec.reward.type == "judge" and spec.reward.endpoint is not None:
        urls.append(spec.reward.endpoint.base_url)
    if spec.teacher is not None:
        urls.append(spec.teacher.endpoint.base_url)
    return urls


def egress(job: models.AsyncRLJob) -> list[dict[str, Any]]:
    """The job policy's egress rules (module docstring), each distinct rule once."""
    rules: list[dict[str, Any]] = [
        {"to": [{"podSelector": job_pods(job)}]},
        {"ports": [{"protocol": "UDP", "port": DNS_PORT}, {"protocol": "TCP", "port": DNS_PORT}]},
    ]
    for url in endpoint_urls(job):
        rule = url_rule(url)
        if rule not in rules:
            rules.append(rule)
    return rules


def render_network_policy(job: models.AsyncRLJob) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": names.metadata(job, names.network_policy(job.metadata.name), "network"),
        "spec": {
            "podSelector": job_pods(job),
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": [{"podSelector": job_pods(job)}]},
                {
                    "ports": [
                        {"protocol": "TCP", "port": config.DEFAULT_METRICS_PORT},
                        {"protocol": "TCP", "port": nats.MONITOR_PORT},
                    ]
                },
            ],
            "egress": egress(job),
        },
    }


def render_trainer_egress_policy(job: models.AsyncRLJob) -> dict[str, Any]:
    """The trainer's way to the API server (module docstring)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": names.metadata(job, names.trainer_egress_policy(job.metadata.name), names.TRAINER),
        "spec": {
            "podSelector": {"matchLabels": names.selector(job.metadata.name, names.TRAINER)},
            "policyTypes": ["Egress"],
            "egress": [{"ports": [{"protocol": "TCP", "port": p} for p in API_SERVER_PORTS]}],
        },
    }
