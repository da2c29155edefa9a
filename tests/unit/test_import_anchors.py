"""``asyncrl import`` on configs that reproduce the anchors' own examples (asyncrl_testing/migration_*.py:
verl's fully_async and one_step_off recipes and algorithm examples, AReaL's examples/math, tau2,
search_agent and vlm, the seed documents' two configs): per config, how many keys map and how many do
not, the command's exit code, and that the job it writes passes admission and trains the source's
algorithm (the whole spec.trainer.algorithm block) - or that the import refuses, naming the key."""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
from typing import Any

import pytest
import yaml
from asyncrl_api import lora, models
from asyncrl_testing import migration as m
from asyncrl_testing import migration_areal as ma
from asyncrl_testing import migration_verl as mv
from asyncrl_workloads import cli
from asyncrl_workloads.importer import translate

_GRPO, _ALGOS, _MATH = mv.VERL_GRPO_ONE_STEP_OFF, mv.VERL_ALGORITHMS, ma.AREAL_MATH
_ALL_LINEAR = lora.ALL_MODULES
_VERL_ALGO = {"policyLoss": "ppo", "clipLow": 0.2, "clipHigh": 0.2, "clipRatioC": 3.0, "correction": "none"}
_AREAL_ALGO = {
    "name": "grpo",
    "policyLoss": "ppo",
    "clipLow": 0.4,
    "clipHigh": 0.4,
    "advantageNorm": {"std": True, "leaveOneOut": False, "unbiased": True, "eps": 1e-5},
    "kl": 0.0,
    "correction": "decoupled",
    "isCap": 5.0,
}

_TAU2_ALGO = {**{k: v for k, v in _AREAL_ALGO.items() if k != "advantageNorm"}, "name": "reinforce++"}
"""reward_norm null, adv_norm batch: per-token returns whitened over the batch."""


@dataclasses.dataclass(frozen=True)
class Case:
    kind: str
    config: str
    overrides: list[str]
    mapped: int
    unmapped: int
    exit: int
    algorithm: dict[str, Any] | None = None
    """The job's spec.trainer.algorithm (None: absent, asyncrl's defaults)."""
    refused: str | None = None
    """The key the import refuses (exit 2, no job written)."""
    lora: dict[str, Any] | None = None
    """The job's spec.trainer.lora (None: full fine-tuning)."""
    options: tuple[str, ...] = ("--reward", "my_reward:score")


