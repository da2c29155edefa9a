"""What a verl config trains, read by value with verl's own defaults (verl 0.9.1's
``_generated_ppo_trainer.yaml``; the fully_async and one_step_off recipes), as spec.trainer.algorithm
fields (docs/algorithms.md has them side by side). Used by ``importer/verl.py``: each aspect is the rule
of every key it reads and is also written when no key names it, so a verl default that differs from
asyncrl's (``clip_ratio_c`` 3.0, ``clip_ratio_high`` 0.2) is written and an unset ``adv_estimator`` is
verl's ``gae``. What asyncrl cannot train is refused, naming the key and what the job would do instead.
"""

from __future__ import annotations

from typing import Any

from asyncrl_workloads.importer import rules
from asyncrl_workloads.importer.rules import Context, Derived, Skip, To, part, refused

AR = "actor_rollout_ref."
ACTOR, ROLLOUT = AR + "actor.", AR + "rollout."
RC = "algorithm.rollout_correction."
A = "trainer.algorithm."
GROUP = ("grpo", "rloo", "reinforce++-baseline")
_ESTIMATORS = {
    "grpo": "grpo",
    "rloo": "rloo",
    "reinforce_plus_plus": "reinforce++",
    "reinforce_plus_plus_baseline": "reinforce++-baseline",
}
_LOSSES = {"vanilla": "ppo", "gspo": "gspo", "cispo": "cispo", "sapo": "sapo"}
_AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
_KL = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}
_OVERLONG = (
    "reward_model.overlong_buffer.",
    "reward_model.reward_kwargs.overlong_buffer_cfg.",
    "reward.reward_kwargs.overlong_buffer_cfg.",
)
CRITIC = "critic."


def _critic(ctx: Context) -> Derived:
    """adv_estimator gae: PPO with a critic (name gae), its gamma and lam, and the critic's learning rate,
    value clip and starting model with verl's defaults (critic.optim.lr 1e-5, cliprange_value 0.5, the
    actor's model)."""
    fields: dict[str, Any] = {A + "name": "gae"}
    for key, field in (("algorithm.gamma", "gamma"), ("algorithm.lam", "lam")):
        if ctx.number(key, 1.0) != 1.0:
            fields[A + field] = ctx.number(key, 1.0)
    critic: dict[str, Any] = {}
    if ctx.number(CRITIC + "optim.lr", 1e-5) != 1e-5:
        critic["lr"] = ctx.number(CRITIC + "optim.lr", 1e-5)
    if ctx.number(CRITIC + "cliprange_value", 0.5) != 0.5:
        critic["valueClip"] = ctx.number(CRITIC + "cliprange_value", 0.5)
    path = ctx.get(CRITIC + "model.path")
    if path is not None and path != ctx.get(AR + "model.path"):
        critic["path"] = path
    if critic:
        fields[A + "critic"] = critic
    note = "adv_estimator gae: PPO with a critic (name gae: a value model from the policy's base, GAE, fsdp2)"
    return Derived(fields, [note])


def critic_key(note: str) -> To:
    """The rule of a critic.* key the critic reads: part of the estimator with adv_estimator gae, not
    mapped otherwise (verl's resolved config carries the critic's section whatever the estimator)."""
    rule = part(estimator, "critic", note=note)

    def convert(value: Any, ctx: Context) -> Any:
        if ctx.get("algorithm.adv_estimator", "gae") != "gae":
            raise Skip("verl builds the critic for adv_estimator gae only; this config's estimator has none")
        return rule.convert(value, ctx)

    return To(rule.target, convert, note)


