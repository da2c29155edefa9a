"""``asyncrl import`` (importer/): configs written from verl's and AReaL's documented key names and the
seed documents' two layouts become AsyncRLJobs the operator's admission accepts; every source key is in
the table, mapped or with the reason it is not; algorithm keys map by value or the import refuses them by
name; two keys wanting one field are reported; Hub ids are flagged; secrets anywhere in the input become
Secret references or named lines, never values. The anchors' own examples: test_import_anchors.py."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import pytest
import yaml
from asyncrl_api import lora
from asyncrl_operator import admission, crdgen
from asyncrl_testing import migration, migration_areal
from asyncrl_workloads import cli
from asyncrl_workloads.importer import areal, areal_seed, hydra, report, rules, translate, verl, verl_seed


def _admitted(job: dict[str, Any]) -> None:
    body = copy.deepcopy(job)
    body["metadata"]["namespace"] = "default"
    parsed, why = admission.parse(body)
    assert why is None and parsed is not None, why


ACTOR, RC = "actor_rollout_ref.actor.", "algorithm.rollout_correction."


def _unmapped(result: translate.Result) -> dict[str, str]:
    return {r.source: r.note for r in result.rows if r.target is None}


def test_verl_fully_async_with_agent_loop() -> None:
    result = translate.translate(
        "verl",
        yaml.safe_load(migration.VERL_FULLY_ASYNC_AGENT),
        env={"DATA_ROOT": "/data"},
        tools=["my_tools:python_exec"],
        overrides=["actor_rollout_ref.actor.optim.lr=2e-6", "+trainer.total_epochs=3"],
    )
    _admitted(result.job)
    assert result.job["metadata"] == {"name": "qwen2-5-7b-async-tool"}
    spec = result.job["spec"]
    assert spec["mode"] == "async"
    assert spec["model"] == {"path": "/models/qwen2.5-7b-instruct"}
    assert spec["data"] == {
        "format": "chat",
        "prompts": "/data/gsm8k/train.parquet",
        "validation": "/data/gsm8k/test.parquet",
        "promptKey": "prompt",
        "validateEverySteps": 20,  # verl's test_freq counts syncs of 4 steps
    }
    assert spec["reward"] == {"function": "gsm8k_reward:compute_score"}
    assert spec["async"] == {"maxStaleness": 2, "syncEverySteps": 4, "requireBatches": 2}
    assert spec["rollout"]["replicas"] == 2 and spec["rollout"]["gpusPerReplica"] == 2  # 4 GPUs, tp 2
    assert spec["rollout"]["engine"] == {"maxModelLen": 3072, "name": "vllm", "gpuMemoryUtilization": 0.8}
    assert spec["rollout"]["sampling"] == {"maxTokens": 2048, "samplesPerPrompt": 16, "temperature": 1.0}
    assert spec["rollout"]["maxInflightPrompts"] == 16 and spec["rollout"]["partialRollout"] is True
    trainer = spec["trainer"]
    # a step gathers require_batches (2) ppo_mini_batches of 32 prompts and updates once per mini-batch
    assert trainer["batch"] == {"prompts": 32, "miniBatches": 1, "microBatchTokens": 12288}
    assert (trainer["replicas"], trainer["gpusPerReplica"], trainer["backend"]) == (1, 4, "fsdp2")
    assert trainer["optimizer"] == {"lr": 2e-6, "weightDecay": 0.1, "gradClip": 1.0}
    assert trainer["algorithm"] == {
        "policyLoss": "ppo",
        "clipLow": 0.2,
        "clipHigh": 0.28,
        "clipRatioC": 3.0,  # verl's vanilla loss always dual-clips
        "kl": 0.0,
        "name": "grpo",
        "correction": "none",  # bypass_mode: PPO against the behaviour log-probs
    }
    assert trainer["checkpoint"] == {"everySteps": 20, "path": "/ckpt/retool"}
    assert spec["maxSteps"] == 1000  # 64000 prompts / (2 x 32) per step
    assert spec["agent"] == {
        "loop": "tool",
        "tools": ["my_tools:python_exec"],
        "maxUserTurns": 8,
        "maxAssistantTurns": 8,
        "maxParallelCalls": 2,
        "toolParser": "hermes",
    }
    assert spec["weightSync"] == {"backend": "nccl"}
    secret = {"name": "qwen2-5-7b-async-tool-secrets", "key": "WANDB_API_KEY"}
    assert spec["tracking"] == {"wandb": {"project": "verl_examples", "apiKeySecret": secret}}
    assert result.secrets == [
        "kubectl create secret generic qwen2-5-7b-async-tool-secrets"
        " --from-literal=WANDB_API_KEY=$WANDB_API_KEY"
    ]
    assert _unmapped(result) == {
        "hydra.searchpath": "Hydra's own settings",
        "actor_rollout_ref.model.use_remove_padding": "model loading knob (padding removal, checkpointing,"
        " kernels): not exposed",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path": "verl tool classes: write asyncrl tool"
        " functions, pass them with --tool",
        "trainer.total_epochs": verl._EPOCHS,
        "async_training.use_trainer_do_validate": "validation runs on rollout replica 0, not on trainer GPUs",
    }


def test_every_source_key_has_a_row() -> None:
    config = yaml.safe_load(migration.VERL_FULLY_ASYNC_AGENT)
    result = translate.translate("verl", config, env={"DATA_ROOT": "/d"})
    assert [r.source for r in result.rows] == [k for k, _ in hydra.leaves(config)]
    text = report.table(result)
    assert all(f"  {r.source} " in text for r in result.rows)
    assert "not mapped (8 keys):" in text  # without --tool the agent knobs are listed, with the reason
    assert _unmapped(result)["actor_rollout_ref.rollout.multi_turn.max_user_turns"] == (
        "the agent loop needs asyncrl tool functions: import again with --tool pkg.mod:fn"
    )
    assert "agent" not in result.job["spec"]


@pytest.mark.parametrize(
    ("override", "source", "reason"),
    [
        ("actor_rollout_ref.actor.strategy=veomni", "actor_rollout_ref.actor.strategy",
         "'veomni' strategy: asyncrl trains with fsdp2 or megatron-core"),
        ("actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.name", "asyncrl runs vLLM"),
        ("data.train_files=[/a.parquet,/b.parquet]", "data.train_files",
         "2 files: asyncrl reads one path (put parquet files in one folder)"),
        (f"{ACTOR}ppo_epochs=2", f"{ACTOR}ppo_epochs", "one pass over each batch"),
    ],
)  # fmt: skip
def test_verl_knobs_asyncrl_has_not_are_listed_with_the_reason(
    override: str, source: str, reason: str
) -> None:
    config = yaml.safe_load(migration.VERL_FULLY_ASYNC_AGENT)
    result = translate.translate("verl", config, env={"DATA_ROOT": "/d"}, overrides=[override])
    assert _unmapped(result)[source] == reason


@pytest.mark.parametrize(
    ("overrides", "algorithm"),
    [
        ([f"+{ACTOR}use_kl_loss=true", f"+{ACTOR}kl_loss_coef=0.01", f"+{ACTOR}kl_loss_type=mse"],
         {"kl": 0.01, "klPlacement": "loss", "klEstimator": "k2"}),
        (["+algorithm.use_kl_in_reward=true", "+algorithm.kl_ctrl.type=adaptive",
          "+algorithm.kl_ctrl.kl_coef=0.05", "+algorithm.kl_ctrl.target_kl=0.2",
          "+algorithm.kl_ctrl.horizon=5000", "+algorithm.kl_penalty=low_var_kl"],
         {"kl": 0.05, "klPlacement": "reward", "klEstimator": "k3", "klTarget": 0.2, "klHorizon": 5000}),
        (["algorithm.adv_estimator=grpo", "+algorithm.norm_adv_by_std_in_grpo=false"],
         {"name": "grpo", "groupStd": False}),
        (["algorithm.adv_estimator=reinforce_plus_plus", "+algorithm.gamma=0.99"],
         {"name": "reinforce++", "gamma": 0.99}),
        (["algorithm.adv_estimator=reinforce_plus_plus_baseline"], {"name": "reinforce++-baseline"}),
        ([f"+{ACTOR}policy_loss.loss_mode=sapo", f"+{ACTOR}tau_pos=2.0", f"+{ACTOR}loss_agg_mode=token-mean"],
         {"policyLoss": "sapo", "sapo": {"tauPos": 2.0, "tauNeg": 1.05},
          "lossAggregation": "seq-mean-token-mean"}),  # verl's sapo ignores loss_agg_mode
        ([f"+{ACTOR}loss_agg_mode=seq-mean-token-sum-norm", f"+{ACTOR}loss_scale_factor=4096",
          f"+{ACTOR}entropy_coeff=0.001"],
         {"lossAggregation": "seq-mean-token-sum-norm", "lossScaleFactor": 4096, "entropyCoef": 0.001}),
        # the correction follows what verl takes the ratio against
        ([f"{RC}bypass_mode=false", "~async_training"], {"correction": "decoupled"}),
        ([f"{RC}bypass_mode=false", f"+{RC}rollout_is=token", f"+{RC}rollout_is_threshold=3.0"],
         {"correction": "tis", "isCap": 3.0}),
        ([f"{RC}bypass_mode=false", f"+{RC}rollout_is=token", f"+{RC}rollout_is_threshold=0.5_5.0"],
         {"correction": "decoupled",
          "rejection": {"level": "token", "action": "mask", "metric": "ratio", "lower": 0.5, "upper": 5.0}}),
        ([f"{RC}bypass_mode=false", f"+{RC}rollout_rs=seq_mean_k1", f"+{RC}rollout_rs_threshold=0.5_2.0"],
         {"correction": "decoupled", "rejection": {"level": "sequence", "action": "mask", "metric": "ratio",
                                                   "agg": "mean", "lower": 0.5, "upper": 2.0}}),
        ([f"{RC}bypass_mode=false", f"+{RC}rollout_rs=token_k2", f"+{RC}rollout_rs_threshold=0.1"],
         {"correction": "decoupled", "rejection": {"level": "token", "action": "mask", "metric": "k2",
                                                   "upper": 0.1}}),
        (["+reward_model.reward_manager=dapo", "+reward_model.overlong_buffer.enable=true",
          "+reward_model.overlong_buffer.len=512", "+reward_model.overlong_buffer.penalty_factor=0.5",
          "+algorithm.filter_groups.enable=true", "+algorithm.filter_groups.metric=acc"],
         {"overlong": {"bufferTokens": 512, "penaltyFactor": 0.5}, "dynamicSampling": {}}),
    ],
)  # fmt: skip
def test_verl_algorithm_keys_map_by_value(overrides: list[str], algorithm: dict[str, Any]) -> None:
    config = yaml.safe_load(migration.VERL_FULLY_ASYNC_AGENT)
    result = translate.translate("verl", config, env={"DATA_ROOT": "/d"}, overrides=overrides)
    _admitted(result.job)
    got = result.job["spec"]["trainer"]["algorithm"]
    assert {k: got.get(k) for k in algorithm} == algorithm


@pytest.mark.parametrize(
    ("overrides", "key", "why"),
    [
        (["algorithm.adv_estimator=remax"], "algorithm.adv_estimator", "the job would train grpo instead"),
        (["actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n", "every advantage would be 0"),
        ([f"+{ACTOR}policy_loss.loss_mode=clip_cov"], f"{ACTOR}policy_loss.loss_mode", "PPO-clip instead"),
        ([f"+{ACTOR}use_kl_loss=true", f"+{ACTOR}kl_loss_coef=0.1", f"+{ACTOR}kl_loss_type=k3+"],
         f"{ACTOR}kl_loss_type", "straight-through"),
        ([f"+{ACTOR}use_kl_loss=true", "+algorithm.use_kl_in_reward=true"], "algorithm.use_kl_in_reward",
         "one placement"),
        (["+actor_rollout_ref.model.lora_rank=1024"], "actor_rollout_ref.model.lora_rank", "1 to 512"),
        (["+actor_rollout_ref.model.lora_rank=8", "+actor_rollout_ref.model.target_modules=[embed_tokens]"],
         "actor_rollout_ref.model.target_modules", "only the decoder projections"),
        (["+actor_rollout_ref.model.lora.rank=16"], "actor_rollout_ref.model.lora.rank", "Megatron-Bridge"),
        (["+actor_rollout_ref.model.lora_rank=8", f"+{ACTOR}strategy=megatron"],
         "actor_rollout_ref.model.lora_rank", "fsdp2 only"),
        ([f"+{RC}rollout_is=token"], f"{RC}rollout_is", "bypass_mode the PPO ratio is taken against"),
        ([f"{RC}bypass_mode=false", f"+{RC}rollout_is=sequence"], f"{RC}rollout_is", "product of the token"),
        ([f"{RC}bypass_mode=false", f"+{RC}rollout_rs=token_k3", f"+{RC}rollout_rs_threshold=0.1"],
         f"{RC}rollout_rs", "another quantity"),
    ],
)  # fmt: skip
def test_verl_algorithms_asyncrl_cannot_train_are_refused_by_name(
    overrides: list[str], key: str, why: str
) -> None:
    config = yaml.safe_load(migration.VERL_FULLY_ASYNC_AGENT)
    with pytest.raises(translate.Refused) as caught:
        translate.translate("verl", config, env={"DATA_ROOT": "/d"}, overrides=overrides)
    refused = dict(caught.value.result.refused)
    assert key in refused and why in refused[key], refused
    assert f"  {key}: " in str(caught.value) and "mapped (" in str(caught.value)  # the key, then the table


MODEL = "actor_rollout_ref.model."


@pytest.mark.parametrize(
    ("overrides", "lora"),
    [
        ([f"+{MODEL}lora_rank=32", f"+{MODEL}lora_alpha=64", f"+{MODEL}target_modules=all-linear"],
         {"rank": 32, "alpha": 64, "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                     "up_proj", "down_proj"]}),
        ([f"+{MODEL}lora_rank=8", f"+{MODEL}target_modules=[q_proj,v_proj,o_proj]",
          f"+{MODEL}exclude_modules=[o_proj]"],
         {"rank": 8, "alpha": 16, "targetModules": ["q_proj", "v_proj"]}),  # verl's lora_alpha default 16
        ([f"+{MODEL}lora_rank=0", f"+{MODEL}lora_alpha=64"], None),  # rank 0: full fine-tuning
    ],
)  # fmt: skip
def test_verl_lora_becomes_trainer_lora_on_a_gpu_job(
    overrides: list[str], lora: dict[str, Any] | None
) -> None:
    """model.lora_rank > 0: peft LoRA on the FSDP policy, spec.trainer.lora (the NCCL sync carries the
    adapter); all-linear is the decoder's seven projections; use_shm and layered_summon are not mapped."""
    config = yaml.safe_load(migration.VERL_FULLY_ASYNC_AGENT)
    extra = [f"+{MODEL}use_shm=false", "+actor_rollout_ref.rollout.layered_summon=true"]
    result = translate.translate("verl", config, env={"DATA_ROOT": "/d"}, overrides=[*overrides, *extra])
    _admitted(result.job)
    trainer = result.job["spec"]["trainer"]
    assert trainer.get("lora") == lora
    assert (trainer["backend"], result.job["spec"]["weightSync"]) == ("fsdp2", {"backend": "nccl"})
    rows = {row.source: row for row in result.rows}
    assert rows[f"{MODEL}lora_rank"].target == ("trainer.lora" if lora else "")
    assert rows[f"{MODEL}use_shm"].target is None and "/dev/shm" in rows[f"{MODEL}use_shm"].note
    assert rows["actor_rollout_ref.rollout.layered_summon"].target is None


