"""What an AReaL config trains, read by value with AReaL 1.0.4's defaults (``areal/api/cli_args.py``
PPOActorConfig, NormConfig, RejectionSamplingConfig; ``areal/trainer/ppo/actor.py`` compute_advantages),
as spec.trainer.algorithm fields (docs/algorithms.md). Used by ``importer/areal.py``: each aspect is the
rule of every key it reads and is also written when no key names it.

AReaL's advantage is one pipeline: score' = (score + reward_bias) * reward_scaling, normalised by
reward_norm (group: GRPO, Dr.GRPO with std_level null, RLOO with mean_leave1out); token rewards = the
score' on the last token - kl_ctl * KL per token; returns by GAE with zero values (discount x
gae_lambda); then adv_norm (batch whitening). asyncrl's estimators are named functions of the same
steps, so the mapping is by value: reward_norm group -> grpo / rloo with adv_norm as advantageNorm; no
reward_norm with adv_norm batch -> reinforce++ (per-token returns, whitened; the whitening removes the
score's scale, so kl_ctl / reward_scaling is the same objective). What has no asyncrl equivalent (a
critic, M2PO, group std with leave-one-out, KL per token beside a group baseline) is refused; LoRA
is spec.trainer.lora.
"""

from __future__ import annotations

from typing import Any

from asyncrl_workloads.importer import rules
from asyncrl_workloads.importer.rules import Context, Derived, refused

A = "trainer.algorithm."
_KL_ESTIMATORS = ("k1", "k2", "k3")
_METRICS = {"ratio": "ratio", "kl_k1": "k1", "kl_k2": "k2", "kl_k3": "k3"}
_NO_FILTER = 1e6
"""asyncrl's largest rejection bound: a weight pi_prox/pi_behav above e^13.8 never occurs in practice."""


def _raw(ctx: Context, key: str, default: Any) -> Any:
    """The value as written, an explicit null kept (``std_level: null`` is Dr.GRPO, not the default)."""
    return ctx.cfg.get(key, default)


def _norm(ctx: Context, prefix: str) -> dict[str, Any] | None:
    """A NormConfig with AReaL's defaults, or None when unset (``reward_norm: null`` or absent)."""
    if not ctx.has(prefix):
        return None
    return {
        "mean": _raw(ctx, prefix + ".mean_level", "batch"),
        "std": _raw(ctx, prefix + ".std_level", "batch"),
        "loo": _raw(ctx, prefix + ".mean_leave1out", False) is True,
        "unbiased": _raw(ctx, prefix + ".std_unbiased", True) is not False,
        "eps": float(_raw(ctx, prefix + ".eps", 1e-5)),
        "group_size": _raw(ctx, prefix + ".group_size", 1),
    }


def kl_coef(ctx: Context) -> float:
    """actor.kl_ctl (AReaL's default 0.1), 0 when it is 0."""
    return float(ctx.number("actor.kl_ctl", 0.1))


def shaping(ctx: Context) -> tuple[bool, bool]:
    """(reward_scaling cancels, reward_bias cancels) in what AReaL computes from the score: a std
    normalisation after it removes the scale, a mean removal the bias."""
    reward, adv = _norm(ctx, "actor.reward_norm"), _norm(ctx, "actor.adv_norm")
    whitened = adv is not None and adv["std"] == "batch"
    if reward is None:
        return whitened, whitened and ctx.number("actor.discount", 1.0) * ctx.number(
            "actor.gae_lambda", 1.0
        ) == 1
    return reward["std"] is not None or whitened, reward["mean"] is not None


