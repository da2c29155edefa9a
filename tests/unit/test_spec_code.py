"""spec.code (your own Python without an image): admission, the rendered ConfigMap volume and PYTHONPATH on
both roles, the local runner's processes (pods.expand), and the rollout's start-up line when a module is
missing - run as the real `asyncrl-rollout` command."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from asyncrl_api import config as config_mod
from asyncrl_api import models
from asyncrl_operator import admission, render
from asyncrl_testing import jobs

CPU = {
    "rollout": {"replicas": 1, "gpusPerReplica": 0},
    "trainer": {"replicas": 1, "gpusPerReplica": 0},
    "weightSync": {"backend": "gloo"},
}


def _containers(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for obj in render.render(models.AsyncRLJob.model_validate(body)):
        if obj["kind"] == "StatefulSet" and obj["metadata"]["name"].endswith(("-rollout", "-trainer")):
            pod = obj["spec"]["template"]["spec"]
            out[obj["metadata"]["name"]] = {"pod": pod, "container": pod["containers"][0]}
    return out


def test_a_config_map_is_mounted_and_first_on_pythonpath_of_both_roles() -> None:
    parts = _containers(jobs.make_job("code", code={"configMap": "my-reward"}))
    assert set(parts) == {"code-rollout", "code-trainer"}
    for part in parts.values():
        assert {"name": "asyncrl-code", "configMap": {"name": "my-reward"}} in part["pod"]["volumes"]
        mount = {"name": "asyncrl-code", "mountPath": "/opt/asyncrl-code", "readOnly": True}
        assert mount in part["container"]["volumeMounts"]
        assert {"name": "PYTHONPATH", "value": "/opt/asyncrl-code"} in part["container"]["env"]


def test_a_path_goes_on_pythonpath_without_a_volume() -> None:
    body = jobs.make_job("code", code={"path": "/storage/code"})
    for part in _containers(body).values():
        assert {"name": "PYTHONPATH", "value": "/storage/code"} in part["container"]["env"]
        assert all(v["name"] != "asyncrl-code" for v in part["pod"]["volumes"])
    _, _, local = jobs.expand_locally(jobs.make_job("code", code={"path": "/storage/code"}, **CPU))
    assert {p.role: p.env["PYTHONPATH"] for p in local} == {
        "rollout": "/storage/code",
        "trainer": "/storage/code",
    }


def test_without_code_nothing_is_rendered() -> None:
    for part in _containers(jobs.make_job("plain")).values():
        assert all(e["name"] != "PYTHONPATH" for e in part["container"]["env"])


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ({}, "spec.code.configMap: code needs exactly one of configMap (its Python files) and path"),
        ({"configMap": "a", "path": "/b"}, "spec.code.configMap: code needs exactly one of configMap"),
        ({"path": "relative/dir"}, "spec.code.path: String should match pattern '^/'"),
        ({"configMap": "Not_A_Name"}, "spec.code.configMap: String should match pattern"),
    ],
)
def test_admission_names_the_field(code: dict[str, Any], message: str) -> None:
    _, why = admission.parse(jobs.make_job("code", code=code))
    assert why is not None and why.startswith(message)


def test_the_code_volume_and_mount_path_are_reserved() -> None:
    vol = {"name": "asyncrl-code", "claimName": "c", "mountPath": "/data"}
    _, why = admission.parse(jobs.make_job("code", volumes=[vol]))
    assert why is not None and "'asyncrl-code' is duplicated or reserved" in why
    vol = {"name": "code", "claimName": "c", "mountPath": "/opt/asyncrl-code"}
    _, why = admission.parse(jobs.make_job("code", volumes=[vol]))
    assert why is not None and "/opt/asyncrl-code is reserved for asyncrl" in why


REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == ground_truth)
"""


def _rollout(tmp_path: pathlib.Path, code: dict[str, Any], function: str) -> subprocess.CompletedProcess[str]:
    """`asyncrl-rollout` on the rendered config, with the env the local runner gives its process."""
    body = jobs.make_job(
        "code",
        model={"path": str(tmp_path / "model"), "create": {"kind": "tiny"}},
        reward={"function": function},
        code=code,
        **CPU,
    )
    _, cfg, local = jobs.expand_locally(body)
    (tmp_path / "job.json").write_text(config_mod.dumps(cfg))
    env = {**local[0].env, "PATH": str(pathlib.Path(sys.executable).parent)}
    command = [
        str(pathlib.Path(sys.executable).parent / "asyncrl-rollout"),
        "--config",
        str(tmp_path / "job.json"),
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_a_missing_module_is_one_line_naming_both_fields(tmp_path: pathlib.Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "my_reward.py").write_text(REWARD)
    done = _rollout(tmp_path, {"path": str(code)}, "my_rewards:compute_score")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "asyncrl-rollout: spec.reward.function: cannot import module 'my_rewards' (No module named"
        f" 'my_rewards'); spec.code.path puts {code} on PYTHONPATH, holding my_reward.py"
    )
    done = _rollout(tmp_path, {"configMap": "my-code"}, "my_reward:compute_score")
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith(
        "; spec.code.configMap: /opt/asyncrl-code is not there (a ConfigMap is a cluster object:"
        " asyncrl run takes code.path)"
    )


def test_the_processes_import_the_users_module(tmp_path: pathlib.Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "my_reward.py").write_text(textwrap.dedent(REWARD))
    _, _, local = jobs.expand_locally(jobs.make_job("code", code={"path": str(code)}, **CPU))
    check = (
        "from asyncrl_workloads.rewards import loader; "
        "fn = loader.load_reward('my_reward:compute_score'); "
        "print(loader.score(fn, {'reward_model': {'ground_truth': '4'}}, '4'))"
    )
    for pod in local:
        done = subprocess.run(
            [sys.executable, "-c", check], env=dict(pod.env), capture_output=True, text=True, check=True
        )
        assert done.stdout == "1.0\n"
