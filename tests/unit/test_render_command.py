"""`asyncrl render JOB.yaml`: the operator's own render() after its own admission, printed like helm
template. Every example prints exactly its golden snapshot (tests/unit/golden, the operator's render of the
same file; the uid the apiserver would assign aside); a refused job prints the admission message and
nothing else. The cluster layer compares the printout with what the operator creates on the real apiserver
(tests/cluster/test_operator.py)."""

from __future__ import annotations

import pathlib

import pytest
import yaml
from asyncrl_testing import jobs
from asyncrl_workloads import cli

GOLDEN = pathlib.Path(__file__).parent / "golden"
EXAMPLES = sorted(p.name for p in jobs.EXAMPLES.glob("*.yaml"))
UID = "00000000-0000-0000-0000-000000000001"


def render(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["render", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_prints_the_operators_render(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = render(capsys, str(jobs.EXAMPLES / example), "--namespace", "team-a")
    assert rc == 0, err
    objects = list(yaml.safe_load_all(out))
    for obj in objects:
        for ref in obj["metadata"].get("ownerReferences", []):
            assert ref["uid"] == ""  # assigned by the apiserver on apply
            ref["uid"] = UID
    assert yaml.safe_dump_all(objects, sort_keys=True) == (GOLDEN / f"render-{example}").read_text()


def test_the_namespace_defaults_to_the_files_then_default(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = jobs.load_example("tiny-cpu.yaml")
    body["metadata"].pop("namespace", None)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(body))
    rc, out, _ = render(capsys, str(path))
    assert rc == 0 and {o["metadata"]["namespace"] for o in yaml.safe_load_all(out)} == {"default"}
    body["metadata"]["namespace"] = "ml"
    path.write_text(yaml.safe_dump(body))
    rc, out, _ = render(capsys, str(path))
    assert rc == 0 and {o["metadata"]["namespace"] for o in yaml.safe_load_all(out)} == {"ml"}
    rc, out, err = render(capsys, str(path), "-n", "other")
    assert rc == 2 and out == ""
    assert "metadata.namespace 'ml' does not match --namespace 'other'" in err


def test_other_documents_are_skipped_and_a_refused_job_prints_its_admission_message(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "k"}, "stringData": {"apiKey": "x"}}
    job = jobs.make_job("demo", "ns", trainer={"gpusPerReplica": 6, "parallelism": {"tp": 4}})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump_all([secret, job]))
    rc, out, err = render(capsys, str(path))
    assert rc == 2 and out == ""
    assert err.splitlines() == [
        "asyncrl render: skipped document 0 (kind 'Secret')",
        f"asyncrl render: {path}: document 1: spec.trainer.parallelism.tp: parallelism.tp * parallelism.cp "
        "must divide gpusPerReplica",
    ]
    job = jobs.make_job("x" * 200, "ns")
    path.write_text(yaml.safe_dump(job))
    rc, out, err = render(capsys, str(path))
    assert rc == 2 and out == "" and err.startswith(f"asyncrl render: {path}: metadata.name: may be at most")
    path.write_text(yaml.safe_dump({**jobs.make_job("demo", "ns"), "apiVersion": "asyncrl.dev/v1"}))
    rc, out, err = render(capsys, str(path))
    assert rc == 2 and "apiVersion: expected asyncrl.dev/v1alpha1, got 'asyncrl.dev/v1'" in err
    path.write_text("kind: [")
    rc, out, err = render(capsys, str(path))
    assert rc == 2 and "not valid YAML" in err