def _critic(ctx: Context) -> Derived:
    """A critic (AReaL's gsm8k_ppo): GAE over the score and the per-token KL reward with discount and
    gae_lambda, then adv_norm: asyncrl's name gae (verl's GAE) whitens over the batch's tokens, so the
    source must whiten too (adv_norm mean and std at batch level) and keep the raw score (no reward_norm)."""
    reward, adv = _norm(ctx, "actor.reward_norm"), _norm(ctx, "actor.adv_norm")
    if reward is not None:
        return refused(
            "actor.reward_norm",
            "with a critic: AReaL normalises the score before GAE; asyncrl's gae (verl's) takes the raw"
            " score",
        )
    if adv is None or adv["mean"] != "batch" or adv["std"] != "batch" or adv["loo"]:
        return refused(
            "actor.adv_norm",
            "with a critic: asyncrl's gae whitens the advantages over the batch (verl's masked_whiten); AReaL"
            " without adv_norm mean_level and std_level batch does not",
        )
    fields: dict[str, Any] = {A + "name": "gae"}
    for key, field in (("actor.discount", "gamma"), ("actor.gae_lambda", "lam")):
        if ctx.number(key, 1.0) != 1.0:
            fields[A + field] = ctx.number(key, 1.0)
    critic: dict[str, Any] = {}
    optimizer = ctx.get("critic.optimizer")
    lr = ctx.get("critic.optimizer.lr", optimizer.get("lr") if isinstance(optimizer, dict) else None)
    if lr is not None:
        critic["lr"] = float(lr)
    if ctx.number("critic.eps_clip", 0.5) != 0.5:
        critic["valueClip"] = ctx.number("critic.eps_clip", 0.5)
    path = ctx.get("critic.path")
    if path is not None and path != ctx.get("actor.path"):
        critic["path"] = path
    if critic:
        fields[A + "critic"] = critic
    coef = kl_coef(ctx)
    fields[A + "kl"] = coef
    if coef > 0:
        if not ctx.has("ref"):
            return refused("actor.kl_ctl", f"{coef} without a ref model: AReaL's KL is then against 0")
        estimator = ctx.get("actor.kl_estimator", "k1")
        if estimator not in _KL_ESTIMATORS:
            return refused("actor.kl_estimator", f"{estimator!r}: AReaL's estimators are k1, k2, k3")
        fields[A + "klPlacement"], fields[A + "klEstimator"] = "reward", estimator
    notes = [
        "critic: PPO with a critic (name gae, fsdp2): GAE, then whitening with verl's eps (1e-8 under the"
        f" root) where AReaL's adv_norm adds {adv['eps']} to the std"
    ]
    return Derived(fields, notes)


