"""One endpoint's settings, flat: where it is, its key, and the limits the client applies.

``judge(spec)`` is called by ``rewards/scorer.py`` (rollout replicas), ``teacher(spec)`` by the trainer's
rank 0; tests build an ``Endpoint`` directly (a give-up after 1 s, a fault server's URL). The API key
comes from the env var the operator renders from the Secret (``asyncrl_api.config.JUDGE_API_KEY_ENV`` /
``TEACHER_API_KEY_ENV``) and is kept exactly as it is: a key with a trailing newline (``kubectl create
secret --from-file`` of an ``echo``-made file) is a classic user error, and stripping it here would hide
it from the user while it still fails elsewhere. The 401 message says to check for stray whitespace.
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from collections.abc import Mapping

from asyncrl_api import config as config_api
from asyncrl_api import models as models_api
from asyncrl_api import task as task_api

JUDGE_API_KEY_ENV = config_api.JUDGE_API_KEY_ENV
TEACHER_API_KEY_ENV = config_api.TEACHER_API_KEY_ENV


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible endpoint as the client uses it."""

    name: str
    """judge or teacher: the ``endpoint`` label of the metrics and the word in every message."""
    base_url: str
    """Base URL including the API prefix (http://host:8000/v1)."""
    model: str
    """Model id sent with each request."""
    api_key: str | None = dataclasses.field(default=None, repr=False)
    """Bearer token, never logged or put in a message; None for endpoints without auth."""
    key_ref: str | None = None
    """Where the key comes from, for messages: "Secret s key k" (or "env NAME" for a local run's key
    without a Secret); None when no key is configured."""
    timeout: float = 60.0
    """Total deadline of each attempt in seconds: connect, send and read the whole answer."""
    max_concurrency: int = 16
    """Attempts in flight at once from this process."""
    max_retries: int = 5
    """Retries of a retryable failure (RateLimited, Unreachable, ServerError) after the first attempt."""
    give_up_after: float = 300.0
    """Seconds of nothing but failures (from the start of the first failed attempt) after which
    ``Client.gave_up`` returns the error and no retry starts."""
    rps: float | None = None
    """Token-bucket rate in attempts per second; None: no bucket."""
    burst: int = 1
    """Token-bucket size."""

    def host_port(self) -> str:
        """host:port of base_url (the scheme's default port when none is written)."""
        url = urllib.parse.urlsplit(self.base_url)
        port = url.port or (443 if url.scheme == "https" else 80)
        return f"{url.hostname}:{port}"


def judge(spec: models_api.AsyncRLJobSpec, env: Mapping[str, str] | None = None) -> Endpoint:
    """reward.endpoint with reward.rateLimit (or its defaults); ValueError when the job has no judge."""
    if spec.reward.endpoint is None:
        raise ValueError("reward.endpoint is not set: the job has no judge")
    limit = spec.reward.judge_rate_limit()
    return from_spec("judge", spec.reward.endpoint, limit, JUDGE_API_KEY_ENV, env)


def teacher(spec: models_api.AsyncRLJobSpec, env: Mapping[str, str] | None = None) -> Endpoint:
    """teacher.endpoint with teacher.rateLimit (None: no bucket); ValueError when the job has no teacher."""
    if spec.teacher is None:
        raise ValueError("spec.teacher is not set: the job has no teacher")
    return from_spec("teacher", spec.teacher.endpoint, spec.teacher.rate_limit, TEACHER_API_KEY_ENV, env)


def from_spec(
    name: str,
    spec: task_api.EndpointSpec,
    limit: task_api.RateLimit | None,
    key_env: str,
    env: Mapping[str, str] | None = None,
) -> Endpoint:
    """The Endpoint of an EndpointSpec; the key is read from ``key_env`` in ``env`` (os.environ), where
    the operator renders the Secret (the local runner passes its own variable of that name through)."""
    environ = os.environ if env is None else env
    secret = spec.api_key_secret
    key = environ.get(key_env) or None
    ref = f"Secret {secret.name} key {secret.key}" if secret is not None else None
    return Endpoint(
        name=name,
        base_url=spec.base_url,
        model=spec.model,
        api_key=key,
        key_ref=ref if ref is not None or key is None else f"env {key_env}",
        timeout=spec.timeout_seconds,
        max_concurrency=spec.max_concurrency,
        max_retries=spec.max_retries,
        give_up_after=spec.give_up_after_seconds,
        rps=limit.rps if limit is not None else None,
        burst=limit.burst if limit is not None else 1,
    )
