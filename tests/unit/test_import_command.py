"""``asyncrl import`` (importer/): configs written here from verl's and AReaL's documented key names (verl
fully_async_policy with the agent loop and separate resource pools; AReaL async with its agent mode)
become AsyncRLJobs the operator's admission accepts; every source key is in the table, mapped or with
the reason it is not; secrets become Secret references, never literal values."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import pytest
import yaml
from asyncrl_operator import admission, crdgen
from asyncrl_testing import migration
from asyncrl_workloads import cli
from asyncrl_workloads.importer import areal, hydra, report, rules, translate, verl


def _admitted(job: dict[str, Any]) -> None:
    body = copy.deepcopy(job)
    body["metadata"]["namespace"] = "default"
    parsed, why = admission.parse(body)
    assert why is None and parsed is not None, why


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
    assert trainer["batch"] == {"prompts": 64, "miniBatches": 2, "microBatchTokens": 12288}
    assert (trainer["replicas"], trainer["gpusPerReplica"], trainer["backend"]) == (1, 4, "fsdp2")
    assert trainer["optimizer"] == {"lr": 2e-6, "weightDecay": 0.1, "gradClip": 1.0}
    assert trainer["algorithm"] == {
        "clipLow": 0.2,
        "clipHigh": 0.28,
        "kl": 0.0,
        "name": "grpo",
        "correction": "none",
    }
    assert trainer["checkpoint"] == {"everySteps": 20, "path": "/ckpt/retool"}
    assert spec["maxSteps"] == 1000  # 64000 prompts / 64 per step
    assert spec["agent"] == {
        "loop": "tool",
        "tools": ["my_tools:python_exec"],
        "maxUserTurns": 8,
        "maxAssistantTurns": 8,
        "maxParallelCalls": 2,
        "toolParser": "hermes",
    }
    assert spec["weightSync"] == {"backend": "nccl"}
    assert _unmapped(result) == {
        "hydra.searchpath": "Hydra's own settings",
        "actor_rollout_ref.model.use_remove_padding": "model loading knob (padding removal, checkpointing,"
        " LoRA): not exposed",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path": "verl tool classes: write asyncrl tool"
        " functions, pass them with --tool",
        "trainer.logger": verl._TRACKING,
        "trainer.total_epochs": "no epochs: prompts are drawn until maxSteps",
        "async_training.use_trainer_do_validate": "validation runs on rollout replica 0, not on trainer GPUs",
    }


def test_every_source_key_has_a_row() -> None:
    config = yaml.safe_load(migration.VERL_FULLY_ASYNC_AGENT)
    result = translate.translate("verl", config, env={"DATA_ROOT": "/d"})
    assert [r.source for r in result.rows] == [k for k, _ in hydra.leaves(config)]
    text = report.table(result)
    assert all(f"  {r.source} " in text for r in result.rows)
    assert "not mapped (9 keys):" in text  # without --tool the agent knobs are listed, with the reason
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
        ("algorithm.adv_estimator=gae", "algorithm.adv_estimator",
         "'gae': asyncrl has GRPO and PPO-clip without a critic (trainer.algorithm.name)"),
        ("actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.use_kl_loss", None),
        ("data.train_files=[/a.parquet,/b.parquet]", "data.train_files",
         "2 files: asyncrl reads one path (put parquet files in one folder)"),
    ],
)  # fmt: skip
def test_verl_knobs_asyncrl_has_not_are_listed_with_the_reason(
    override: str, source: str, reason: str | None
) -> None:
    extra = ["actor_rollout_ref.actor.kl_loss_coef=0.001"] if reason is None else []
    config = yaml.safe_load(migration.VERL_FULLY_ASYNC_AGENT)
    result = translate.translate("verl", config, env={"DATA_ROOT": "/d"}, overrides=[override, *extra])
    expected = (
        reason or "a KL loss to the reference policy is not implemented; serve it with vLLM, set spec.teacher"
    )
    assert _unmapped(result)[source] == expected


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
        "clipLow": 0.4,
        "clipHigh": 0.4,
        "kl": 0.0,
        "correction": "decoupled",
        "isCap": 5.0,
    }
    assert spec["model"] == {"path": "/models/Qwen2.5-1.5B-Instruct", "dtype": "bfloat16"}
    assert result.secrets == [
        "kubectl create secret generic gsm8k-agent-secrets"
        " --from-literal=AREAL_ADMIN_API_KEY=$AREAL_ADMIN_API_KEY"
    ]
    unmapped = _unmapped(result)
    assert (
        unmapped["valid_dataset.path"]
        == "a gateway job runs no validation set (the user's agent drives every episode)"
    )
    assert unmapped["stats_logger.wandb.api_key"] == areal._TRACKING
    assert set(unmapped) == {
        "trial_name", "cluster.fileroot", "actor.optimizer.beta1", "valid_dataset.path",
        "stats_logger.wandb.mode", "stats_logger.wandb.api_key",
    }  # fmt: skip
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
    config: dict[str, Any] = {"x": {"y": 1}}
    hydra.apply_overrides(config, ["x.y=2", "+x.z=[1, 2]", "~x.y", "++w=true"])
    assert config == {"x": {"z": [1, 2]}, "w": True}
    with pytest.raises(hydra.OverrideError, match="not key=value"):
        hydra.apply_overrides(config, ["x.y"])


@pytest.mark.parametrize("table", [verl.TABLE, areal.TABLE], ids=["verl", "areal"])
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