def advantage(ctx: Context) -> Derived:
    """reward_norm, adv_norm, discount, gae_lambda, kl_ctl, kl_estimator, reward_scaling; a critic."""
    if ctx.has("critic"):
        return _critic(ctx)
    reward, adv = _norm(ctx, "actor.reward_norm"), _norm(ctx, "actor.adv_norm")
    n = ctx.get("gconfig.n_samples", 1)
    discount = ctx.number("actor.discount", 1.0) * ctx.number("actor.gae_lambda", 1.0)
    coef, scale = kl_coef(ctx), float(ctx.number("actor.reward_scaling", 1.0))
    if coef > 0 and not ctx.has("ref"):
        return refused(
            "actor.kl_ctl",
            f"{coef} without a ref model: AReaL then takes the KL against log-probs of 0 (a term of"
            " -kl_ctl * log pi per token, not a KL); set actor.kl_ctl=0, or configure ref for a KL penalty",
        )
    fields: dict[str, Any] = {}
    notes: list[str] = []
    if reward is None:
        if adv is None or adv["mean"] != "batch" or adv["std"] != "batch" or adv["loo"]:
            return refused(
                "actor.adv_norm" if adv is not None else "actor.reward_norm",
                "no reward_norm and no batch whitening (adv_norm mean_level and std_level batch): AReaL"
                " trains"
                " on raw returns with no baseline; asyncrl's estimators all subtract one (reinforce++ is the"
                " returns whitened over the batch)",
            )
        fields[A + "name"] = "reinforce++"
        if discount != 1.0:
            fields[A + "gamma"] = discount
        notes.append(
            "no reward_norm, adv_norm batch: per-token returns whitened over the batch's tokens, asyncrl's"
            " reinforce++ (verl's masked_whiten: eps 1e-8 under the root where AReaL adds adv_norm.eps to"
            " the std)"
        )
        if coef > 0 and scale != 1.0:
            notes.append(
                f"kl = kl_ctl / reward_scaling = {coef} / {scale}: the whitening removes the score's scale"
            )
            coef = coef / scale
    else:
        if reward["mean"] == "batch" and reward["std"] is None:
            fields[A + "name"] = "ppo"
        elif reward["mean"] != "group":
            return refused(
                "actor.reward_norm.mean_level",
                f"{reward['mean']!r} with std_level {reward['std']!r}: asyncrl normalises scores by the"
                " prompt's"
                " group (grpo, rloo) or centres them on the batch mean (ppo)",
            )
        elif reward["group_size"] != n:
            return refused(
                "actor.reward_norm.group_size",
                f"{reward['group_size']}: AReaL normalises over groups of that many samples, asyncrl over the"
                f" prompt's {n} samples (gconfig.n_samples)",
            )
        elif n == 1:
            return refused("gconfig.n_samples", "1 sample per prompt: every group advantage would be 0")
        elif reward["std"] == "group" and not reward["loo"] and reward["unbiased"]:
            fields[A + "name"] = "grpo"
        elif reward["std"] is None and not reward["loo"]:
            fields[A + "name"], fields[A + "groupStd"] = "grpo", False
        elif reward["std"] is None:
            fields[A + "name"] = "rloo"
        else:
            return refused(
                "actor.reward_norm.std_level",
                f"{reward['std']!r} (mean_leave1out {reward['loo']}, std_unbiased {reward['unbiased']}):"
                " asyncrl's"
                " group estimators are grpo (unbiased group std), Dr.GRPO (no std) and rloo"
                " (leave-one-out, no std)",
            )
        if coef > 0:
            return refused(
                "actor.kl_ctl",
                f"{coef} with a group baseline: AReaL adds the KL per token after normalising the score"
                " (per-token"
                " returns); asyncrl's group estimators (as verl's) normalise the summed reward, KL"
                " included: the"
                " job would weigh the KL differently",
            )
        if discount != 1.0:
            return refused(
                "actor.discount" if ctx.number("actor.discount", 1.0) != 1.0 else "actor.gae_lambda",
                f"{discount}: AReaL discounts the score back over the tokens; asyncrl's group estimators give"
                " every token the sample's advantage",
            )
        if fields[A + "name"] == "grpo" and reward["std"] == "group":
            notes.append(
                f"group std: asyncrl adds 1e-6 (verl's eps) where AReaL adds reward_norm.eps {reward['eps']}"
            )
        if adv is not None:
            if adv["mean"] != "batch" or adv["std"] not in ("batch", None):
                return refused(
                    "actor.adv_norm.mean_level" if adv["mean"] != "batch" else "actor.adv_norm.std_level",
                    "asyncrl's advantageNorm is batch level (mean_level batch, std_level batch or null)",
                )
            fields[A + "advantageNorm"] = {
                "std": adv["std"] == "batch",
                "leaveOneOut": adv["loo"],
                "unbiased": adv["unbiased"],
                "eps": adv["eps"],
            }
    fields[A + "kl"] = coef
    if coef > 0:
        estimator = ctx.get("actor.kl_estimator", "k1")
        if estimator not in _KL_ESTIMATORS:
            return refused("actor.kl_estimator", f"{estimator!r}: AReaL's estimators are k1, k2, k3")
        fields[A + "klPlacement"], fields[A + "klEstimator"] = "reward", estimator
    return Derived(fields, notes)


def loss(ctx: Context) -> Derived:
    """eps_clip, eps_clip_higher, c_clip, importance_sampling_level, use_sapo_loss, M2PO."""
    if ctx.get("actor.m2_threshold") is not None:
        return refused("actor.m2_threshold", "M2PO is not built: the job would train PPO-clip")
    low = ctx.number("actor.eps_clip", 0.2)
    fields: dict[str, Any] = {
        A + "policyLoss": "ppo",
        A + "clipLow": low,
        A + "clipHigh": ctx.number("actor.eps_clip_higher", low),
    }
    level = ctx.get("actor.importance_sampling_level", "token")
    if level not in ("token", "sequence"):
        return refused("actor.importance_sampling_level", f"{level!r}: AReaL's levels are token and sequence")
    if ctx.get("actor.use_sapo_loss", False) is True:
        if level == "sequence":
            return refused(
                "actor.importance_sampling_level", "sequence with SAPO: asyncrl's SAPO is per token"
            )
        fields[A + "policyLoss"] = "sapo"
        fields[A + "sapo"] = {
            "tauPos": ctx.number("actor.sapo_tau_pos", 1.0),
            "tauNeg": ctx.number("actor.sapo_tau_neg", 1.05),
        }
    elif level == "sequence":
        fields[A + "policyLoss"] = "gspo"
    dual = ctx.get("actor.c_clip")
    if dual is not None:
        if fields[A + "policyLoss"] != "ppo":
            return refused(
                "actor.c_clip", f"dual-clip with {fields[A + 'policyLoss']}: asyncrl dual-clips PPO-clip only"
            )
        fields[A + "clipRatioC"] = dual
    return Derived(fields)


