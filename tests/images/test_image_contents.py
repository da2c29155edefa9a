"""The built images run their entry points, and hold what their code imports.

Each image is run as its pod runs it (read-only root filesystem, its non-root uid, tmpfs at /tmp and
HOME, host network: `Podman.hardened`):

- its entry point (the ENTRYPOINT, what render() and the chart run) answers `--help` with its usage and
  `--version` with asyncrl's version (pyproject.toml), exit code 0 both;
- every third-party top-level module the entry point's import closure can import, lazy imports
  included (asyncrl_testing/importgraph.py reads them from the source, as tests/unit/test_images.py
  checks them against the Dockerfiles statically), imports inside the image, together with the entry
  point's own module.

The trainer image carries vLLM: the trainer's NCCL weight sender is vLLM's trainer-side engine
(weightsync/nccl.py imports vllm.distributed.weight_transfer lazily; images/trainer/Dockerfile says why
it uses the rollout's vLLM build), so `vllm` is in the trainer's closure and must import there. Once the
weight-sync issue gives the trainer a sender of its own, the closure loses `vllm` and this test then
imports no vLLM in the trainer image (issue 22 asks that the trainer not need it from then on).
"""

from __future__ import annotations

import json
import pathlib
import tomllib

import pytest
from asyncrl_testing import importgraph

pytestmark = pytest.mark.images

REPO = pathlib.Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
ROLES = ("operator", "rollout", "trainer")

IMPORT_ALL = """
import importlib, json, sys
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:  # an image that cannot import must say why, not stop at the first
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failed))
"""


def entry_module(role: str) -> str:
    return str(PROJECT["scripts"][f"asyncrl-{role}"]).partition(":")[0]


@pytest.mark.parametrize("role", ROLES)
def test_the_entry_point_prints_its_usage_and_asyncrls_version(engine, built, role):
    built(role)
    help_run = engine.run(role, "--help")
    assert help_run.returncode == 0, help_run.stderr
    assert help_run.stdout.startswith(f"usage: asyncrl-{role} "), help_run.stdout
    version_run = engine.run(role, "--version")
    assert version_run.returncode == 0, version_run.stderr
    assert version_run.stdout == f"asyncrl-{role} {PROJECT['version']}\n"


@pytest.mark.parametrize("role", ROLES)
def test_every_module_the_entry_point_can_import_imports_in_its_image(engine, built, role):
    built(role)
    module = entry_module(role)
    third_party = importgraph.third_party_imports(module, [REPO / "operator", REPO / "workloads"])
    names = [module, *sorted(third_party)]
    done = engine.run(role, "-c", IMPORT_ALL, *names, entrypoint="python3", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    failed = json.loads(done.stdout.splitlines()[-1])
    assert failed == {}, {
        name: f"{why} (imported by {third_party.get(name, name)})" for name, why in failed.items()
    }
    if role == "trainer":  # today's NCCL sender is vLLM's (module docstring)
        assert third_party["vllm"] == "asyncrl_workloads.weightsync.nccl"
