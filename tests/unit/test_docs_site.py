"""The documentation as a site and the README as its entrance: `mkdocs build --strict` passes (no broken
link or anchor, no page left out of the navigation), the README stays one screen and its links resolve,
and its architecture diagram is the one docs/architecture.md keeps."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MAX_README_BYTES = 12 * 1024
MERMAID = re.compile(r"```mermaid\n.*?```", re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_site_builds_strictly(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("material", reason="mkdocs-material is in the dev extra (tools/setup.sh all)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    # Not --quiet: it silences the warnings --strict counts, and the build then passes whatever is broken.
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
         "-d", str(tmp_path / "site")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    warnings = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert (done.returncode, warnings) == (0, []), done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "api" / "index.html").is_file()


def test_the_readme_is_one_screen() -> None:
    assert len(README.read_bytes()) <= MAX_README_BYTES, "move the detail into a docs/ page and link it"


def test_every_relative_link_of_the_readme_resolves() -> None:
    targets = [t for t in LINK.findall(README.read_text()) if "://" not in t and not t.startswith("#")]
    assert targets, "the README links its docs pages"
    assert [t for t in targets if not (REPO / t.split("#", 1)[0]).exists()] == []


def test_the_readme_shows_the_architecture_diagram_of_its_docs_page() -> None:
    readme = MERMAID.findall(README.read_text())
    page = MERMAID.findall((REPO / "docs" / "architecture.md").read_text())
    assert len(readme) == 1 and readme == page, "keep README.md's diagram equal to docs/architecture.md's"
