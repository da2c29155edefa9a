"""render(job) for every example job equals its golden snapshot (whole objects compared).

Regenerate after an intended change: ASYNCRL_UPDATE_GOLDEN=1 pytest tests/unit/test_render_golden.py
"""

from __future__ import annotations

import os
import pathlib

import pytest
import yaml
from asyncrl_api import models
from asyncrl_operator import render
from asyncrl_testing import jobs

GOLDEN = pathlib.Path(__file__).parent / "golden"
EXAMPLES = sorted(p.name for p in jobs.EXAMPLES.glob("*.yaml"))


def _render_example(example: str) -> str:
    body = jobs.load_example(example, namespace="team-a")
    body["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    objects = render.render(models.AsyncRLJob.model_validate(body))
    return yaml.safe_dump_all(objects, sort_keys=True)


@pytest.mark.parametrize("example", EXAMPLES)
def test_render_matches_golden(example: str) -> None:
    golden = GOLDEN / f"render-{example}"
    text = _render_example(example)
    if os.environ.get("ASYNCRL_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"no golden file {golden.name}: run with ASYNCRL_UPDATE_GOLDEN=1"
    assert text == golden.read_text()


def test_examples_exist() -> None:
    assert {"job.yaml", "tiny-cpu.yaml"} <= set(EXAMPLES)