@pytest.mark.parametrize("estimator", [["algorithm.adv_estimator=gae"], ["~algorithm.adv_estimator"]])
def test_verl_gae_becomes_ppo_with_a_critic(estimator: list[str]) -> None:
    """adv_estimator gae (verl's default when unset): name gae with its lambda, and the critic's learning
    rate, value clip and model from critic.*; the critic's other knobs are listed as not mapped."""
    config = yaml.safe_load(migration.VERL_FULLY_ASYNC_AGENT)
    overrides = [*estimator, "+algorithm.lam=0.95", "+critic.optim.lr=2e-6", "+critic.cliprange_value=0.2",
                 "+critic.model.path=/models/critic", "+critic.ppo_micro_batch_size_per_gpu=4"]  # fmt: skip
    result = translate.translate("verl", config, env={"DATA_ROOT": "/d"}, overrides=overrides)
    algorithm = result.job["spec"]["trainer"]["algorithm"]
    assert (algorithm["name"], algorithm["lam"]) == ("gae", 0.95)
    assert algorithm["critic"] == {"lr": 2e-6, "valueClip": 0.2, "path": "/models/critic"}
    rows = {row.source: row for row in result.rows}
    assert rows["critic.optim.lr"].target and not rows["critic.ppo_micro_batch_size_per_gpu"].target