def estimator(ctx: Context) -> Derived:
    """algorithm.adv_estimator (verl's default gae), norm_adv_by_std_in_grpo, gamma, lam, the critic's
    settings; rollout.n."""
    source = ctx.get("algorithm.adv_estimator", "gae")
    if source == "gae":
        return _critic(ctx)
    if source not in _ESTIMATORS:
        return refused(
            "algorithm.adv_estimator",
            f"{source!r}: asyncrl has gae, grpo, rloo, reinforce_plus_plus and reinforce_plus_plus_baseline"
            " (docs/algorithms.md); the job would train grpo instead",
        )
    name = _ESTIMATORS[source]
    n = ctx.get(ROLLOUT + "n", 1)
    if name in GROUP and n == 1:
        return refused(
            ROLLOUT + "n",
            f"1 sample per prompt (verl's default) with algorithm.adv_estimator {source}: every sample is"
            " its own group, so every advantage would be 0 and nothing would train (admission refuses it);"
            " set rollout.n to 2 or more, or use reinforce_plus_plus",
        )
    fields: dict[str, Any] = {A + "name": name}
    if name == "grpo" and ctx.get("algorithm.norm_adv_by_std_in_grpo", True) is False:
        fields[A + "groupStd"] = False
    if name == "reinforce++" and ctx.number("algorithm.gamma", 1.0) != 1.0:
        fields[A + "gamma"] = ctx.number("algorithm.gamma", 1.0)
    return Derived(fields)


def loss(ctx: Context) -> Derived:
    """actor.policy_loss.loss_mode, clip ratios, dual-clip, SAPO's gates, loss_agg_mode."""
    mode = ctx.get(ACTOR + "policy_loss.loss_mode", "vanilla")
    if mode not in _LOSSES:
        return refused(
            ACTOR + "policy_loss.loss_mode",
            f"{mode!r}: asyncrl's losses are vanilla (PPO-clip), gspo, cispo and sapo; the job would train"
            " PPO-clip instead",
        )
    clip = ctx.number(ACTOR + "clip_ratio", 0.2)
    low = ctx.number(ACTOR + "clip_ratio_low", clip)
    fields: dict[str, Any] = {
        A + "policyLoss": _LOSSES[mode],
        A + "clipLow": min(low, 1.0),
        A + "clipHigh": ctx.number(ACTOR + "clip_ratio_high", clip),
    }
    notes = []
    if low > 1.0:
        notes.append(
            f"clip_ratio_low {low}: a lower clip at or below 0 never binds (ratios are positive): clipLow 1.0"
        )
    agg = ctx.get(ACTOR + "loss_agg_mode", "token-mean")
    if agg not in _AGGREGATIONS:
        return refused(ACTOR + "loss_agg_mode", f"{agg!r}: asyncrl aggregates by {', '.join(_AGGREGATIONS)}")
    if mode == "vanilla":
        dual = ctx.number(ACTOR + "clip_ratio_c", 3.0)
        if dual <= 1.0:
            return refused(ACTOR + "clip_ratio_c", f"{dual}: verl asserts clip_ratio_c > 1")
        fields[A + "clipRatioC"] = dual
        notes.append(
            f"verl's vanilla PPO loss always dual-clips (clip_ratio_c, 3.0 unless set): clipRatioC {dual}"
        )
    if mode == "sapo":
        fields[A + "sapo"] = {
            "tauPos": ctx.number(ACTOR + "tau_pos", 1.0),
            "tauNeg": ctx.number(ACTOR + "tau_neg", 1.05),
        }
        if agg != "seq-mean-token-mean":
            notes.append(
                f"verl's sapo loss aggregates by seq-mean-token-mean whatever loss_agg_mode ({agg}) says"
            )
        agg = "seq-mean-token-mean"
    if agg != "token-mean":
        fields[A + "lossAggregation"] = agg
    scale = ctx.get(ACTOR + "loss_scale_factor")
    if agg == "seq-mean-token-sum-norm" and scale is not None:
        fields[A + "lossScaleFactor"] = int(scale)
    return Derived(fields, notes)


def entropy(ctx: Context) -> Derived:
    coef = ctx.number(ACTOR + "entropy_coeff", 0.0)
    return Derived({A + "entropyCoef": coef} if coef else {})


