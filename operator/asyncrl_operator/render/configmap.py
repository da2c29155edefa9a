"""The job's rendered config (``JobConfig``), the ConfigMap that carries it, and its hash.

Called by ``render.render`` and by the local runner (``job_config`` with its own endpoints). The hash
goes on both roles' pod templates, so a config change restarts pods; fields meant to change while a
job runs (replicas, suspend, ttl, maxSteps, the stall threshold) are left out of it, so
``kubectl scale`` or ``suspend`` never restarts the trainer.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from asyncrl_api import config, models

from asyncrl_operator.render import names

NATS_PORT = config.DEFAULT_NATS_PORT

# (path of keys in the camelCase config) left out of the config hash.
_LIVE_FIELDS: tuple[tuple[str, ...], ...] = (
    ("spec", "rollout", "replicas"),
    ("spec", "suspend"),
    ("spec", "ttlSecondsAfterFinished"),
    ("spec", "maxSteps"),
    ("spec", "progress", "stalledAfterSeconds"),
)


def endpoints(job: models.AsyncRLJob) -> config.Endpoints:
    """In-cluster addresses: the managed NATS Service (or the external URL) and trainer rank 0's DNS name."""
    nats = job.spec.bus.nats
    name, namespace = job.metadata.name, job.metadata.namespace
    return config.Endpoints(
        nats_url=nats.url if nats.url else names.nats_url(name, namespace, NATS_PORT),
        trainer_host=names.trainer_host(name, namespace),
        weight_sync_port=job.spec.weight_sync.port,
        torch_master_port=config.DEFAULT_TORCH_MASTER_PORT,
        metrics_port=config.DEFAULT_METRICS_PORT,
    )


def job_config(job: models.AsyncRLJob, eps: config.Endpoints | None = None) -> config.JobConfig:
    """The config every workload process reads."""
    return config.JobConfig(
        name=job.metadata.name,
        namespace=job.metadata.namespace,
        spec=job.spec,
        endpoints=eps if eps is not None else endpoints(job),
    )


def config_hash(cfg: config.JobConfig) -> str:
    """sha256 (16 hex chars) of the config without its live fields."""
    data: dict[str, Any] = json.loads(config.dumps(cfg))
    for path in _LIVE_FIELDS:
        node = data
        for key in path[:-1]:
            node = node.get(key, {})
        node.pop(path[-1], None)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def render_configmap(job: models.AsyncRLJob, cfg: config.JobConfig) -> dict[str, Any]:
    """ConfigMap ``<job>-config`` with key ``job.json``."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": names.metadata(job, names.config_map(job.metadata.name), "config"),
        "data": {config.CONFIGMAP_KEY: config.dumps(cfg)},
    }
