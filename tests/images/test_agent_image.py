"""The Claude Code agent worker's image (images/agent-claude-code, examples/claude-code.yaml) runs as its
pod does (read-only root, uid 10001, tmpfs at /tmp and HOME):

- `claude --version` is the version tools/setup.sh installs for the gateway e2e (the native binary, no
  Node in the image), and `asyncrl agent` (the builtin driver the rendered worker runs) answers;
- a worker whose command names a script of the checkout (`asyncrl run --containers`: examples/agents/
  claude_code_driver.py, standard library only; lookup_agent.py, the openai SDK and httpx, in the rollout
  image that workers.image defaults to) runs it from the read-only bind mount `pods.host_arguments`
  gives, the container argv built by `containers.run_argv` as the runner builds it.

A whole session through this image against a serving gateway: tests/e2e/test_gateway_clients.py.
"""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest
from asyncrl_testing import images
from asyncrl_workloads.local import containers, pods

pytestmark = pytest.mark.images

REPO = pathlib.Path(__file__).resolve().parents[2]
ROLE = "agent-claude-code"
SETUP_VERSION = re.findall(r"^CLAUDE_CODE_VERSION=(\S+)$", (REPO / "tools" / "setup.sh").read_text(), re.M)[0]


def test_claude_code_and_the_driver_run_in_the_hardened_image(engine, built):
    built(ROLE)
    version = engine.run(ROLE, "--version", entrypoint="claude")
    assert version.returncode == 0, version.stderr
    assert version.stdout.split()[0] == SETUP_VERSION, version.stdout
    usage = engine.run(ROLE, "agent", "--help")
    assert usage.returncode == 0 and usage.stdout.startswith("usage: asyncrl agent "), usage.stdout
    node = engine.run(ROLE, "-c", "command -v node npm", entrypoint="/bin/sh")
    assert node.returncode != 0 and node.stdout == "", node.stdout


@pytest.mark.parametrize(
    ("role", "script"),
    [
        (ROLE, "claude_code_driver.py"),
        # workers.image's default, with the example agent examples/gateway-cpu.yaml's worker runs
        ("rollout", "lookup_agent.py"),
    ],
)
def test_a_workers_script_from_the_checkout_runs_in_the_image(engine, built, role, script):
    image = built(role)
    argv, paths = pods.host_arguments(["python3", f"examples/agents/{script}", "--help"], REPO)
    user, home = images.USERS[role]
    pod = pods.LocalPod(
        name="cc-agent-0",
        role=pods.AGENT_ROLE,
        replica=0,
        argv=tuple(argv),
        env={},
        metrics_port=0,
        container=pods.PodContainer(
            image=image, argv=tuple(argv), user=user, read_only_root=True, empty_dirs=("/tmp", home),
            host_paths=paths,
        ),
    )  # fmt: skip
    command = containers.run_argv(engine.path, "imagetest", pod, [], ())
    done = subprocess.run(command, env=engine.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"usage: {script}"), done.stdout[:500]