VAL = "actor_rollout_ref.rollout.val_kwargs."


def test_verl_val_kwargs_become_validation_sampling_only_when_verl_samples() -> None:
    config = yaml.safe_load(migration.VERL_FULLY_ASYNC_AGENT)
    sampled = [f"+{VAL}{k}={v}" for k, v in (("do_sample", "true"), ("n", 4), ("temperature", 0.6),
                                             ("top_p", 0.95), ("top_k", -1))]  # fmt: skip
    result = translate.translate("verl", config, env={"DATA_ROOT": "/d"}, overrides=sampled)
    _admitted(result.job)
    assert result.job["spec"]["data"]["validationSampling"] == {
        "samplesPerPrompt": 4, "temperature": 0.6, "topP": 0.95
    }  # fmt: skip
    assert (
        _unmapped(result)[VAL + "top_k"]
        == "validation sampling knob with no asyncrl field (top_k: all tokens)"
    )
    # verl's default: do_sample false answers greedily whatever n says; sampling at temperature 0 likewise
    for do_sample, temperature, why in [
        ("false", 0.6, "val_kwargs.do_sample false: one greedy answer per record, asyncrl's default"),
        ("true", 0, "val_kwargs.temperature 0: its n answers would all be the one greedy answer"),
    ]:
        overrides = [f"+{VAL}do_sample={do_sample}", f"+{VAL}n=4", f"+{VAL}temperature={temperature}"]
        result = translate.translate("verl", config, env={"DATA_ROOT": "/d"}, overrides=overrides)
        _admitted(result.job)
        assert _unmapped(result)[VAL + "n"] == why
        assert result.job["spec"]["data"].get("validationSampling", {}).get("samplesPerPrompt") is None