CASES = {
    # the seed documents: only a data path and a reward added (AReaL's seed also needs the model it lacks)
    "verl_seed": Case("verl", m.VERL_SEED, ["data.train_files=/data/train.parquet"], 15, 10, 0),
    "verl_seed_tools": Case(
        "verl", m.VERL_SEED, ["data.train_files=/data/train.parquet"], 21, 4, 0,
        options=("--reward", "my_reward:score", "--tool", "my_tools:search"),
    ),
    "areal_seed_no_model": Case("areal", m.AREAL_SEED, ["train_dataset.path=/data/tasks.jsonl"], 19, 5, 2),
    "areal_seed": Case(
        "areal", m.AREAL_SEED, ["train_dataset.path=/data/tasks.jsonl", "actor.path=/models/qwen"], 20, 5, 0
    ),
    # verl: the recipes' configs plus their shell scripts' overrides
    "verl_dapo_7b_4_4": Case(
        "verl", mv.VERL_FULLY_ASYNC_CONFIG, mv.VERL_DAPO_7B_4_4, 66, 23, 0,
        {"name": "grpo", "kl": 0.0, "policyLoss": "ppo", "clipLow": 0.2, "clipHigh": 0.28, "clipRatioC": 10.0,
         "correction": "none", "overlong": {"bufferTokens": 4096, "penaltyFactor": 1.0}},
    ),
    "verl_dapo_7b_64_64_mis": Case(
        "verl", mv.VERL_FULLY_ASYNC_CONFIG, mv.VERL_DAPO_7B_64_64_MIS, 61, 29, 2,
        refused="algorithm.rollout_correction.rollout_rs",
    ),
    "verl_retool_async": Case(
        "verl", mv.VERL_FULLY_ASYNC_CONFIG, mv.VERL_RETOOL_ASYNC, 49, 27, 0,
        {"name": "grpo", "kl": 0.0, "policyLoss": "ppo", "clipLow": 0.2, "clipHigh": 0.28, "clipRatioC": 10.0,
         "correction": "none"},
        options=("--tool", "my_tools:python"),
    ),
    "verl_grpo_one_step_off": Case(
        "verl", mv.VERL_ONE_STEP_OFF_CONFIG, mv.VERL_GRPO_ONE_STEP_OFF, 35, 16, 0,
        {**_VERL_ALGO, "name": "grpo", "kl": 0.001, "klPlacement": "loss", "klEstimator": "k3"},
    ),
    "verl_rloo": Case(
        "verl", mv.VERL_ONE_STEP_OFF_CONFIG, _GRPO + _ALGOS["rloo"], 37, 16, 0,
        {**_VERL_ALGO, "name": "rloo", "kl": 0.001, "klPlacement": "reward", "klEstimator": "k1"},
    ),
    "verl_reinforce_plus_plus": Case(
        "verl", mv.VERL_ONE_STEP_OFF_CONFIG,
        _GRPO + _ALGOS["reinforce_plus_plus"], 35, 16, 0,
        {**_VERL_ALGO, "name": "reinforce++", "kl": 0.001, "klPlacement": "reward", "klEstimator": "k1"},
    ),
    "verl_gspo": Case(
        "verl", mv.VERL_ONE_STEP_OFF_CONFIG, _GRPO + _ALGOS["gspo"], 39, 16, 0,
        {"name": "grpo", "kl": 0.0, "policyLoss": "gspo", "clipLow": 0.0003, "clipHigh": 0.0004,
         "lossAggregation": "seq-mean-token-mean", "correction": "none"},
    ),
    "verl_cispo": Case(
        "verl", mv.VERL_ONE_STEP_OFF_CONFIG, _GRPO + _ALGOS["cispo"], 38, 16, 0,
        {"name": "grpo", "kl": 0.001, "klPlacement": "loss", "klEstimator": "k3", "policyLoss": "cispo",
         "clipLow": 1.0, "clipHigh": 0.2, "correction": "none"},
    ),
    "verl_grpo_lora": Case(
        "verl", mv.VERL_ONE_STEP_OFF_CONFIG, _GRPO + _ALGOS["grpo_lora"], 37, 16, 0,
        {**_VERL_ALGO, "name": "grpo", "kl": 0.001, "klPlacement": "loss", "klEstimator": "k3"},
        lora={"rank": 64, "alpha": 32, "targetModules": list(_ALL_LINEAR)},  # verl's all-linear default
    ),
    "verl_defaults": Case(
        "verl", mv.VERL_DEFAULTS, [], 36, 1, 0,
        {"name": "gae", "kl": 0.0, "correction": "decoupled", "policyLoss": "ppo", "clipLow": 0.2,
         "clipHigh": 0.2, "clipRatioC": 3.0},
    ),
    # AReaL: examples/math/gsm8k_grpo.yaml and the lines each other example changes
    "areal_gsm8k_grpo": Case("areal", ma.AREAL_GSM8K_GRPO, _MATH["gsm8k_grpo"], 70, 62, 0, _AREAL_ALGO),
    "areal_gsm8k_drgrpo": Case(
        "areal", ma.AREAL_GSM8K_GRPO, _MATH["gsm8k_drgrpo"], 68, 63, 0,
        {**_AREAL_ALGO, "groupStd": False},
    ),
    "areal_gsm8k_rloo": Case(
        "areal", ma.AREAL_GSM8K_GRPO, _MATH["gsm8k_rloo"], 70, 63, 0, {**_AREAL_ALGO, "name": "rloo"}
    ),
    "areal_gsm8k_gspo": Case(
        "areal", ma.AREAL_GSM8K_GRPO, _MATH["gsm8k_gspo"], 70, 63, 0,
        {**_AREAL_ALGO, "policyLoss": "gspo"},
    ),
    "areal_gsm8k_reinforce": Case(
        "areal", ma.AREAL_GSM8K_GRPO, _MATH["gsm8k_reinforce"], 67, 63, 0,
        {**{k: v for k, v in _AREAL_ALGO.items() if k != "advantageNorm"}, "name": "reinforce++",
         "kl": 0.0001, "klPlacement": "reward", "klEstimator": "k1"},  # kl_ctl 0.001 / reward_scaling 10
    ),
    "areal_gsm8k_ppo": Case(
        "areal", ma.AREAL_GSM8K_GRPO, _MATH["gsm8k_ppo"], 69, 67, 0,
        {"name": "gae", "policyLoss": "ppo", "clipLow": 0.4, "clipHigh": 0.4, "critic": {"lr": 1.7e-05},
         "kl": 0.0, "correction": "decoupled", "isCap": 5.0},
    ),
    "areal_gsm8k_grpo_lora": Case(
        "areal", ma.AREAL_GSM8K_GRPO, _MATH["gsm8k_grpo_lora"], 79, 64, 0, _AREAL_ALGO,
        lora={"rank": 16, "alpha": 16, "targetModules": list(_ALL_LINEAR)},
    ),
    "areal_gsm8k_reinforce_baseline": Case(
        "areal", ma.AREAL_GSM8K_GRPO, _MATH["gsm8k_reinforce_baseline"], 63, 70, 2,
        refused="actor.kl_ctl",
    ),
    "areal_gsm8k_sapo": Case(
        "areal", ma.AREAL_GSM8K_GRPO, _MATH["gsm8k_sapo"], 72, 63, 0,
        {**_AREAL_ALGO, "policyLoss": "sapo", "sapo": {"tauPos": 1.0, "tauNeg": 1.05}, "correction": "none",
         "isCap": None},
    ),
    "areal_gsm8k_dapo_dynamic_bs": Case(
        "areal", ma.AREAL_GSM8K_GRPO, _MATH["gsm8k_dapo_dynamic_bs"], 74, 63, 0,
        {**_AREAL_ALGO, "clipLow": 0.2, "clipHigh": 0.28,
         "overlong": {"bufferTokens": 512, "penaltyFactor": 1.0},
         "dynamicSampling": {}},
    ),
    "areal_gsm8k_m2po": Case(
        "areal", ma.AREAL_GSM8K_GRPO, _MATH["gsm8k_m2po"], 68, 65, 2, refused="actor.m2_threshold"
    ),
    "areal_gsm8k_liteppo": Case(
        "areal", ma.AREAL_GSM8K_GRPO, _MATH["gsm8k_liteppo"], 62, 69, 2,
        refused="actor.reward_norm.std_level",
    ),
    "areal_search_agent": Case("areal", ma.AREAL_GSM8K_GRPO, ma.AREAL_SEARCH_AGENT, 56, 63, 0, _AREAL_ALGO),
    "areal_vlm_clevr": Case("areal", ma.AREAL_GSM8K_GRPO, ma.AREAL_VLM_CLEVR, 64, 65, 0, _AREAL_ALGO),
    "areal_tau2": Case("areal", ma.AREAL_TAU2, [], 63, 85, 0, _TAU2_ALGO),
    # the MoE allocation parses (pp 4, ep 4), and the operator's admission says what it cannot run
    "areal_tau2_30b_moe": Case("areal", ma.AREAL_TAU2, ma.AREAL_TAU2_30B_MOE, 63, 85, 2, _TAU2_ALGO),
}  # fmt: skip
_ENV_KNOBS = ("TENSORBOARD_DIR", "MLFLOW_TRACKING_URI", "WANDB_ENTITY", "WANDB_MODE")