def _rejection(ctx: Context) -> Derived:
    """AReaL 1.0.4's rejection_sampling (level, action, metric, agg, upper, lower)."""
    p = "actor.rejection_sampling."
    level, action = ctx.get(p + "level", "token"), ctx.get(p + "action", "mask")
    metric = _METRICS.get(ctx.get(p + "metric", "ratio"))
    if metric is None:
        return refused(
            p + "metric", f"{ctx.get(p + 'metric')!r}: AReaL's metrics are ratio, kl_k1, kl_k2, kl_k3"
        )
    if action == "clamp" and metric != "ratio":
        return refused(
            p + "action",
            "clamp with a KL metric: AReaL clamps the ratio at a KL bound; asyncrl clamps the weight by ratio"
            " bounds only (its admission refuses action clamp with a KL metric)",
        )
    upper, lower = ctx.get(p + "upper"), ctx.get(p + "lower")
    if upper is None:
        return refused(p + "upper", "AReaL requires an upper bound")
    if level == "token" and metric == "ratio" and lower is None and 1.0 <= upper <= 100.0:
        if action == "mask":
            return Derived({A + "correction": "decoupled", A + "isCap": upper})
        return Derived({A + "correction": "tis", A + "isCap": upper})
    spec: dict[str, Any] = {"level": level, "action": action, "metric": metric, "upper": upper}
    if level == "sequence":
        spec["agg"] = ctx.get(p + "agg", "mean")
    if lower is not None:
        spec["lower"] = lower
    return Derived({A + "correction": "decoupled", A + "rejection": spec})


_MODES = {
    "token_mask": ("token", "mask"),
    "token_truncate": ("token", "clamp"),
    "sequence_mask": ("sequence", "mask"),
    "sequence_truncate": ("sequence", "clamp"),
}


def correction(ctx: Context) -> Derived:
    """use_decoupled_loss with the filter of its generation: rejection_sampling (AReaL 1.0.4),
    behave_imp_weight_cap / behave_imp_weight_mode (2026-03 .. 2026-04, default 5.0 token_mask) or
    behav_imp_weight_cap (before; default none)."""
    if ctx.get("actor.use_decoupled_loss", False) is not True:
        if ctx.get("actor.recompute_logprob", False) is True:
            return Derived(
                {A + "correction": "decoupled"},
                [
                    "recompute_logprob without use_decoupled_loss: AReaL centres PPO on the recomputed"
                    " policy and"
                    " weights nothing (its rollout is near on-policy); asyncrl's samples may be versions old:"
                    " correction decoupled (weight pi_prox/pi_behav, tokens above isCap 2 leave the loss)"
                ],
            )
        return Derived(
            {A + "correction": "none"}, ["use_decoupled_loss false: PPO against the behaviour log-probs"]
        )
    if ctx.has("actor.rejection_sampling"):
        return _rejection(ctx)
    if any(k.startswith("actor.behave_imp_weight_") for k in ctx.cfg):
        cap = ctx.number("actor.behave_imp_weight_cap", 5.0)
        mode = ctx.get("actor.behave_imp_weight_mode", "token_mask")
        if mode not in _MODES:
            return refused(
                "actor.behave_imp_weight_mode",
                f"{mode!r}: without an importance weight; asyncrl's decoupled PPO always weights by"
                " pi_prox/pi_behav",
            )
        level, action = _MODES[mode]
        if level == "token" and 1.0 <= cap <= 100.0:
            return Derived({A + "correction": "decoupled" if action == "mask" else "tis", A + "isCap": cap})
        spec = {"level": level, "action": action, "metric": "ratio", "upper": cap}
        return Derived({A + "correction": "decoupled", A + "rejection": spec})
    cap = ctx.get("actor.behav_imp_weight_cap")
    if cap is not None and 1.0 <= cap <= 100.0:
        return Derived({A + "correction": "decoupled", A + "isCap": cap})
    upper = cap if cap is not None else _NO_FILTER
    return Derived(
        {
            A + "correction": "decoupled",
            A + "rejection": {"level": "token", "action": "mask", "metric": "ratio", "upper": upper},
        },
        []
        if cap is not None
        else [
            "use_decoupled_loss without rejection_sampling: AReaL 1.0.4 filters nothing (AReaL 2026-03..04"
            " filtered at 5 by default): asyncrl's bound at its largest, 1e6"
        ],
    )


