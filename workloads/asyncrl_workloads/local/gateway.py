"""The agent gateway of a local run (spec.agent.loop gateway): its admin key, its front URL and one port per
rollout replica, and what the user is told to point an agent at.

Called by `runner` (and `pods.expand`, which puts `pod_env` into each rollout's env); pure except
`write_info`. On a cluster the admin key comes from the Secret named in spec.agent.gateway.adminKeySecret,
agents reach the replicas through the Service `<job>-gateway` on spec port, and each replica's URL is its
pod's DNS name. Locally the runner stands in for all three: the key is the environment's
ASYNCRL_GATEWAY_ADMIN_KEY, or a fresh random one per run, and it is what the Secret's `secretKeyRef`
resolves to (`secrets`); the front URL (`front`, http://127.0.0.1:<spec port>) spreads requests over the
replicas as the Service does; replica i serves on spec port + 1 + i (the replicas share one host), at
http://127.0.0.1:<that port>, the URL its sessions carry. Its peers (for the groups it cannot admit) are
every replica's URL, as a comma-separated list indexed by ordinal (ASYNCRL_GATEWAY_PEER_URL).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import secrets
import shlex
import socket
from collections.abc import Mapping
from typing import Any

from asyncrl_api import config, models

ADMIN_KEY_ENV = config.GATEWAY_ADMIN_KEY_ENV
"""The admin key, in a rollout's env (rollout/main.py reads it) and in the user's (reused if set)."""
URL_ENV = config.GATEWAY_URL_ENV
"""A rollout replica's base URL as agents reach it (rollout/main.py hands it out with each session)."""
PORT_ENV = config.GATEWAY_PORT_ENV
"""A rollout replica's gateway port (rollout/main.py: overrides spec.agent.gateway.port)."""
PEER_URL_ENV = config.GATEWAY_PEER_URL_ENV
"""The replicas' URLs, comma-separated by ordinal (gateway/service.py's GatewaySettings.peer_url)."""
INFO_FILE = "gateway.json"
AGENT_SCRIPT = "examples/agents/lookup_agent.py"


@dataclasses.dataclass(frozen=True)
class LocalGateway:
    admin_key: str
    base_port: int
    """spec.agent.gateway.port: the front URL's port (the Service's on a cluster); replica i serves on
    base_port + 1 + i."""
    replicas: int
    secret: tuple[str, str]
    """(name, key) of spec.agent.gateway.adminKeySecret: the secretKeyRef the admin key stands for."""

    @property
    def front_url(self) -> str:
        """Where agents open sessions: the front, which spreads them over the replicas (`front`)."""
        return f"http://127.0.0.1:{self.base_port}"

    def port(self, replica: int) -> int:
        return self.base_port + 1 + replica

    def url(self, replica: int) -> str:
        return f"http://127.0.0.1:{self.port(replica)}"

    @property
    def urls(self) -> list[str]:
        return [self.url(r) for r in range(self.replicas)]

    @property
    def ports(self) -> list[int]:
        """Every port the run listens on for the gateway: the front's, then the replicas'."""
        return [self.base_port, *(self.port(r) for r in range(self.replicas))]

    def pod_env(self, replica: int) -> dict[str, str]:
        """What a local rollout replica gets instead of the pod's DNS name, the spec's port and the peers'
        DNS template (local ports are not one pattern of the ordinal: a list)."""
        return {
            PORT_ENV: str(self.port(replica)),
            URL_ENV: self.url(replica),
            PEER_URL_ENV: ",".join(self.urls),
        }

    def secrets(self) -> dict[tuple[str, str], str]:
        """The local stand-in for the admin key's Secret, for `pods.container_env`'s secretKeyRef."""
        return {self.secret: self.admin_key}

    def agent_command(self) -> str:
        return (
            f"{URL_ENV}={shlex.quote(self.front_url)} {ADMIN_KEY_ENV}={shlex.quote(self.admin_key)} "
            f"python {AGENT_SCRIPT}"
        )

    def info(self) -> dict[str, Any]:
        """The content of the run dir's gateway.json: the front URL, and each replica's in `urls`."""
        return {
            "url": self.front_url,
            "urls": self.urls,
            "adminKey": self.admin_key,
            "env": {URL_ENV: self.front_url, ADMIN_KEY_ENV: self.admin_key},
            "agentCommand": self.agent_command(),
        }

    def lines(self, info_path: pathlib.Path) -> list[str]:
        """What the runner prints once at start."""
        return [
            f"asyncrl: agent gateway at {self.front_url} (in front of {', '.join(self.urls)}): open sessions "
            "there (POST /rl/groups with the admin key); each session's base_url is an OpenAI API",
            f"asyncrl: gateway admin key {self.admin_key} (also in {info_path})",
            f"asyncrl: drive it with an agent: {self.agent_command()}",
        ]


def admin_key(environ: Mapping[str, str]) -> str:
    """The environment's ASYNCRL_GATEWAY_ADMIN_KEY, else a fresh random key (new for every run)."""
    return environ.get(ADMIN_KEY_ENV, "").strip() or secrets.token_urlsafe(24)


def plan(spec: models.AsyncRLJobSpec, environ: Mapping[str, str]) -> LocalGateway | None:
    """The local gateway of a gateway job, else None."""
    agent = spec.agent
    if agent is None or agent.loop != "gateway" or agent.gateway is None:
        return None
    ref = agent.gateway.admin_key_secret
    return LocalGateway(admin_key(environ), agent.gateway.port, spec.rollout.replicas, (ref.name, ref.key))


def busy_ports(gateway: LocalGateway) -> list[int]:
    """The front's and the replicas' ports something else listens on (the run would fail to bind)."""
    busy = []
    for port in gateway.ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the gateway binds it
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                busy.append(port)
    return busy


def write_info(gateway: LocalGateway, run_dir: pathlib.Path) -> pathlib.Path:
    """gateway.json in the run dir, readable by its owner only (it holds the admin key)."""
    path = run_dir / INFO_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file left by an earlier run of this run dir keeps its mode otherwise
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(gateway.info(), indent=2) + "\n")
    return path
