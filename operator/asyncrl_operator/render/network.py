"""The NetworkPolicy: bus, weight-sync and torch traffic into the job's pods only from the job's own pods.

Called by ``render.render``. Every port is open to the job's own pods (NCCL picks ephemeral ports
between trainer ranks, so a port list would break it); from anywhere else only the metrics ports
(Prometheus) are reachable. A gateway job adds a second policy, ``render.gateway``'s: the gateway port
of the rollout pods, open to the agents' pods in the namespace.
"""

from __future__ import annotations

from typing import Any

from asyncrl_api import config, models

from asyncrl_operator.render import names, nats


def render_network_policy(job: models.AsyncRLJob) -> dict[str, Any]:
    job_pods = {"matchLabels": {names.JOB: names.label_value(job.metadata.name)}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": names.metadata(job, names.network_policy(job.metadata.name), "network"),
        "spec": {
            "podSelector": job_pods,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": job_pods}]},
                {
                    "ports": [
                        {"protocol": "TCP", "port": config.DEFAULT_METRICS_PORT},
                        {"protocol": "TCP", "port": nats.MONITOR_PORT},
                    ]
                },
            ],
        },
    }