def test_areal_agent_async() -> None:
    result = translate.translate(
        "areal",
        yaml.safe_load(migration.AREAL_AGENT_ASYNC),
        env={"AREAL_ADMIN_API_KEY": "s3cret"},
        reward="agent.reward:score",
    )
    _admitted(result.job)
    spec = result.job["spec"]
    assert result.job["metadata"] == {"name": "gsm8k-agent"}
    assert spec["agent"] == {
        "loop": "gateway",
        "gateway": {
            "adminKeySecret": {"name": "gsm8k-agent-secrets", "key": "AREAL_ADMIN_API_KEY"},
            "export": "individual",
            "turnDiscount": 0.9,
        },
        "maxAssistantTurns": 6,
        "toolParser": "hermes",
    }
    assert spec["data"] == {"format": "chat", "prompts": "/data/gsm8k/train.parquet"}
    assert spec["async"] == {"maxStaleness": 2, "queue": {"maxSize": 256}}  # 64 groups of 4
    assert (spec["rollout"]["replicas"], spec["rollout"]["gpusPerReplica"]) == (4, 1)
    assert spec["rollout"]["maxInflightPrompts"] == 64  # 256 over 4 servers
    trainer = spec["trainer"]
    assert (trainer["replicas"], trainer["gpusPerReplica"], trainer["backend"]) == (1, 4, "fsdp2")
    assert trainer["batch"] == {"prompts": 256, "microBatchTokens": 10240, "miniBatches": 1}
    assert trainer["algorithm"] == {
        "name": "grpo",
        "policyLoss": "ppo",
        "clipLow": 0.4,
        "clipHigh": 0.4,
        "advantageNorm": {"std": True, "leaveOneOut": False, "unbiased": True, "eps": 1e-5},
        "kl": 0.0,
        "correction": "decoupled",
        "isCap": 5.0,  # the older key generation: behav_imp_weight_cap
    }
    assert spec["model"] == {"path": "/models/Qwen2.5-1.5B-Instruct", "dtype": "bfloat16"}
    secret = {"name": "gsm8k-agent-secrets", "key": "WANDB_API_KEY"}
    assert spec["tracking"] == {"wandb": {"project": "gsm8k-agent", "apiKeySecret": secret}}
    assert result.secrets == [
        "kubectl create secret generic gsm8k-agent-secrets"
        " --from-literal=AREAL_ADMIN_API_KEY=$AREAL_ADMIN_API_KEY",
        "kubectl create secret generic gsm8k-agent-secrets"
        " --from-literal=WANDB_API_KEY=<the value of stats_logger.wandb.api_key in your config>",
    ]
    unmapped = _unmapped(result)
    assert (
        unmapped["valid_dataset.path"]
        == "a gateway job runs no validation set (the user's agent drives every episode)"
    )
    assert set(unmapped) == {"trial_name", "cluster.fileroot", "actor.optimizer.beta1", "valid_dataset.path"}
    shown = report.table(result) + yaml.safe_dump(result.job)
    assert "s3cret" not in shown and "sk-literal-never-copied" not in shown


