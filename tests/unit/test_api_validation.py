"""Every malformed spec of golden/malformed.yaml is rejected by the models too (the local runner and the
operator's handler have no apiserver in front of them), naming the offending field."""

from __future__ import annotations

import re
from typing import Any

import pydantic
import pytest
from asyncrl_api import models
from asyncrl_testing import jobs

BASE, CASES = jobs.malformed_cases()


def test_the_base_spec_is_valid() -> None:
    models.AsyncRLJobSpec.model_validate(BASE)


@pytest.mark.parametrize(
    "agent",
    [
        {"tools": ["asyncrl_workloads.tasks.lookup:lookup"]},
        {
            "tools": ["asyncrl_workloads.tasks.lookup:lookup", "pkg.mod:other"],
            "toolParser": "asyncrl_workloads.tasks.lookup_parser:CompactParser",
            "stopTokens": [f"<{i:062d}>" for i in range(16)],
            "maxParallelCalls": 1,
            "maxEpisodeTokens": 1,
        },
    ],
    ids=["defaults", "at-the-limits"],
)
def test_an_agent_just_inside_the_limits_the_malformed_cases_cross_is_valid(agent: dict[str, Any]) -> None:
    spec = models.AsyncRLJobSpec.model_validate(
        jobs.deep_merge(BASE, {"data": {"format": "chat"}, "agent": agent})
    )
    assert spec.agent is not None and spec.agent.tools == agent["tools"]


def test_there_are_at_least_fifteen_cases() -> None:
    assert len(CASES) >= 15


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_malformed_spec_is_rejected_naming_its_field(case: dict[str, Any]) -> None:
    spec = jobs.deep_merge(BASE, case["patch"])
    with pytest.raises(pydantic.ValidationError) as info:
        models.AsyncRLJobSpec.model_validate(spec)
    leaf = re.sub(r"\[\d+\]", "", case["field"].rsplit(".", 1)[-1])
    assert leaf in str(info.value)


def test_the_handler_reports_field_paths_of_an_invalid_job() -> None:
    from asyncrl_operator import admission

    body = jobs.make_job(
        "demo",
        "ns",
        rollout={"replicas": -1},
        volumes=[{"name": "c", "claimName": "c", "mountPath": "/etc/asyncrl"}],
    )
    job, why = admission.parse(body)
    assert job is None and why is not None and "spec.rollout.replicas" in why
    _, why = admission.parse(
        jobs.make_job("demo", "ns", trainer={"gpusPerReplica": 6, "parallelism": {"tp": 4}})
    )
    assert why == "spec.trainer.parallelism.tp: parallelism.tp * parallelism.cp must divide gpusPerReplica"


def test_the_handler_rejects_names_the_crd_would_reject() -> None:
    from asyncrl_operator import admission

    job, why = admission.parse(jobs.make_job("x" * (models.MAX_NAME_LENGTH + 1), "ns"))
    assert job is None and why is not None and why.startswith("metadata.name")
    job, why = admission.parse(jobs.make_job("x" * models.MAX_NAME_LENGTH, "ns"))
    assert job is not None and why is None