def overlong(ctx: Context) -> Derived:
    """overlong_reward_penalty, overlong_tokens, overlong_penalty_factor (AReaL's DAPO shaping)."""
    if ctx.get("actor.overlong_reward_penalty", False) is not True:
        return Derived()
    tokens = ctx.get("actor.overlong_tokens")
    if not isinstance(tokens, int) or tokens < 1:
        return refused("actor.overlong_tokens", f"{tokens!r}: the penalty needs a length in tokens")
    ends, sampled = ctx.get("actor.max_new_tokens", 1024), ctx.get("gconfig.max_new_tokens")
    if sampled is not None and ends != sampled:
        return refused(
            "actor.max_new_tokens",
            f"{ends}: AReaL's penalty zone ends there; asyncrl's at rollout.sampling.maxTokens"
            f" (gconfig.max_new_tokens {sampled})",
        )
    factor = ctx.number("actor.overlong_penalty_factor", 1.0)
    return Derived({A + "overlong": {"bufferTokens": tokens, "penaltyFactor": factor}})


def dynamic_sampling(ctx: Context) -> Derived:
    if ctx.get("dynamic_bs", False) is not True:
        return Derived()
    return Derived(
        {A + "dynamicSampling": {}},
        [
            "dynamic_bs: AReaL trains a smaller batch without the groups its filter rejects; asyncrl drops"
            " groups whose rewards are all equal and fills the step from the queue (at most"
            " dynamicSampling.maxDropsPerStep, 64, per step)"
        ],
    )


def _trains_with_megatron(ctx: Context) -> bool:
    backend = str(ctx.get("actor.backend") or str(ctx.get("allocation_mode", "")).rpartition("+")[2])
    return backend.startswith("megatron")


def lora(ctx: Context) -> Derived:
    """actor.use_lora, lora_rank (AReaL's default 32), lora_alpha (16), target_modules (empty or
    [all-linear]: all linear layers), peft_type (lora only); the rollout's use_lora, enable_lora,
    max_lora_rank and gconfig.lora_name follow (asyncrl sets them from trainer.lora)."""
    if ctx.get("actor.use_lora", False) is not True:
        return Derived()
    peft = ctx.get("actor.peft_type", "lora")
    if peft != "lora":
        return refused("actor.peft_type", f"{peft!r}: asyncrl trains LoRA adapters only (peft_type lora)")
    if _trains_with_megatron(ctx):
        return refused(
            "actor.use_lora",
            "LoRA with a megatron actor: asyncrl's trainer.lora is built on backend fsdp2 only (admission"
            " refuses it with megatron); use actor.backend fsdp",
        )
    rank, alpha = ctx.get("actor.lora_rank", 32), ctx.get("actor.lora_alpha", 16)
    if (bad := rules.lora_bounds("actor.lora_rank", rank, alpha)) is not None:
        return bad
    targets = ctx.get("actor.target_modules", [])
    try:
        modules = rules.lora_modules(targets)
    except rules.Skip as exc:
        return refused("actor.target_modules", f"{exc}; the job would adapt other layers")
    notes = [
        f"LoRA rank {rank}, alpha {alpha} on {', '.join(modules)}: trainer.lora (peft on fsdp2; the weight"
        " sync sends the adapter alone, vLLM serves it with max_lora_rank from the rank);"
        " actor.optimizer.lr is the adapters' learning rate"
    ]
    if not targets or targets == ["all-linear"]:
        notes.append(rules.LORA_ALL_LINEAR)
    return Derived({"trainer.lora": {"rank": rank, "alpha": alpha, "targetModules": modules}}, notes)


ASPECTS = (advantage, loss, correction, overlong, dynamic_sampling, lora)
