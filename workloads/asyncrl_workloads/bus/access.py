"""How a job's process gets onto its bus: the URL, the credentials of bus.nats.credentialsSecret, and one
classified line when it cannot.

Called by the rollout (rollout/main.py, every replica publishes) and trainer rank 0 (trainer/main.py,
the consumer; entrypoints/trainer.py first tries it before loading torch): both connect only through
`connect`, so both present the same ``.creds`` file and fail with the same words. The operator mounts
the Secret's key ``creds`` read-only at ``config.NATS_CREDS_PATH`` and names that path in
``config.NATS_CREDS_ENV`` (render/secrets.py); a local run passes the variable through from its own
environment. The file's content is read by nats-py only
(it signs the server's nonce with the seed); nothing here logs or copies it.

`Failed` carries the line the entry points print and write as the termination message, which the
operator shows in the job's Degraded condition:

- ``spec.bus.nats.credentialsSecret: NATS at <url> refused the credentials in Secret <name> key creds:
  Authorization Violation``: the server does not accept this user (wrong account, expired, revoked);
- ``... NATS at <url> requires credentials (Authorization Violation); set it to a Secret with key
  creds``: the server wants credentials and the job names none;
- ``... cannot read the NATS creds file <path> (Secret <name> key creds): <why>`` and ``... is not a
  NATS .creds file``: checked before connecting;
- ``endpoints.natsUrl: cannot reach NATS at <url>: <why>``: nothing answered.
"""

from __future__ import annotations

import os
from typing import Any

import nats.aio.client
import nats.errors
from asyncrl_api import config as config_mod

from asyncrl_workloads.bus import jetstream

FIELD = "spec.bus.nats.credentialsSecret"
CREDS_MARKERS = ("BEGIN NATS USER JWT", "BEGIN USER NKEY SEED")
"""The two blocks every ``.creds`` file has (`nsc generate creds`, `nsc add user`)."""


class Failed(Exception):
    """The bus cannot be used; the message is the one line to report."""


def creds_path(cfg: config_mod.JobConfig) -> str | None:
    """The ``.creds`` file to present: ``config.NATS_CREDS_ENV`` when set, else the operator's mount path
    when the job names a Secret (an external server only), else None (no credentials)."""
    from_env = os.environ.get(config_mod.NATS_CREDS_ENV)
    if from_env:
        return from_env
    bus = cfg.spec.bus.nats
    if bus.managed or bus.credentials_secret is None:
        return None
    return config_mod.NATS_CREDS_PATH


def _source(cfg: config_mod.JobConfig, path: str) -> str:
    """Where the credentials came from, for messages: the Secret (and the file when it is not the
    operator's mount, as in a local run), or the file alone."""
    secret = cfg.spec.bus.nats.credentials_secret
    if secret is None:
        return path
    where = f"Secret {secret} key {config_mod.NATS_CREDS_KEY}"
    return where if path == config_mod.NATS_CREDS_PATH else f"{where} ({path})"


def check_file(cfg: config_mod.JobConfig, path: str) -> str | None:
    """Why the ``.creds`` file cannot be presented, or None. Reads only whether the markers are there."""
    where = _source(cfg, path)
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(64 * 1024)
    except OSError as exc:
        return f"{FIELD}: cannot read the NATS creds file {path} ({where}): {exc.strerror or exc}"
    if not all(marker in text for marker in CREDS_MARKERS):
        blocks = " and ".join(CREDS_MARKERS)
        return f"{FIELD}: {where} is not a NATS .creds file (it needs the blocks {blocks})"
    return None


def refused_line(cfg: config_mod.JobConfig, url: str, path: str | None, why: str) -> str:
    """The line for a server that refused the connection's credentials (or their absence)."""
    if path is None:
        return (
            f"{FIELD}: NATS at {url} requires credentials ({why}); set it to a Secret with key "
            f"{config_mod.NATS_CREDS_KEY} (a NATS .creds file)"
        )
    return f"{FIELD}: NATS at {url} refused the credentials in {_source(cfg, path)}: {why}"


async def connect(cfg: config_mod.JobConfig, **options: Any) -> nats.aio.client.Client:
    """`jetstream.connect` to the job's bus with its credentials; `Failed` with one line otherwise.
    ``options`` go to nats-py (tests shorten its timeouts)."""
    url = cfg.endpoints.nats_url
    path = creds_path(cfg)
    if path is not None:
        unusable = check_file(cfg, path)
        if unusable is not None:
            raise Failed(unusable)
    try:
        return await jetstream.connect(url, credentials=path, **options)
    except jetstream.Refused as exc:
        raise Failed(refused_line(cfg, url, path, str(exc))) from None
    except (OSError, nats.errors.Error, TimeoutError) as exc:
        raise Failed(f"endpoints.natsUrl: cannot reach NATS at {url}: {exc or type(exc).__name__}") from None
