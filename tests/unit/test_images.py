"""images/*/Dockerfile agree with what actually runs: render()'s pod commands and the chart's Deployment.

Every command the operator's render() puts in a container (for every example job, with and without
a managed NATS) must be a console script the package installs ([project.scripts] in pyproject.toml)
and the entry point of the image that role uses; the chart's operator command likewise. The
Dockerfiles are checked statically (no container runtime here): a non-root USER, an exec-form
ENTRYPOINT naming the console script, the CUDA bases the issue names, and an install of this repo.
"""

from __future__ import annotations

import json
import pathlib
import re
import tomllib
from typing import Any

import pytest
from asyncrl_api import models
from asyncrl_operator import render
from asyncrl_testing import jobs

REPO = pathlib.Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
ROLE_IMAGE = {"rollout": "rollout", "trainer": "trainer"}
EXTERNAL_IMAGES = {"nats"}  # the managed NATS pod runs the upstream nats-server image


def console_scripts() -> dict[str, str]:
    scripts: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    return scripts


def dockerfile(name: str) -> str:
    return (IMAGES / name / "Dockerfile").read_text()


def instruction(text: str, keyword: str) -> list[str]:
    """Arguments of every `keyword` instruction (continuation lines joined)."""
    joined = re.sub(r"\\\n", " ", text)
    return [m.group(1).strip() for m in re.finditer(rf"^{keyword}\s+(.+)$", joined, re.MULTILINE)]


def entrypoint(name: str) -> list[str]:
    (last,) = instruction(dockerfile(name), "ENTRYPOINT")[-1:]
    value: list[str] = json.loads(last)  # exec form only: signals reach the process
    return value


def rendered_containers() -> list[tuple[str, dict[str, Any]]]:
    """(role label, container) for every container of every pod template render() emits."""
    out = []
    for example in sorted(p.name for p in jobs.EXAMPLES.glob("*.yaml")):
        for managed in (True, False):
            body = jobs.load_example(example)
            body["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
            nats = {"managed": True} if managed else {"managed": False, "url": "nats://nats.example:4222"}
            body["spec"].setdefault("bus", {})["nats"] = nats
            for obj in render.render(models.AsyncRLJob.model_validate(body)):
                pod = obj.get("spec", {}).get("template", {})
                role = pod.get("metadata", {}).get("labels", {}).get("asyncrl.dev/role", "")
                for container in pod.get("spec", {}).get("containers", []):
                    out.append((role, container))
    return out


def test_render_emits_both_roles() -> None:
    roles = {role for role, _ in rendered_containers()}
    assert {"rollout", "trainer"} <= roles


def program(command: list[str]) -> str:
    """The asyncrl program a pod command runs: itself, or what `torchrun --no-python` launches."""
    if command[0] == "torchrun":
        assert "--no-python" in command, "torchrun must launch the console script, not a python file"
        return command[command.index("--no-python") + 1]
    return command[0]


def test_every_rendered_command_is_an_installed_console_script() -> None:
    scripts = console_scripts()
    launchers = set()
    for role, container in rendered_containers():
        if role in EXTERNAL_IMAGES:
            continue
        command = container.get("command") or []
        assert command, f"{role} container {container['name']} relies on the image's default entry point"
        launchers.add(command[0])
        script = program(command)
        assert script in scripts, f"{role} runs {script!r}, not a [project.scripts] entry"
        assert script == f"asyncrl-{ROLE_IMAGE[role]}"
        assert entrypoint(ROLE_IMAGE[role]) == [script], f"images/{role} ENTRYPOINT differs from render()"
    # torchrun (multi-GPU trainer pods) is torch's console script: only the trainer image has torch.
    assert launchers <= {"asyncrl-rollout", "asyncrl-trainer", "torchrun"}, launchers


def test_console_scripts_point_at_importable_callables() -> None:
    import importlib

    for script, target in console_scripts().items():
        module, _, attr = target.partition(":")
        try:
            loaded = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            pytest.fail(f"{script} -> {target}: {exc}")
        assert callable(getattr(loaded, attr, None)), f"{script} -> {target} is not callable"


def test_chart_runs_the_operator_console_script() -> None:
    deployment = (REPO / "charts" / "asyncrl-operator" / "templates" / "deployment.yaml").read_text()
    assert "command: [asyncrl-operator]" in deployment
    assert "asyncrl-operator" in console_scripts()
    assert entrypoint("operator") == ["asyncrl-operator"]


@pytest.mark.parametrize("name", ["operator", "rollout", "trainer"])
def test_dockerfile_runs_non_root_and_installs_this_repo(name: str) -> None:
    text = dockerfile(name)
    users = instruction(text, "USER")
    assert users and users[-1].split(":")[0] not in ("0", "root"), f"images/{name} runs as root"
    assert any("pyproject.toml" in c for c in instruction(text, "COPY"))
    installs = [
        r for r in instruction(text, "RUN") if re.search(r"pip install (--no-deps )?\"?\.(\[|\"| )", r)
    ]
    assert installs, f"images/{name} does not pip-install this repository"
    ignore = (IMAGES / name / "Dockerfile.dockerignore").read_text()
    assert "!operator/" in ignore and "!workloads/" in ignore


def test_bases_are_the_runtimes_the_roles_need() -> None:
    assert any("vllm/vllm-openai" in f for f in instruction(dockerfile("rollout"), "FROM"))
    trainer = dockerfile("trainer")
    assert any("pytorch" in f or "TORCH_IMAGE" in f for f in instruction(trainer, "FROM"))
    assert "megatron-core==" in trainer
    operator_steps = " ".join(
        instruction(dockerfile("operator"), "RUN") + instruction(dockerfile("operator"), "FROM")
    )
    assert "vllm" not in operator_steps and "torch" not in operator_steps