def kl(ctx: Context) -> Derived:
    """actor.use_kl_loss / kl_loss_coef / kl_loss_type; algorithm.use_kl_in_reward / kl_ctrl / kl_penalty."""
    in_loss = ctx.get(ACTOR + "use_kl_loss", False) is True
    in_reward = ctx.get("algorithm.use_kl_in_reward", False) is True
    if in_loss and in_reward:
        return refused(
            "algorithm.use_kl_in_reward",
            "verl adds a KL loss (actor.use_kl_loss) and a KL reward penalty at once; asyncrl has one"
            " placement (klPlacement loss or reward): the job would drop one of them",
        )
    if not (in_loss or in_reward):
        return Derived({A + "kl": 0.0})
    key = ACTOR + "kl_loss_type" if in_loss else "algorithm.kl_penalty"
    kind = ctx.get(key, "low_var_kl" if in_loss else "kl")
    if kind not in _KL:
        return refused(
            key,
            f"{kind!r}: asyncrl's KL estimators are k1 (kl), k2 (mse), k3 (low_var_kl) and abs; verl's full"
            " and straight-through (+) variants are not built",
        )
    coef = ctx.number(ACTOR + "kl_loss_coef" if in_loss else "algorithm.kl_ctrl.kl_coef", 0.001)
    if coef == 0:
        return Derived({A + "kl": 0.0}, ["KL coefficient 0: no reference policy is built"])
    fields: dict[str, Any] = {A + "kl": coef, A + "klPlacement": "loss" if in_loss else "reward"}
    fields[A + "klEstimator"] = _KL[kind]
    if in_reward and ctx.get("algorithm.kl_ctrl.type", "fixed") == "adaptive":
        fields[A + "klTarget"] = ctx.number("algorithm.kl_ctrl.target_kl", 0.1)
        fields[A + "klHorizon"] = int(ctx.number("algorithm.kl_ctrl.horizon", 10000))
    elif in_reward and ctx.get("algorithm.kl_ctrl.type", "fixed") != "fixed":
        return refused("algorithm.kl_ctrl.type", "asyncrl's KL controllers are fixed and adaptive")
    return Derived(fields)


def _behaviour_key(ctx: Context) -> str | None:
    """The key that makes verl train PPO against the rollout's log-probs, or None."""
    if ctx.get(RC + "bypass_mode", False) is True:
        return RC + "bypass_mode"
    if ctx.get("async_training.compute_prox_log_prob", False) is True:
        return None
    for key in (ACTOR + "use_rollout_log_probs", "async_training.use_rollout_log_probs"):
        if ctx.get(key) is True:
            return key
    return None


def _bounds(spec: Any) -> tuple[float | None, float]:
    """verl's threshold: ``2.0`` (an upper bound) or ``"0.5_2.0"`` (lower_upper)."""
    text = str(spec)
    if "_" in text:
        lower, upper = text.split("_", 1)
        return float(lower), float(upper)
    return None, float(text)


def correction(ctx: Context) -> Derived:
    """What verl takes the PPO ratio against and how it corrects for the rollout's policy (bypass_mode,
    use_rollout_log_probs / compute_prox_log_prob, rollout_is, rollout_rs)."""
    is_level, rs = ctx.get(RC + "rollout_is"), ctx.get(RC + "rollout_rs")
    behaviour = _behaviour_key(ctx)
    if behaviour is not None:
        for key, value in ((RC + "rollout_is", is_level), (RC + "rollout_rs", rs)):
            if value:
                return refused(
                    key,
                    f"with {behaviour} the PPO ratio is taken against the rollout's log-probs and verl"
                    " corrects inside the loss; asyncrl's correction none applies no weight, and its filters"
                    " need the proximal policy (correction decoupled): the job would train without it",
                )
        if ctx.get(RC + "loss_type", "ppo_clip") != "ppo_clip":
            return refused(RC + "loss_type", "asyncrl's bypass is PPO-clip against the behaviour log-probs")
        return Derived(
            {A + "correction": "none"},
            [
                f"{behaviour}: PPO against the behaviour (rollout) log-probs, no proximal policy:"
                " correction none"
            ],
        )
    if ctx.get(RC + "rollout_is_batch_normalize", False) is True:
        return refused(
            RC + "rollout_is_batch_normalize", "asyncrl does not renormalise the weights per batch"
        )
    if is_level and rs:
        return refused(
            RC + "rollout_rs",
            "verl applies a truncated weight (rollout_is) and a rejection mask (rollout_rs) together; asyncrl"
            " applies one (correction tis, or decoupled with rejection): the job would drop one of them",
        )
    if is_level == "sequence":
        return refused(
            RC + "rollout_is",
            "verl's sequence weight is the product of the token ratios; asyncrl's sequence weight is their"
            " geometric mean (AReaL's): the job would weight sequences differently",
        )
    if is_level == "token":
        lower, upper = _bounds(ctx.get(RC + "rollout_is_threshold", 2.0))
        if lower is None and 1.0 <= upper <= 100.0:
            return Derived({A + "correction": "tis", A + "isCap": upper})
        bound = {"level": "token", "action": "mask" if lower is not None else "clamp", "metric": "ratio"}
        return Derived({A + "correction": "decoupled", A + "rejection": {**bound, **_range(lower, upper)}})
    if is_level:
        return refused(RC + "rollout_is", f"{is_level!r}: verl's levels are token and sequence")
    if rs:
        return _rejection(str(rs), ctx.get(RC + "rollout_rs_threshold"))
    return Derived(
        {A + "correction": "decoupled"},
        [
            "verl recomputes pi_old and weights nothing (rollout_is null): its rollout is on-policy;"
            " asyncrl's"
            " samples may be policy versions old: correction decoupled (weight pi_prox/pi_behav, tokens"
            " above isCap 2 leave the loss)"
        ],
    )