def test_areal_allocation_string_and_staleness_zero() -> None:
    config = yaml.safe_load(migration.AREAL_AGENT_ASYNC)
    del config["rollout"]["backend"], config["actor"]["backend"], config["rollout"]["agent"]
    config["allocation_mode"] = "sglang:d2p1t2+megatron:d2p1t2"
    config["rollout"]["max_head_offpolicyness"] = 0
    result = translate.translate("areal", config, reward="agent.reward:score")
    spec = result.job["spec"]
    assert (spec["rollout"]["replicas"], spec["rollout"]["gpusPerReplica"]) == (2, 2)
    assert spec["trainer"]["backend"] == "megatron" and spec["trainer"]["parallelism"]["tp"] == 2
    assert spec["mode"] == "sync" and "maxStaleness" not in spec["async"]
    assert spec["data"]["validation"] == "/data/gsm8k/test.parquet"  # no gateway: validation maps
    _admitted(result.job)


def test_interpolations_overrides_and_literal_secrets() -> None:
    flat = {
        "a.path": "/m",
        "b.path": "${a.path}/x",
        "c": "${oc.env:HOME_DIR,/home}",
        "d": "${oc.env:NOPE}",
        "e.hf_token": "hf_abc",
        "f.api_key": "${oc.env:OPENAI_API_KEY}",
        "g": "${missing.key}",
        "lr": "1e-6",
    }
    resolved = hydra.resolve(flat, {})
    assert resolved["b.path"] == "/m/x" and resolved["c"] == "/home" and resolved["lr"] == 1e-6
    assert resolved["d"] == hydra.Unresolved("${oc.env:NOPE}", "environment variable NOPE is not set here")
    assert resolved["e.hf_token"] == hydra.Secret("e.hf_token") and str(resolved["e.hf_token"]) != "hf_abc"
    assert resolved["f.api_key"] == hydra.Secret("f.api_key", "OPENAI_API_KEY")
    assert isinstance(resolved["g"], hydra.Unresolved)
    nested_flat: dict[str, Any] = {
        "a.n": 4,
        "b.n": "${oc.select:a.n, 1}",
        "c.n": "${oc.select:z.n, 1}",
        "llm.api_key": "${TAOTOKEN_API_KEY}",
        "opt.lr": 0.1,
        "opt.betas": [0.9, 0.99],
        "critic.optimizer": "${opt}",
        "spec": [{"env_vars": {"WANDB_API_KEY": "wandb-literal", "NCCL_DEBUG": "WARN"}}],
        "credentials.user": "me",
    }
    resolved = hydra.resolve(nested_flat, {})
    assert resolved["b.n"] == 4 and resolved["c.n"] == 1  # oc.select: the key, or the default
    assert resolved["llm.api_key"] == hydra.Secret("llm.api_key", "TAOTOKEN_API_KEY")  # a shell variable
    assert resolved["critic.optimizer"] == {"lr": 0.1, "betas": [0.9, 0.99]}  # a whole map
    nested = resolved["spec"][0]["env_vars"]
    assert nested == {"WANDB_API_KEY": hydra.Secret("spec[0].env_vars.WANDB_API_KEY"), "NCCL_DEBUG": "WARN"}
    assert "wandb-literal" not in str(resolved["spec"])
    assert resolved["credentials.user"] == hydra.Secret("credentials.user")  # under a secret-looking map
    assert not any(
        hydra.is_secret_name(k) for k in ("max_token_len", "prompt_key", "pad_token", "stop_token_ids")
    )
    config: dict[str, Any] = {"x": {"y": 1}}
    hydra.apply_overrides(config, ["x.y=2", "+x.z=[1, 2]", "~x.y", "++w=true"])
    assert config == {"x": {"z": [1, 2]}, "w": True}
    with pytest.raises(hydra.OverrideError, match="not key=value"):
        hydra.apply_overrides(config, ["x.y"])