def _result(case: Case) -> translate.Result:
    options = dict(zip(case.options[::2], case.options[1::2], strict=True))
    return translate.translate(
        case.kind, yaml.safe_load(case.config), overrides=case.overrides, refuse=False,
        reward=options.get("--reward"), tools=[options["--tool"]] if "--tool" in options else [],
    )  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_an_anchor_config_imports_with_its_algorithm_or_is_refused_by_name(
    name: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for variable in _ENV_KNOBS:
        monkeypatch.delenv(variable, raising=False)
    case = CASES[name]
    result = _result(case)
    rows = result.rows
    assert (sum(r.target is not None for r in rows), sum(r.target is None for r in rows)) == (
        case.mapped,
        case.unmapped,
    )
    config, out = tmp_path / "config.yaml", tmp_path / "job.yaml"
    config.write_text(case.config)
    argv = ["import", case.kind, str(config), *case.overrides, "--out", str(out), *case.options]
    assert cli.main(argv) == case.exit
    err = capsys.readouterr().err
    if case.refused is not None:
        assert [key for key, _ in result.refused][:1] == [case.refused]
        assert f"  {case.refused}: " in err and not out.exists()  # named, and no job written
        return
    assert not result.refused
    job = yaml.safe_load(out.read_text())
    algorithm = job["spec"].get("trainer", {}).get("algorithm")
    expected = {k: v for k, v in case.algorithm.items() if v is not None} if case.algorithm else None
    assert algorithm == expected
    assert job["spec"].get("trainer", {}).get("lora") == case.lora
    if case.exit == 0:
        parsed = models.AsyncRLJob.model_validate({**job, "metadata": {**job["metadata"], "namespace": "x"}})
        assert parsed.spec.trainer.algorithm.name == (expected or {}).get("name", "grpo")
        assert cli.main(["render", str(out)]) == 0


def test_the_seven_areal_algorithm_examples_give_seven_different_trainings_or_refusals() -> None:
    names = ("gsm8k_grpo", "gsm8k_drgrpo", "gsm8k_rloo", "gsm8k_gspo", "gsm8k_reinforce", "gsm8k_ppo",
             "gsm8k_grpo_lora")  # fmt: skip
    outcomes = []
    for name in names:
        result = _result(CASES[f"areal_{name}"])
        trainer = result.job["spec"]["trainer"]
        training = {k: trainer[k] for k in ("algorithm", "lora") if k in trainer}
        outcomes.append(f"refused {result.refused[0][0]}" if result.refused else yaml.safe_dump(training))
    assert len(set(outcomes)) == 7, outcomes
    assert "name: gae" in outcomes[5] and "rank: 16" in outcomes[6]  # gsm8k_grpo_lora: GRPO on LoRA


def test_verl_generated_default_config_imports_as_ppo_with_a_critic() -> None:
    """verl's own _generated_ppo_trainer.yaml (the wheel tools/setup.sh installs): every one of its keys
    gets a row, and its default gae becomes PPO with a critic (name gae); with a group estimator instead,
    its one sample per prompt is refused, not turned into GRPO over groups of one."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl's wheel is not installed (tools/setup.sh)")
    path = pathlib.Path(spec.submodule_search_locations[0]) / "trainer/config/_generated_ppo_trainer.yaml"
    config = yaml.safe_load(path.read_text())
    result = translate.translate("verl", config, reward="my_reward:score")
    assert len(result.rows) > 700 and not result.refused
    assert result.job["spec"]["trainer"]["algorithm"]["name"] == "gae"
    fixed = translate.translate(
        "verl", config, reward="my_reward:score",
        overrides=["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1"], refuse=False,
    )  # fmt: skip
    assert [key for key, _ in fixed.refused] == ["actor_rollout_ref.rollout.n"]  # groups of one: every A is 0
