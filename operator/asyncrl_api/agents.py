"""The agents a gateway job runs itself: ``spec.agent.workers``.

Imported by ``asyncrl_api.task`` (``AgentSpec.workers``), the operator's ``render.agents`` (the Deployment
``<job>-agent``) and the local runner (the same pods as local processes). A worker pod runs either the
user's own agent program (``command``/``args``: it opens sessions with the admin key itself, as
examples/agents/lookup_agent.py does) or a command-line agent run once per session by the builtin driver
(``sessionCommand``: ``asyncrl agent -- CMD``, which opens the groups and wires each session into the
process's environment). Env vars mirror Kubernetes' EnvVar / EnvFromSource, restricted to what an agent
needs (values, Secret and ConfigMap keys); the gateway's URL and admin key are the operator's to set.
"""

from __future__ import annotations

from typing import Annotated

import pydantic

from asyncrl_api import base, roles

ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
"""Kubernetes' rule for an env var name."""
GATEWAY_URL_ENV = "ASYNCRL_GATEWAY_URL"
GATEWAY_ADMIN_KEY_ENV = "ASYNCRL_GATEWAY_ADMIN_KEY"
RESERVED_ENV = (GATEWAY_URL_ENV, GATEWAY_ADMIN_KEY_ENV)
"""Set by the operator on every worker: the gateway's Service URL and the admin key's secretKeyRef."""
Arg = Annotated[str, pydantic.Field(max_length=4096)]


class NamedRef(base.APIModel):
    """A Secret or ConfigMap in the job's namespace."""

    name: str = pydantic.Field(min_length=1, max_length=253)
    """Its name."""
    optional: bool = False
    """Start the pod even when it (or the key) is missing; the variables are then unset."""


class KeySelector(NamedRef):
    """A key of a Secret or ConfigMap in the job's namespace."""

    key: str = pydantic.Field(min_length=1, max_length=253)
    """Key within it."""


def _exactly_one(what: str, first: tuple[str, str], second: tuple[str, str]) -> base.Rule:
    """``what`` takes exactly one of two fields, each given as (camelCase name, attribute)."""
    return base.Rule(
        cel=f"has(self.{first[0]}) != has(self.{second[0]})",
        message=f"{what} takes exactly one of {first[0]} and {second[0]}",
        check=lambda s: (getattr(s, first[1]) is None) != (getattr(s, second[1]) is None),
    )


_SOURCE_RULES = (
    _exactly_one("valueFrom", ("secretKeyRef", "secret_key_ref"), ("configMapKeyRef", "config_map_key_ref")),
)


