"""Every example's references load as its pods would load them at start-up: the reward function (or a
builtin task's, or none for a judge alone) and the agent's tools. Data and model paths aside (they live on
the user's volumes). A dangling reference in examples/ (examples/job.yaml once named a reward module that
did not exist, and only crash-looping pods told) fails here."""

from __future__ import annotations

import pytest
from asyncrl_api import models
from asyncrl_testing import jobs
from asyncrl_workloads.episode import tools as tools_mod
from asyncrl_workloads.rewards import scorer


@pytest.mark.parametrize("example", sorted(p.name for p in jobs.EXAMPLES.glob("*.yaml")))
def test_every_examples_reward_and_tools_load(example: str) -> None:
    spec = models.AsyncRLJob.model_validate(jobs.load_example(example)).spec
    function = scorer.resolve_function(spec.reward, spec.data.prompts)
    assert function is not None or spec.reward.type == "judge"
    if spec.agent is not None:
        assert set(tools_mod.load_tools(spec.agent.tools)) or spec.agent.loop == "gateway"