def _range(lower: float | None, upper: float) -> dict[str, float]:
    return {"upper": upper} if lower is None else {"lower": lower, "upper": upper}


def _rejection(option: str, threshold: Any) -> Derived:
    """verl's rollout_rs as a rejection: k1 options bound the ratio (verl keeps -log r in [log lower,
    log upper], i.e. r in [1/upper, 1/lower]); k2 bounds 0.5 (log r)^2 as asyncrl's k2 does."""
    key = RC + "rollout_rs"
    if "," in option:
        return refused(key, f"{option!r}: asyncrl applies one rejection criterion")
    level, _, metric = option.rpartition("_")
    levels = {"token": ("token", "mean"), "seq_sum": ("sequence", "sum"), "seq_mean": ("sequence", "mean")}
    levels["seq_max"] = ("sequence", "max")
    if level not in levels or metric not in ("k1", "k2", "k3"):
        return refused(key, f"{option!r}: not one of verl's rejection options")
    if metric == "k3":
        return refused(
            key,
            f"{option!r}: verl's k3 here is r - 1 - log r (KL(pi_rollout || pi_train)); asyncrl's rejection"
            " k3 is AReaL's 1/r - 1 + log r: the job would filter on another quantity",
        )
    if threshold is None:
        return refused(RC + "rollout_rs_threshold", "verl requires a threshold with rollout_rs")
    where, agg = levels[level]
    lower, upper = _bounds(threshold)
    if metric == "k1":
        lower = lower if lower is not None else 1.0 / upper
        bounds = {"lower": 1.0 / upper, "upper": 1.0 / lower}
        spec = {"level": where, "action": "mask", "metric": "ratio", "agg": agg, **bounds}
    else:
        spec = {"level": where, "action": "mask", "metric": "k2", "agg": agg, "upper": upper}
    if where == "token":
        del spec["agg"]
    return Derived(
        {A + "correction": "decoupled", A + "rejection": spec},
        [
            "rollout_rs: asyncrl also weights the tokens it keeps by pi_prox/pi_behav (AReaL's decoupled PPO;"
            " verl applies only the mask when rollout_is is null)"
            + (", one geometric-mean weight per sequence" if where == "sequence" and metric == "k1" else "")
        ],
    )