class EnvVarSource(base.APIModel):
    """Where a variable's value comes from (a subset of Kubernetes' EnvVarSource)."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_SOURCE_RULES))

    secret_key_ref: KeySelector | None = None
    """A key of a Secret (an API key of the agent's own tools, say)."""
    config_map_key_ref: KeySelector | None = None
    """A key of a ConfigMap."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> EnvVarSource:
        base.check_rules(self, _SOURCE_RULES)
        return self


_ENV_RULES = (
    base.Rule(
        cel="!(has(self.value) && has(self.valueFrom))",
        message="an env var takes value or valueFrom, not both",
        field_path=".valueFrom",
        check=lambda e: e.value is None or e.value_from is None,
    ),
    base.Rule(
        cel=" && ".join(f"self.name != '{name}'" for name in RESERVED_ENV),
        message=f"{' and '.join(RESERVED_ENV)} are set by the operator (the gateway's URL and admin key)",
        field_path=".name",
        check=lambda e: e.name not in RESERVED_ENV,
    ),
)


class EnvVar(base.APIModel):
    """One environment variable of the worker container."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_ENV_RULES))

    name: str = pydantic.Field(min_length=1, max_length=256, pattern=ENV_NAME)
    """Variable name."""
    value: str | None = pydantic.Field(default=None, max_length=65536)
    """Literal value (never a secret: use valueFrom.secretKeyRef)."""
    value_from: EnvVarSource | None = None
    """A Secret or ConfigMap key."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> EnvVar:
        base.check_rules(self, _ENV_RULES)
        return self


_ENV_FROM_RULES = (_exactly_one("envFrom", ("secretRef", "secret_ref"), ("configMapRef", "config_map_ref")),)


class EnvFromSource(base.APIModel):
    """Every key of a Secret or ConfigMap as a variable (Kubernetes' EnvFromSource)."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_ENV_FROM_RULES))

    prefix: str | None = pydantic.Field(default=None, max_length=256, pattern=ENV_NAME)
    """Prepended to each key."""
    secret_ref: NamedRef | None = None
    """A Secret."""
    config_map_ref: NamedRef | None = None
    """A ConfigMap."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> EnvFromSource:
        base.check_rules(self, _ENV_FROM_RULES)
        return self


_WORKER_RULES = (
    base.Rule(
        cel="!has(self.sessionCommand) || size(self.sessionCommand) == 0 || "
        "((!has(self.command) || size(self.command) == 0) && (!has(self.args) || size(self.args) == 0))",
        message="sessionCommand runs under the builtin driver (asyncrl agent): leave command and args unset",
        field_path=".sessionCommand",
        check=lambda w: not w.session_command or (not w.command and not w.args),
    ),
    base.Rule(
        cel="!has(self.sessionConcurrency) || (has(self.sessionCommand) && size(self.sessionCommand) > 0)",
        message="sessionConcurrency applies to sessionCommand only",
        field_path=".sessionConcurrency",
        check=lambda w: w.session_concurrency is None or bool(w.session_command),
    ),
)


class AgentWorkersSpec(base.APIModel):
    """Agents the job runs itself (with `agent.loop: gateway`): a Deployment `<job>-agent` of `replicas`
    pods, each given the gateway's Service URL (`ASYNCRL_GATEWAY_URL`) and the admin key
    (`ASYNCRL_GATEWAY_ADMIN_KEY`, from the gateway's Secret). They start once a rollout replica serves,
    run zero pods while the job is suspended or finished, and count against failurePolicy.maxRestarts."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_WORKER_RULES))

    image: str = pydantic.Field(
        default=roles.DEFAULT_ROLLOUT_IMAGE,
        min_length=1,
        max_length=roles.MAX_IMAGE_LENGTH,
        pattern=roles.IMAGE,
    )
    """The agent's image (default: the rollout image, which has `asyncrl agent` and the openai SDK)."""
    command: list[Arg] = pydantic.Field(default_factory=list, max_length=64)
    """The container's command: an agent that opens its own sessions (unset: the image's entrypoint)."""
    args: list[Arg] = pydantic.Field(default_factory=list, max_length=256)
    """The container's arguments."""
    session_command: list[Arg] = pydantic.Field(default_factory=list, max_length=256)
    """A command-line agent run once per session by the builtin driver (`asyncrl agent -- CMD`), e.g.
    `[claude, -p, "{prompt}"]`: `{prompt}` becomes the task's prompt (else it comes on stdin),
    `{base_url}` the session's OpenAI base URL (Codex CLI takes it only in its config:
    docs/agent-frameworks.md), and the session's URL and key come in OPENAI_BASE_URL/OPENAI_API_KEY,
    ANTHROPIC_BASE_URL/ANTHROPIC_API_KEY and ASYNCRL_SESSION_URL/ASYNCRL_SESSION_KEY. A run still going
    at 90% of the gateway's sessionTimeoutSeconds is killed and its session aborted (never trained on)."""
    session_concurrency: int | None = pydantic.Field(default=None, ge=1, le=1024)
    """Sessions one worker pod runs at once with sessionCommand (default 1)."""
    replicas: int = pydantic.Field(default=1, ge=0, le=1024)
    """Worker pods."""
    env: list[EnvVar] = pydantic.Field(default_factory=list, max_length=128)
    """Extra environment variables."""
    env_from: list[EnvFromSource] = pydantic.Field(default_factory=list, max_length=32)
    """Secrets and ConfigMaps whose keys all become variables."""
    resources: roles.Resources = pydantic.Field(default_factory=roles.Resources)
    """cpu, memory per worker pod (agents get no GPU)."""
    node_selector: dict[roles.LabelKey, roles.LabelValue] = pydantic.Field(
        default_factory=dict, max_length=64
    )
    """Node labels the worker pods must match."""
    tolerations: list[roles.Toleration] = pydantic.Field(default_factory=list, max_length=32)
    """Tolerations of the worker pods."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> AgentWorkersSpec:
        base.check_rules(self, _WORKER_RULES)
        return self

    def concurrency(self) -> int:
        return self.session_concurrency or 1
