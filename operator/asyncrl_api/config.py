"""The rendered job config: what every workload process reads from /etc/asyncrl/job.json.

Written by ``asyncrl_operator.render`` into the ConfigMap ``<job>-config`` (key ``job.json``) and by
the local runner (which rewrites ``endpoints`` to localhost addresses); read by the rollout and
trainer entry points with ``JobConfig.model_validate_json`` (or ``load``). Pod identity (role,
replica, ranks, a gateway pod's own URL) and secrets (the gateway's admin key) come from environment
variables, never from this file.
"""

from __future__ import annotations

import pathlib

import pydantic

from asyncrl_api import agents, base, models

CONFIGMAP_KEY = "job.json"
MOUNT_DIR = "/etc/asyncrl"
MOUNT_PATH = f"{MOUNT_DIR}/{CONFIGMAP_KEY}"

DEFAULT_NATS_PORT = 4222
DEFAULT_TORCH_MASTER_PORT = 29500
DEFAULT_METRICS_PORT = 9400

GATEWAY_ADMIN_KEY_ENV = agents.GATEWAY_ADMIN_KEY_ENV
"""Env var of a gateway job's rollout pods: the admin key, from spec.agent.gateway.adminKeySecret through
a secretKeyRef (a secret, so never in the config file). Agent workers get it the same way."""
GATEWAY_URL_ENV = agents.GATEWAY_URL_ENV
"""Env var of a gateway job's rollout pods: the pod's own gateway URL (its DNS name through the rollout's
headless Service), handed to agents for the sessions it opens (pod identity, so not in the config file).
Agent workers get the gateway Service's URL under the same name."""
JUDGE_API_KEY_ENV = "ASYNCRL_JUDGE_API_KEY"
"""Env var of a judge job's rollout pods: reward.endpoint's API key (secretKeyRef; the local runner passes
the variable of the same name through from its own environment)."""
TEACHER_API_KEY_ENV = "ASYNCRL_TEACHER_API_KEY"
"""Env var of a teacher job's trainer pods: teacher.endpoint's API key (secretKeyRef, like the judge's)."""
NATS_CREDS_ENV = "ASYNCRL_NATS_CREDS"
"""Env var of the rollout and trainer pods of a job with bus.nats.credentialsSecret: the path of the mounted
NATS ``.creds`` file (`NATS_CREDS_PATH`); every NATS connection presents it. A local run passes the
variable through from its own environment (a path on the host)."""
NATS_CREDS_DIR = "/etc/asyncrl-nats"
NATS_CREDS_KEY = "creds"
"""The Secret's key holding the ``.creds`` file (bus.nats.credentialsSecret)."""
NATS_CREDS_PATH = f"{NATS_CREDS_DIR}/{NATS_CREDS_KEY}"
GATEWAY_PORT_ENV = "ASYNCRL_GATEWAY_PORT"
"""Overrides spec.agent.gateway.port: the local runner gives each replica on one host its own port."""
GATEWAY_PEER_URL_ENV = "ASYNCRL_GATEWAY_PEER_URL"
"""The peer replicas' gateway URLs, for the groups a replica cannot admit (gateway/service.py's
GatewaySettings.peer_url): a `{replica}` template from the operator, a list from the local runner."""


class Endpoints(base.APIModel):
    """Where a job's processes find each other."""

    nats_url: str = pydantic.Field(min_length=1)
    """NATS server URL, e.g. nats://demo-nats.ns.svc:4222 (managed) or the external bus.nats.url."""
    trainer_host: str = pydantic.Field(min_length=1)
    """Stable DNS name of trainer rank 0 (its pod in the trainer headless Service): torch master and
    weight-sync rendezvous (TCPStore) host."""
    weight_sync_port: int = pydantic.Field(ge=1, le=65535)
    """TCPStore port of the weight-sync group on trainer rank 0 (spec.weightSync.port)."""
    torch_master_port: int = pydantic.Field(default=DEFAULT_TORCH_MASTER_PORT, ge=1, le=65535)
    """MASTER_PORT of the trainer's own default process group."""
    metrics_port: int = pydantic.Field(default=DEFAULT_METRICS_PORT, ge=1, le=65535)
    """Port every process serves /metrics on (ASYNCRL_METRICS_PORT overrides it locally)."""


class JobConfig(base.APIModel):
    """Everything a workload process needs besides its pod identity."""

    name: str = pydantic.Field(min_length=1)
    """Job name."""
    namespace: str = pydantic.Field(min_length=1)
    """Job namespace."""
    spec: models.AsyncRLJobSpec
    """The job's spec as the operator saw it (defaults filled in)."""
    endpoints: Endpoints
    """Addresses of the job's services."""


def load(path: str | pathlib.Path = MOUNT_PATH) -> JobConfig:
    """Read and validate a rendered config file."""
    return JobConfig.model_validate_json(pathlib.Path(path).read_text(encoding="utf-8"))


def dumps(config: JobConfig) -> str:
    """The config as the ConfigMap holds it: camelCase JSON, sorted keys, no nulls."""
    return config.model_dump_json(by_alias=True, exclude_none=True, indent=2)
