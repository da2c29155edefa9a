"""Fixtures for the image smoke tests: the container engine and the images tools/build-images built.

- `engine`: podman (or docker whose daemon answers) with this repo's engine configuration
  (asyncrl_testing/images.py: tools/containers/, storage under ~/.cache/asyncrl/containers); the layer
  skips, with the reason in `-ra`'s summary, when there is none.
- `built`: `built(role)` is the role's image name (the API's and the chart's defaults) once it is in the
  engine's storage; a test of an image that was not built skips naming `tools/build-images`.
- `cluster` comes from asyncrl_testing/cluster_fixture.py (shared with tests/cluster).

Every run is hardened as the rendered pod runs it (`images.hardened`): a read-only root filesystem, the
image's non-root uid, tmpfs at /tmp (and at HOME for the workloads) that uid can write, as the pod's
emptyDirs, host network.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from asyncrl_testing import images


@dataclasses.dataclass(frozen=True)
class Runner:
    engine: images.Engine
    env: dict[str, str]

    @property
    def path(self) -> str:
        return self.engine.path

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Any engine command (`ps`, `rm`, ...) under the engine's environment."""
        return subprocess.run(
            [self.path, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def hardened(self, role: str, args: Sequence[str] = (), **options: Any) -> list[str]:
        """`run` of the role's image as its pod runs it (`images.hardened`), `args` for its entry point."""
        return images.run_command(
            self.engine, images.names()[role], args, **images.hardened(self.engine, role), **options
        )

    def run(
        self, role: str, *args: str, timeout: float = 120, **options: Any
    ) -> subprocess.CompletedProcess[str]:
        command = self.hardened(role, args, **options)
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)

    def remove(self, name: str) -> None:
        """`rm -f` without a stop timeout; a name that does not exist is fine."""
        flags = ["--ignore", "--time", "0"] if self.engine.name == "podman" else []
        self("rm", "-f", *flags, name, timeout=60)


@pytest.fixture(scope="session")
def engine() -> Runner:
    try:
        found = images.find_runner()
    except images.NoEngine as exc:
        pytest.skip(f"image smoke tests: {exc}")
    return Runner(found, found.environ())


@pytest.fixture(scope="session")
def built(engine: Runner) -> Callable[[str], str]:
    """`built(role)`: the role's image name, or a skip when it is not in the engine's storage."""
    present: dict[str, bool] = {}

    def image(role: str) -> str:
        name = images.names()[role]
        if role not in present:
            present[role] = engine.engine.image_exists(name)
        if not present[role]:
            pytest.skip(f"image {name} is not built (tools/build-images builds it)")
        return name

    return image
