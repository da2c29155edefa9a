"""The YAML the chart ships and users apply means the same to Go as to Python.

kubectl and helm parse YAML with sigs.k8s.io/yaml (YAML 1.1 rules: an unquoted key `n`, `y`, `no`,
`on`, ... is a boolean and becomes the JSON key "false"/"true"), while the generator and the tests
use PyYAML. This test parses each file with the real helm binary's `fromYaml` (sigs.k8s.io/yaml) and
compares the JSON with PyYAML's reading, so a key that Kubernetes would silently rename fails here
instead of being pruned by the apiserver.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
from typing import Any

import pytest
import yaml
from asyncrl_testing import cluster_bins

REPO = pathlib.Path(__file__).resolve().parents[2]
FILES = [REPO / "charts" / "asyncrl-operator" / "files" / "crds" / "asyncrl.dev_asyncrljobs.yaml",
         *sorted((REPO / "examples").glob("*.yaml"))]  # fmt: skip


def go_yaml_as_json(path: pathlib.Path, workdir: pathlib.Path) -> Any:
    """The file parsed by sigs.k8s.io/yaml inside the real helm binary, as JSON."""
    helm = cluster_bins.cache_dir() / f"helm-{cluster_bins.HELM_VERSION}" / "helm"
    if not os.access(helm, os.X_OK):
        pytest.fail(f"helm not found at {helm}: build it with {cluster_bins.BUILD_COMMAND} helm")
    chart = workdir / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.0.1\n")
    (chart / "input.yaml").write_text(path.read_text())
    (chart / "templates" / "out.yaml").write_text('{{ .Files.Get "input.yaml" | fromYaml | toJson }}\n')
    done = subprocess.run(
        [str(helm), "template", "p", str(chart)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    body = done.stdout.split("\n", 2)[2]  # drop "---" and "# Source: ..."
    return json.loads(body)


def differences(go: Any, py: Any, where: str = "") -> list[str]:
    if isinstance(go, dict) and isinstance(py, dict):
        out = [f"{where}: key {k!r} only in Go's reading" for k in go.keys() - py.keys()]
        out += [f"{where}: key {k!r} lost by Go's reading" for k in py.keys() - go.keys()]
        for key in go.keys() & py.keys():
            out += differences(go[key], py[key], f"{where}.{key}")
        return out
    if isinstance(go, list) and isinstance(py, list):
        if len(go) != len(py):
            return [f"{where}: list length {len(go)} != {len(py)}"]
        return [
            d for i, (g, p) in enumerate(zip(go, py, strict=True)) for d in differences(g, p, f"{where}[{i}]")
        ]
    if isinstance(go, (int, float)) and isinstance(py, (int, float)) and not isinstance(py, bool):
        return [] if float(go) == float(py) else [f"{where}: {go!r} != {py!r}"]
    return [] if go == py else [f"{where}: Go reads {go!r}, PyYAML reads {py!r}"]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_go_yaml_reads_what_python_wrote(path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    python_reading = json.loads(json.dumps(yaml.safe_load(path.read_text()), default=str))
    found = differences(go_yaml_as_json(path, tmp_path), python_reading)
    assert not found, f"{path.relative_to(REPO)} reads differently under kubectl/helm:\n" + "\n".join(
        found[:20]
    )
