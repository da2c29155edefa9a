"""The container engine, its configuration and the images' names, for tools/build-images and tests.

tools/build-images builds the images with what `find_engine` returns (`python -m asyncrl_testing.images
env` prints it for the shell); the image smoke tests run them with `run_command` under `environ()`.

- Names are the defaults users get, read where they are defined: the rollout and trainer images from
  the API (asyncrl_api.roles), the operator's from the chart (values.yaml image.registry/repository, the
  tag falling back to Chart.yaml's appVersion as the Deployment template does); the Claude Code agent
  worker's (images/agent-claude-code, examples/claude-code.yaml) with the operator's tag.
- Engines, in order of preference: docker (only if its daemon answers), podman, buildah (builds only:
  it cannot run an image the way the tests do). ASYNCRL_ENGINE picks one.
- podman and buildah read our own files, never the system's: CONTAINERS_CONF is
  tools/containers/containers.conf (runc, cgroupfs, ulimits this machine kind accepts) and
  CONTAINERS_STORAGE_CONF is written under the cache ($ASYNCRL_CACHE/containers, default
  ~/.cache/asyncrl/containers) so images and the layer cache persist between CI runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from typing import TypedDict

import yaml
from asyncrl_api import roles

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "tools" / "containers"
CHART = REPO_ROOT / "charts" / "asyncrl-operator"
ENGINES = ("docker", "podman", "buildah")
RUNNERS = ("docker", "podman")
"""Engines that can run an image (buildah only builds)."""
WORKLOAD_USER = "10001:10001"
"""uid:gid of the rollout and trainer images' `asyncrl` user, whose HOME is WORKLOAD_HOME."""
WORKLOAD_HOME = "/home/asyncrl"
AGENT_REPOSITORY = "ghcr.io/asyncrl/agent"
"""The agent worker images' (images/agent-<cli>): ghcr.io/asyncrl/agent-claude-code, tagged as the chart's."""
USERS = {
    "operator": ("65532:65532", "/tmp"),
    "rollout": (WORKLOAD_USER, WORKLOAD_HOME),
    "trainer": (WORKLOAD_USER, WORKLOAD_HOME),
    "agent-claude-code": (WORKLOAD_USER, WORKLOAD_HOME),
}
"""role -> (uid:gid, HOME) its image runs as: the workload images' `asyncrl` user, 65532 for the operator."""
SHM_SIZE = "1g"
"""vLLM's engine allocates its shared-memory rings in /dev/shm (160 MiB for the tiny CPU model); podman's
default 64 MiB, like a pod's, is refused with "Insufficient space in /dev/shm"."""


def version() -> str:
    """The project's version (pyproject.toml): the images' version label."""
    project: dict[str, str] = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return project["version"]