@pytest.mark.parametrize(
    "table",
    [verl.TABLE, verl_seed.TABLE, areal.TABLE, areal_seed.TABLE],
    ids=["verl", "verl-seed", "areal", "areal-seed"],
)
def test_every_target_is_a_field_of_the_crd(table: rules.Table) -> None:
    spec = crdgen.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for source, rule in table.items():
        for to in rule if isinstance(rule, tuple) else (rule,):
            if not isinstance(to, rules.To) or not to.target or "," in to.target or "*" in to.target:
                continue
            node = spec
            for part in to.target.split("."):
                node = node.get("properties", {}).get(part) or node.get("additionalProperties")
                assert isinstance(node, dict), f"{source} -> {to.target}: no {part}"


def test_the_command_writes_the_job_and_the_table(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, out = tmp_path / "areal.yaml", tmp_path / "job.yaml"
    config.write_text(migration.AREAL_AGENT_ASYNC)
    argv = [
        "import",
        "areal",
        str(config),
        "--out",
        str(out),
        "--reward",
        "agent.reward:score",
        "gconfig.n_samples=8",
    ]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("mapped (") and "kubectl create secret generic gsm8k-agent-secrets" in printed
    job = yaml.safe_load(out.read_text())
    assert job["spec"]["rollout"]["sampling"]["samplesPerPrompt"] == 8
    assert cli.main(["render", str(out)]) == 0  # the operator's own render of it


def test_the_command_says_what_admission_still_needs(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "verl.yaml"
    config.write_text(migration.VERL_FULLY_ASYNC_AGENT)
    assert (
        cli.main(["import", "verl", str(config), "--out", str(tmp_path / "job.yaml")]) == 2
    )  # DATA_ROOT unset
    err = capsys.readouterr().err
    why = "the job does not pass admission yet: spec.data.prompts: Field required"
    assert err == f"asyncrl import: {config}: {why}\n"
    assert (tmp_path / "job.yaml").exists()
    (tmp_path / "bad.yaml").write_text("[1, 2]")
    assert cli.main(["import", "verl", str(tmp_path / "bad.yaml")]) == 2
    assert "expected a mapping" in capsys.readouterr().err


def test_the_verl_seed_is_read_as_fully_async_and_maps_its_keys() -> None:
    """The seed's verl layout (shared/seeds/): with only a data path and a reward (and --tool for its
    agent loop) the job renders; 20 of its 24 keys map."""
    config = yaml.safe_load(migration.VERL_SEED)
    result = translate.translate(
        "verl", config, overrides=["data.train_files=/data/train.parquet"], reward="my_reward:score",
        tools=["my_tools:search"],
    )  # fmt: skip
    _admitted(result.job)
    assert result.dialect == verl_seed.DIALECT
    spec = result.job["spec"]
    assert spec["mode"] == "async"
    assert spec["async"] == {"requireBatches": 2, "syncEverySteps": 4, "queue": {"maxSize": 4096}}  # 512 x 8
    assert spec["trainer"] == {
        "batch": {"prompts": 64, "miniBatches": 1}, "replicas": 1, "gpusPerReplica": 8, "backend": "fsdp2"
    }  # fmt: skip
    assert spec["rollout"] == {"partialRollout": True, "replicas": 8}
    assert spec["agent"] == {
        "loop": "tool", "tools": ["my_tools:search"], "maxUserTurns": 3, "maxAssistantTurns": 5,
        "maxParallelCalls": 2, "stopTokens": ["<|eot_id|>"],
    }  # fmt: skip
    assert spec["model"] == {"path": "your-rollout-model-id"}
    assert set(_unmapped(result)) == {
        "trainer.use_trainer_do_validate", "agent_loop.tool_parser.name", "agent_loop.llm_client.base_url",
        "agent_loop.llm_client.api_key",
    }  # fmt: skip
    assert any("huggingface-cli download your-rollout-model-id" in f for f in result.flags)
    assert result.secrets == [
        "agent_loop.llm_client.api_key: a secret, not shown and not written; nothing in the job uses it (for"
        " your reward, tools or agent: kubectl create secret generic imported-secrets"
        " --from-literal=TAOTOKEN_API_KEY=$TAOTOKEN_API_KEY)"
    ]
    assert any("the config names no algorithm" in n for n in result.notes)


def test_the_areal_seed_maps_its_keys_and_reports_its_conflict() -> None:
    """The seed's AReaL layout: 18 of its 23 keys map; trigger_batch_size and global_batch_size both want
    trainer.batch.prompts, and the report says which value the job keeps; the seed names no model."""
    config = yaml.safe_load(migration.AREAL_SEED)
    with_data = ["train_dataset.path=/data/tasks.jsonl"]
    result = translate.translate("areal", config, overrides=with_data, reward="my_reward:score")
    assert result.dialect == areal_seed.DIALECT
    assert "model" not in result.job["spec"] and any("add actor.path=" in n for n in result.notes)
    result = translate.translate(
        "areal", config, overrides=[*with_data, "actor.path=/models/qwen"], reward="my_reward:score"
    )
    _admitted(result.job)
    spec = result.job["spec"]
    assert spec["trainer"]["backend"] == "megatron"  # archon with tp 2: asyncrl's tensor-parallel backend
    assert (spec["trainer"]["replicas"], spec["trainer"]["gpusPerReplica"]) == (4, 2)  # dp 4 x tp 2 on 4 pods
    assert spec["trainer"]["batch"] == {"prompts": 64, "miniBatches": 8}
    assert (spec["mode"], spec["maxSteps"], spec["rollout"]["replicas"]) == ("async", 2000, 8)
    assert spec["async"] == {"maxStaleness": 2, "queue": {"maxSize": 256}}
    assert spec["agent"]["loop"] == "gateway" and spec["agent"]["maxAssistantTurns"] == 10
    assert result.conflicts == [
        "trainer.batch.prompts: async.trigger_batch_size wants 32, train.global_batch_size 64; the job"
        " keeps 64 (train.global_batch_size)"
    ]
    assert set(_unmapped(result)) == {
        "async.trigger_batch_size", "agent.gateway_config", "agent.reward_source", "logging.log_dir",
        "logging.log_interval",
    }  # fmt: skip
    assert "conflicts (two keys, one field):" in report.table(result)


@pytest.mark.parametrize(
    ("overrides", "algorithm"),
    [
        (["~actor.rejection_sampling"], {"correction": "decoupled", "rejection": {
            "level": "token", "action": "mask", "metric": "ratio", "upper": 1e6}}),  # AReaL 1.0.4: no filter
        (["~actor.rejection_sampling", "+actor.behave_imp_weight_mode=token_truncate"],
         {"correction": "tis", "isCap": 5.0}),  # 2026-03: behave_imp_weight_cap defaults to 5.0
        (["~actor.rejection_sampling", "+actor.behave_imp_weight_cap=3.0",
          "+actor.behave_imp_weight_mode=sequence_mask"],
         {"correction": "decoupled", "rejection": {"level": "sequence", "action": "mask", "metric": "ratio",
                                                   "upper": 3.0}}),
        (["~actor.rejection_sampling", "+actor.behav_imp_weight_cap=2.5"],
         {"correction": "decoupled", "isCap": 2.5}),
        (["+actor.rejection_sampling.level=sequence", "+actor.rejection_sampling.agg=max",
          "actor.rejection_sampling.metric=kl_k2", "actor.rejection_sampling.upper=0.5"],
         {"correction": "decoupled", "rejection": {"level": "sequence", "action": "mask", "metric": "k2",
                                                   "agg": "max", "upper": 0.5}}),
        (["+actor.rejection_sampling.action=clamp"], {"correction": "tis", "isCap": 5.0}),
        (["actor.use_decoupled_loss=false", "actor.recompute_logprob=false"], {"correction": "none"}),
        (["+actor.c_clip=3.0", "actor.eps_clip=0.2", "+actor.eps_clip_higher=0.28"],
         {"clipRatioC": 3.0, "clipLow": 0.2, "clipHigh": 0.28}),
        (["actor.kl_ctl=0.01", "+actor.kl_estimator=k3", "~actor.reward_norm", "actor.reward_scaling=1.0"],
         {"name": "reinforce++", "kl": 0.01, "klPlacement": "reward", "klEstimator": "k3"}),
        (["actor.reward_norm.mean_level=batch", "actor.reward_norm.std_level=null"], {"name": "ppo"}),
    ],
)  # fmt: skip
def test_areal_algorithm_keys_map_by_value(overrides: list[str], algorithm: dict[str, Any]) -> None:
    config = yaml.safe_load(migration_areal.AREAL_GSM8K_GRPO)
    result = translate.translate("areal", config, overrides=overrides, reward="my_reward:score")
    _admitted(result.job)
    got = result.job["spec"]["trainer"]["algorithm"]
    assert {k: got.get(k) for k in algorithm} == algorithm


@pytest.mark.parametrize(
    ("overrides", "key", "why"),
    [
        (["actor.kl_ctl=0.1", "~ref"], "actor.kl_ctl", "without a ref model"),
        (["actor.reward_norm.group_size=2"], "actor.reward_norm.group_size", "groups of that many"),
        (["gconfig.n_samples=1"], "gconfig.n_samples", "every group advantage would be 0"),
        (["+actor.reward_norm.mean_leave1out=true"], "actor.reward_norm.std_level", "leave-one-out"),
        (["~actor.reward_norm", "~actor.adv_norm"], "actor.reward_norm", "no baseline"),
        (["+actor.discount=0.9"], "actor.discount", "discounts the score"),
        (["+actor.rejection_sampling.action=clamp", "actor.rejection_sampling.metric=kl_k1"],
         "actor.rejection_sampling.action", "clamp with a KL metric"),
        (["+actor.use_sapo_loss=true", "+actor.c_clip=3.0"], "actor.c_clip", "dual-clip with sapo"),
        (["+actor.overlong_reward_penalty=true", "+actor.overlong_tokens=256", "actor.max_new_tokens=512"],
         "actor.max_new_tokens", "penalty zone"),
        (["+actor.use_lora=true", "+actor.peft_type=ia3"], "actor.peft_type", "LoRA adapters only"),
        (["+actor.use_lora=true", "+actor.lora_rank=0"], "actor.lora_rank", "1 to 512"),
        (["+actor.use_lora=true", "+actor.target_modules=[q_proj,lm_head]"], "actor.target_modules",
         "lm_head"),
        (["+actor.use_lora=true", "actor.backend=megatron:d4"], "actor.use_lora", "fsdp2 only"),
    ],
)  # fmt: skip
def test_areal_algorithms_asyncrl_cannot_train_are_refused_by_name(
    overrides: list[str], key: str, why: str
) -> None:
    config = yaml.safe_load(migration_areal.AREAL_GSM8K_GRPO)
    with pytest.raises(translate.Refused) as caught:
        translate.translate("areal", config, overrides=overrides, reward="my_reward:score")
    refused = dict(caught.value.result.refused)
    assert key in refused and why in refused[key], refused


def test_areal_lora_becomes_trainer_lora_with_the_actors_learning_rate() -> None:
    """actor.use_lora with AReaL's defaults (rank 32, alpha 16, no target_modules: all linear layers); the
    rollout's use_lora / enable_lora / max_lora_rank / lora_name are the same adapter, served by asyncrl."""
    config = yaml.safe_load(migration_areal.AREAL_GSM8K_GRPO)
    overrides = ["+actor.use_lora=true", "+rollout.use_lora=true", "+vllm.enable_lora=true",
                 "+vllm.max_lora_rank=32", "+gconfig.lora_name=gsm8k", "actor.optimizer.lr=1e-4"]  # fmt: skip
    result = translate.translate("areal", config, overrides=overrides, reward="my_reward:score")
    _admitted(result.job)
    trainer = result.job["spec"]["trainer"]
    assert trainer["lora"] == {"rank": 32, "alpha": 16, "targetModules": list(lora.ALL_MODULES)}
    assert trainer["optimizer"]["lr"] == 1e-4
    rows = {row.source: row for row in result.rows}
    assert all(rows[k].target == "trainer.lora" for k in ("rollout.use_lora", "vllm.max_lora_rank"))


def test_areal_allocations_parse_the_hybrid_moe_and_archon_forms() -> None:
    config = yaml.safe_load(migration_areal.AREAL_TAU2)
    overrides = migration_areal.AREAL_TAU2_30B_MOE
    spec = translate.translate("areal", config, overrides=overrides, reward="my_reward:score").job["spec"]
    assert (spec["rollout"]["replicas"], spec["rollout"]["gpusPerReplica"]) == (8, 4)  # sglang:d8t4
    trainer = spec["trainer"]  # megatron:(attn:d4p4t2|ffn:d2p4e4): 32 GPUs, tp 2, pp 4, ep 4
    assert (trainer["backend"], trainer["replicas"], trainer["gpusPerReplica"]) == ("megatron", 4, 8)
    assert trainer["parallelism"] == {"tp": 2, "pp": 4, "cp": 1, "ep": 4}
    spec = translate.translate("areal", config, reward="my_reward:score").job["spec"]
    assert (spec["trainer"]["backend"], spec["trainer"]["gpusPerReplica"]) == ("fsdp2", 8)  # archon:d8


def test_a_secret_inside_a_list_is_never_shown_and_the_report_names_it() -> None:
    """tau2's scheduling_spec[].env_vars.WANDB_API_KEY: the W&B run gets a Secret reference, the table
    and the job show no value, and the command to create the Secret names the key that held it."""
    result = translate.translate(
        "areal", yaml.safe_load(migration_areal.AREAL_TAU2), reward="my_reward:score"
    )
    shown = report.table(result) + yaml.safe_dump(result.job)
    assert "your-wandb-api-key" not in shown
    assert result.job["spec"]["tracking"]["wandb"]["apiKeySecret"] == {
        "name": "tau2-rl-secrets",
        "key": "WANDB_API_KEY",
    }
    assert (
        "kubectl create secret generic tau2-rl-secrets --from-literal=WANDB_API_KEY=<the value of"
        " rollout.scheduling_spec[0].env_vars.WANDB_API_KEY in your config>"
    ) in result.secrets
    assert result.job["spec"]["maxSteps"] == 500  # total_train_steps; 200 epochs of tau2/train: size unknown


def test_hub_ids_are_kept_and_flagged_with_the_command_that_saves_them() -> None:
    result = translate.translate(
        "areal", yaml.safe_load(migration_areal.AREAL_GSM8K_GRPO), reward="my_reward:score"
    )
    spec = result.job["spec"]
    assert (spec["model"]["path"], spec["data"]["prompts"]) == ("Qwen/Qwen2.5-1.5B-Instruct", "openai/gsm8k")
    assert [f.split(": ", 1)[1].split(" (")[0] for f in result.flags] == [
        "huggingface-cli download Qwen/Qwen2.5-1.5B-Instruct --local-dir /models/Qwen2.5-1.5B-Instruct",
        "huggingface-cli download openai/gsm8k --repo-type dataset --local-dir /data/gsm8k",
    ]
    # 10 epochs of gsm8k's 7473 problems in batches of 256 (AReaL drops the last): 29 steps each
    assert (spec["maxSteps"], spec["data"]["validateEverySteps"]) == (290, 29)
    assert spec["trainer"]["checkpoint"] == {"everySteps": 29}
