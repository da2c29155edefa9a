"""What a job learns: the model, the prompts, the reward, an optional teacher and agent loop.

Imported by ``asyncrl_api.models`` (the spec tree) and by the workloads (model loading, datasets,
reward functions, judge/teacher clients, agent loop).
"""

from __future__ import annotations

from typing import Annotated, Literal

import pydantic

from asyncrl_api import base

HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Attention head sizes vLLM's CPU and GPU attention backends accept."""

IMPORT_PATH = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
"""A Python callable as "package.module:function"."""

_TINY_RULES = (
    base.Rule(
        cel="self.hidden % self.heads == 0 && (self.hidden / self.heads) in " + str(list(HEAD_DIMS)),
        message="hidden / heads (the head size) must be one of " + ", ".join(map(str, HEAD_DIMS)),
        field_path=".heads",
        check=lambda m: m.hidden % m.heads == 0 and m.hidden // m.heads in HEAD_DIMS,
    ),
)


class TinyModelSpec(base.APIModel):
    """A tiny randomly initialised Llama-architecture model with a character-level tokenizer, created
    at model.path when nothing is there yet (deterministic from the seed). For tests and the local runner."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_TINY_RULES))

    kind: Literal["tiny"] = "tiny"
    """What to create. Only `tiny` today."""
    seed: int = pydantic.Field(default=0, ge=0, le=2**31 - 1)
    """Seed for the initial weights."""
    layers: int = pydantic.Field(default=2, ge=1, le=32)
    """Decoder layers."""
    hidden: int = pydantic.Field(default=128, ge=32, le=4096)
    """Hidden size."""
    heads: int = pydantic.Field(default=2, ge=1, le=64)
    """Attention heads; hidden / heads must be a head size vLLM supports (e.g. 64)."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> TinyModelSpec:
        base.check_rules(self, _TINY_RULES)
        return self


class ModelSpec(base.APIModel):
    """The policy model. Never downloaded at run time: a path on a volume or baked into the image."""

    path: Annotated[
        str, pydantic.Field(min_length=1, max_length=4096, json_schema_extra=base.immutable("model.path"))
    ]
    """Directory of a Hugging Face-format model (config, weights, tokenizer). Immutable."""
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = "bfloat16"
    """Weight and compute dtype for both roles (CPU runs use float32)."""
    create: TinyModelSpec | None = None
    """If set and model.path holds no model yet, create a tiny model there (tests, local runs)."""


class DataSpec(base.APIModel):
    """Prompts the rollouts generate from."""

    prompts: str = pydantic.Field(min_length=1, max_length=4096)
    """A JSONL file of records (one prompt each), or `builtin:<task>` for a synthetic task shipped
    with asyncrl (its reward comes with it)."""
    validation: str | None = pydantic.Field(default=None, min_length=1, max_length=4096)
    """Optional JSONL file (or `builtin:<task>`) the trainer evaluates on."""
    prompt_key: str = pydantic.Field(default="prompt", min_length=1, max_length=256)
    """Record field holding the prompt text; the whole record is passed to the reward function."""


class SecretKeyRef(base.APIModel):
    """A key of a Secret in the job's namespace."""

    name: str = pydantic.Field(min_length=1, max_length=253)
    """Secret name."""
    key: str = pydantic.Field(default="apiKey", min_length=1, max_length=253)
    """Key within the Secret."""


class EndpointSpec(base.APIModel):
    """An OpenAI-compatible endpoint (judge, teacher): base URL + model id + API key from a Secret."""

    base_url: str = pydantic.Field(alias="baseURL", min_length=1, max_length=2048, pattern=r"^https?://")
    """Base URL, e.g. http://judge.models.svc:8000/v1."""
    model: str = pydantic.Field(min_length=1, max_length=512)
    """Model id sent in each request."""
    api_key_secret: SecretKeyRef | None = None
    """Secret key holding the API key (sent as a Bearer token); unset for endpoints without auth."""
    timeout_seconds: float = pydantic.Field(default=60.0, gt=0.0, le=3600.0)
    """Per-request timeout."""


class RateLimit(base.APIModel):
    """Token bucket applied to requests against an endpoint."""

    rps: float = pydantic.Field(default=10.0, gt=0.0, le=100_000.0)
    """Sustained requests per second."""
    burst: int = pydantic.Field(default=20, ge=1, le=100_000)
    """Bucket size: requests allowed at once after idling."""


_REWARD_RULES = (
    base.Rule(
        cel="self.type != 'judge' || has(self.endpoint)",
        message="reward.type judge needs reward.endpoint",
        field_path=".endpoint",
        check=lambda r: r.type != "judge" or r.endpoint is not None,
    ),
    base.Rule(
        cel="self.type != 'function' || !has(self.endpoint)",
        message="reward.endpoint is only used with reward.type judge",
        field_path=".endpoint",
        check=lambda r: r.type != "function" or r.endpoint is None,
    ),
)


class RewardSpec(base.APIModel):
    """How a trajectory is scored."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_REWARD_RULES))

    type: Literal["function", "judge"] = "function"
    """function: a Python rule function; judge: a generative reward model behind an endpoint."""
    function: str | None = pydantic.Field(default=None, pattern=IMPORT_PATH, max_length=512)
    """For type function: "package.module:fn" called as fn(record, response_text) -> float. Required
    unless data.prompts is `builtin:<task>`, whose task supplies its reward."""
    endpoint: EndpointSpec | None = None
    """For type judge: the judge endpoint."""
    rate_limit: RateLimit = pydantic.Field(default_factory=RateLimit)
    """Token-bucket limit on judge requests."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> RewardSpec:
        base.check_rules(self, _REWARD_RULES)
        return self


class TeacherSpec(base.APIModel):
    """An optional teacher whose logprobs regularise the policy (on-policy distillation)."""

    endpoint: EndpointSpec
    """The teacher endpoint (must return prompt logprobs)."""
    kl_coef: float = pydantic.Field(default=0.1, ge=0.0, le=100.0)
    """Weight of the reverse-KL term to the teacher."""


class AgentSpec(base.APIModel):
    """An optional multi-turn tool-calling loop around generation (verl's agent loop)."""

    loop: Literal["single", "tool"] = "tool"
    """single: one assistant turn; tool: the model may call tools, whose output is appended (masked)."""
    max_user_turns: int = pydantic.Field(default=1, ge=1, le=256)
    """Maximum user turns per trajectory."""
    max_assistant_turns: int = pydantic.Field(default=4, ge=1, le=256)
    """Maximum assistant turns per trajectory."""
    max_parallel_calls: int = pydantic.Field(default=1, ge=1, le=64)
    """Tool calls executed concurrently within one turn."""
    tools: list[Annotated[str, pydantic.Field(pattern=IMPORT_PATH, max_length=512)]] = pydantic.Field(
        default_factory=list, max_length=64
    )
    """Tools as "package.module:fn"; a record's `tools` field may select a subset per sample."""