def overlong(ctx: Context) -> Derived:
    """DAPO's overlong buffer (verl's dapo reward manager: reward_model.overlong_buffer, or
    reward_kwargs.overlong_buffer_cfg in the fully_async DAPO scripts)."""
    prefix = next((p for p in _OVERLONG if ctx.get(p + "enable") is not None), None)
    if prefix is None or ctx.get(prefix + "enable") is not True:
        return Derived()
    manager = ctx.get("reward_model.reward_manager") or ctx.get("reward.reward_manager.name")
    if manager not in (None, "dapo"):
        return Derived(
            notes=[f"{prefix}enable: verl applies it in its dapo reward manager only, not {manager}"]
        )
    limit = prefix.replace("overlong_buffer_cfg.", "max_resp_len")
    response = ctx.get("data.max_response_length")
    if prefix.endswith("overlong_buffer_cfg.") and ctx.get(limit) not in (None, response):
        return refused(
            limit,
            f"{ctx.get(limit)}: asyncrl's penalty zone ends at rollout.sampling.maxTokens"
            f" (data.max_response_length {response})",
        )
    length = ctx.get(prefix + "len")
    if not isinstance(length, int) or length < 1:
        return refused(prefix + "len", f"{length!r}: the buffer needs a length in tokens")
    factor = ctx.number(prefix + "penalty_factor", 1.0)
    return Derived({A + "overlong": {"bufferTokens": length, "penaltyFactor": factor}})


def dynamic_sampling(ctx: Context) -> Derived:
    """DAPO's algorithm.filter_groups (recipe/dapo)."""
    if ctx.get("algorithm.filter_groups.enable", False) is not True:
        return Derived()
    metric = ctx.get("algorithm.filter_groups.metric", "acc")
    return Derived(
        {A + "dynamicSampling": {}},
        [
            f"filter_groups: asyncrl drops groups whose rewards are all equal (verl compares metric {metric})"
            " and fills the step from the queue, at most dynamicSampling.maxDropsPerStep (64) groups"
        ],
    )


MODEL = AR + "model."
LORA = "trainer.lora"


def lora(ctx: Context) -> Derived:
    """model.lora_rank (> 0: peft LoRA on the FSDP policy; 0: full fine-tuning), lora_alpha (verl's
    default 16), target_modules (default all-linear), exclude_modules; model.lora.* is verl's
    Megatron-Bridge LoRA, which asyncrl's megatron backend does not have."""
    megatron_rank = ctx.get(MODEL + "lora.rank", 0)
    if megatron_rank:
        return refused(
            MODEL + "lora.rank",
            f"{megatron_rank}: model.lora is verl's Megatron-Bridge LoRA (strategy megatron); asyncrl's LoRA"
            " is peft on backend fsdp2 only, so the job would train all weights: use strategy fsdp with"
            " model.lora_rank, lora_alpha and target_modules",
        )
    rank = ctx.get(MODEL + "lora_rank", 0)
    if rank == 0:
        return Derived()
    if ctx.get(ACTOR + "strategy", "fsdp") == "megatron":
        return refused(
            MODEL + "lora_rank",
            f"LoRA rank {rank} with strategy megatron: asyncrl's trainer.lora is built on backend fsdp2 only"
            " (admission refuses it with megatron); use strategy fsdp",
        )
    alpha = ctx.get(MODEL + "lora_alpha", 16)
    if (bad := rules.lora_bounds(MODEL + "lora_rank", rank, alpha)) is not None:
        return bad
    targets = ctx.cfg.get(MODEL + "target_modules", "all-linear")
    if targets is None:
        return refused(
            MODEL + "target_modules",
            "null: peft then adapts the model type's defaults (q_proj and v_proj on Llama/Qwen); name the"
            " modules or use all-linear",
        )
    try:
        modules = rules.lora_modules(targets, ctx.get(MODEL + "exclude_modules"))
    except Skip as exc:
        return refused(MODEL + "target_modules", f"{exc}; the job would adapt other layers")
    notes = [
        f"LoRA rank {rank}, alpha {alpha} on {', '.join(modules)}: trainer.lora (peft on fsdp2; the weight"
        " sync sends the adapter alone, vLLM serves it); actor.optim.lr is the adapters' learning rate"
    ]
    if targets in ("all-linear", ["all-linear"]):
        notes.append(rules.LORA_ALL_LINEAR)
    return Derived({LORA: {"rank": rank, "alpha": alpha, "targetModules": modules}}, notes)


ASPECTS = (estimator, loss, entropy, kl, correction, overlong, dynamic_sampling, lora)