def names() -> dict[str, str]:
    """role -> the image reference the API and the chart default to."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["image"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    tag = values.get("tag") or chart["appVersion"]
    return {
        "operator": f"{values['registry']}/{values['repository']}:{tag}",
        "rollout": roles.DEFAULT_ROLLOUT_IMAGE,
        "trainer": roles.DEFAULT_TRAINER_IMAGE,
        "agent-claude-code": f"{AGENT_REPOSITORY}-claude-code:{tag}",
    }


def storage_dir() -> pathlib.Path:
    cache = pathlib.Path(os.environ.get("ASYNCRL_CACHE", pathlib.Path.home() / ".cache" / "asyncrl"))
    return cache / "containers"


def storage_conf() -> pathlib.Path:
    """Our storage.conf (written from tools/containers/storage.conf.in when it differs)."""
    root = storage_dir()
    text = (CONF_DIR / "storage.conf.in").read_text().replace("@STORAGE@", str(root))
    path = root / "storage.conf"
    if not path.exists() or path.read_text() != text:
        root.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def engine_env(name: str) -> dict[str, str]:
    """Variables the engine needs beside os.environ (none for docker)."""
    if name == "docker":
        return {}
    return {
        "CONTAINERS_CONF": str(CONF_DIR / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(storage_conf()),
    }


@dataclasses.dataclass(frozen=True)
class Engine:
    name: str
    path: str

    def environ(self) -> dict[str, str]:
        """os.environ plus what this engine needs: pass as `env=` to every engine command."""
        return {**os.environ, **engine_env(self.name)}

    def image_exists(self, image: str) -> bool:
        command = [self.path, "image", "inspect", image]
        if self.name == "buildah":
            command = [self.path, "inspect", "--type", "image", image]
        done = subprocess.run(command, env=self.environ(), capture_output=True, timeout=60, check=False)
        return done.returncode == 0


class NoEngine(RuntimeError):
    """No usable engine; the message says what was tried and why each one was refused."""


def _usable(name: str) -> str | None:
    """None if engine `name` is installed and works here, else why not."""
    path = shutil.which(name)
    if path is None:
        return f"{name}: not installed"
    if name != "docker":
        return None
    try:
        done = subprocess.run([path, "info"], capture_output=True, text=True, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        return "docker: `docker info` did not answer in 20 s"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"docker: the client is installed but its daemon does not answer ({why})"
    return None


def find_engine(prefer: str | None = None, among: Iterable[str] = ENGINES) -> Engine:
    """The first usable engine of `among` (or `prefer`, else ASYNCRL_ENGINE, alone)."""
    prefer = prefer or os.environ.get("ASYNCRL_ENGINE") or None
    candidates = [prefer] if prefer else list(among)
    refused = []
    for name in candidates:
        if name not in ENGINES:
            raise NoEngine(f"unknown engine {name!r}: one of {', '.join(ENGINES)}")
        why = _usable(name)
        if why is None:
            return Engine(name, shutil.which(name) or name)
        refused.append(why)
    raise NoEngine("no container engine: " + "; ".join(refused))


def find_runner(prefer: str | None = None) -> Engine:
    """An engine that can run images the way the smoke tests do (docker or podman)."""
    prefer = prefer or os.environ.get("ASYNCRL_ENGINE") or None
    if prefer == "buildah":
        prefer = None  # buildah built them into the same storage podman reads
    return find_engine(prefer, RUNNERS)


class Hardening(TypedDict):
    user: str
    read_only: bool
    tmpfs: list[str]
    shm_size: str | None


def hardened(engine: Engine, role: str) -> Hardening:
    """run_command keywords that run `role`'s image as its hardened pod does: the image's non-root
    uid/gid, a read-only root filesystem, and writable tmpfs at /tmp and HOME (the pod's emptyDirs).

    podman gives a tmpfs over an image directory that directory's mode (HOME is 0755 asyncrl's), owned
    by root, whatever `mode=` says: `U` hands it to the container's user, as fsGroup does an emptyDir.
    """
    user, home = USERS[role]
    tmpfs = ["/tmp:rw,exec,mode=1777"]
    if home != "/tmp":
        tmpfs.append(f"{home}:rw,exec,U" if engine.name == "podman" else f"{home}:rw,exec,mode=1777")
    return {
        "user": user,
        "read_only": True,
        "tmpfs": tmpfs,
        "shm_size": SHM_SIZE if role != "operator" else None,
    }


def run_command(
    engine: Engine,
    image: str,
    args: Sequence[str] = (),
    *,
    name: str | None = None,
    user: str | None = None,
    read_only: bool = False,
    tmpfs: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    volumes: Sequence[str] = (),
    entrypoint: str | None = None,
    detach: bool = False,
    shm_size: str | None = None,
) -> list[str]:
    """`<engine> run` for `image` on the host network, removed when it exits.

    runc, cgroupfs and the ulimits come from CONTAINERS_CONF (engine.environ()): run the command
    with that environment. `read_only` + `tmpfs` + `user` reproduce the hardened pod (read-only root,
    emptyDirs at /tmp and HOME, the image's non-root uid: `**hardened(engine, role)` gives them);
    volumes are `host:container[:ro]`.
    """
    command = [engine.path, "run", "--rm", "--network", "host"]
    if detach:
        command.append("--detach")
    if name:
        command += ["--name", name]
    if user:
        command += ["--user", user]
    if read_only:
        command.append("--read-only")
    for path in tmpfs:
        command += ["--tmpfs", path]
    if shm_size:
        command += ["--shm-size", shm_size]
    for key, value in (env or {}).items():
        command += ["--env", f"{key}={value}"]
    for volume in volumes:
        command += ["--volume", volume]
    if entrypoint is not None:
        command += ["--entrypoint", entrypoint]
    return [*command, image, *args]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asyncrl_testing.images", description=__doc__)
    parser.add_argument("what", choices=["env", "names"])
    parser.add_argument("--engine", choices=ENGINES, help="default: ASYNCRL_ENGINE, else the first usable")
    args = parser.parse_args(argv)
    if args.what == "names":
        for role, image in names().items():
            print(role, image)
        return 0
    try:
        engine = find_engine(args.engine)
    except NoEngine as exc:
        print(exc, file=sys.stderr)
        return 1
    lines = [f"ENGINE={engine.name}", f"ENGINE_PATH={shlex.quote(engine.path)}"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in engine_env(engine.name).items()]
    lines += [f"VERSION={shlex.quote(version())}", f"STORAGE={shlex.quote(str(storage_dir()))}"]
    lines += [f"IMAGE_{role.replace('-', '_')}={shlex.quote(image)}" for role, image in names().items()]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
