"""Pod hardening in render(job): security contexts, the emptyDirs of a read-only root, ephemeral storage,
probes, PodDisruptionBudgets, egress, and the managed NATS server's share of each."""

from __future__ import annotations

from typing import Any

import pytest
from asyncrl_api import models
from asyncrl_operator import render
from asyncrl_operator.render import names, security
from asyncrl_testing import jobs

ROLES = (names.ROLLOUT, names.TRAINER)


def _job(**patch: Any) -> models.AsyncRLJob:
    body = jobs.make_job("demo", "ns", **patch)
    body["metadata"]["uid"] = "uid-1"
    return models.AsyncRLJob.model_validate(body)


def _objects(job: models.AsyncRLJob) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in render.render(job)}


def _pod(objects: dict[tuple[str, str], dict[str, Any]], role: str) -> dict[str, Any]:
    pod: dict[str, Any] = objects[("StatefulSet", f"demo-{role}")]["spec"]["template"]["spec"]
    return pod


def _mounts(pod: dict[str, Any]) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}


@pytest.mark.parametrize("role", [*ROLES, names.NATS])
def test_pods_run_as_uid_10001_with_a_read_only_root_and_no_privilege(role: str) -> None:
    pod = _pod(_objects(_job()), role)
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["runAsUser"] == 10001 and sc["runAsNonRoot"] is True
    assert container["resources"]["requests"]["ephemeral-storage"]
    assert container["resources"]["limits"]["ephemeral-storage"]


@pytest.mark.parametrize("role", ROLES)
def test_workload_pods_write_to_emptydirs_at_tmp_and_home(role: str) -> None:
    pod = _pod(_objects(_job()), role)
    mounts = _mounts(pod)
    assert mounts["/tmp"] == security.TMP_VOLUME and mounts["/home/asyncrl"] == security.HOME_VOLUME
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[security.TMP_VOLUME]["emptyDir"] == {} and volumes[security.HOME_VOLUME]["emptyDir"] == {}


def test_checkpoints_on_no_volume_get_an_emptydir_and_on_a_volume_none() -> None:
    bare = _mounts(_pod(_objects(_job()), names.TRAINER))
    assert bare["/checkpoints"] == security.CHECKPOINT_VOLUME  # the default path, on no volume
    assert "/checkpoints" not in _mounts(_pod(_objects(_job()), names.ROLLOUT))
    on_volume = _job(
        volumes=[{"name": "data", "claimName": "c", "mountPath": "/storage"}],
        trainer={"checkpoint": {"path": "/storage/ckpt"}},
    )
    assert security.CHECKPOINT_VOLUME not in _mounts(_pod(_objects(on_volume), names.TRAINER)).values()
    under_tmp = _job(trainer={"checkpoint": {"path": "/tmp/ckpt"}})
    assert security.CHECKPOINT_VOLUME not in _mounts(_pod(_objects(under_tmp), names.TRAINER)).values()


def test_a_tiny_model_created_on_no_volume_gets_an_emptydir_in_both_roles() -> None:
    job = _job(model={"path": "/models/tiny", "create": {}})
    for role in ROLES:
        assert _mounts(_pod(_objects(job), role))["/models/tiny"] == security.MODEL_VOLUME
    assert security.MODEL_VOLUME not in _mounts(_pod(_objects(_job()), names.ROLLOUT)).values()


def test_a_roles_own_ephemeral_storage_replaces_the_defaults() -> None:
    job = _job(rollout={"resources": {"limits": {"ephemeral-storage": "200Gi"}}})
    resources = _pod(_objects(job), names.ROLLOUT)["containers"][0]["resources"]
    assert resources["limits"]["ephemeral-storage"] == "200Gi"
    assert "ephemeral-storage" not in resources.get("requests", {})  # the API server copies the limit
    trainer = _pod(_objects(job), names.TRAINER)["containers"][0]["resources"]
    assert trainer["requests"]["ephemeral-storage"] == security.EPHEMERAL_REQUEST


def test_rollout_readiness_is_engine_ready_and_differs_from_liveness() -> None:
    objects = _objects(_job())
    rollout = _pod(objects, names.ROLLOUT)["containers"][0]
    assert rollout["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert rollout["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert rollout["startupProbe"]["httpGet"]["path"] == "/healthz"
    trainer = _pod(objects, names.TRAINER)["containers"][0]
    assert trainer["readinessProbe"]["httpGet"]["path"] != trainer["livenessProbe"]["httpGet"]["path"]
    nats = _pod(objects, names.NATS)["containers"][0]
    assert nats["readinessProbe"]["httpGet"] != nats["livenessProbe"]["httpGet"]


def test_disruption_budgets_allow_one_rollout_and_no_trainer_eviction() -> None:
    objects = _objects(_job())
    for role, max_unavailable in ((names.ROLLOUT, 1), (names.TRAINER, 0)):
        pdb = objects[("PodDisruptionBudget", f"demo-{role}")]["spec"]
        assert pdb["maxUnavailable"] == max_unavailable
        assert pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        sts = objects[("StatefulSet", f"demo-{role}")]
        assert pdb["selector"] == sts["spec"]["selector"]
    assert ("PodDisruptionBudget", "demo-nats") not in objects


def _egress(job: models.AsyncRLJob) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = _objects(job)[("NetworkPolicy", "demo-net")]["spec"]["egress"]
    return rules


def test_egress_reaches_the_jobs_pods_and_dns_only_by_default() -> None:
    policy = _objects(_job())[("NetworkPolicy", "demo-net")]["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    job_pods = {
        "matchLabels": {names.JOB: "demo"},
        "matchExpressions": [{"key": names.ROLE, "operator": "NotIn", "values": [names.AGENT]}],
    }
    assert policy["egress"] == [
        {"to": [{"podSelector": job_pods}]},
        {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
    ]


def test_egress_to_an_external_bus_is_its_address_or_its_port() -> None:
    by_ip = _job(bus={"nats": {"managed": False, "url": "nats://10.1.2.3:4333"}})
    assert _egress(by_ip)[2] == {
        "to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}],
        "ports": [{"protocol": "TCP", "port": 4333}],
    }
    by_name = _job(bus={"nats": {"managed": False, "url": "tls://bus.infra.svc"}})
    assert _egress(by_name)[2] == {"ports": [{"protocol": "TCP", "port": 4222}]}


def test_egress_reaches_the_judge_and_teacher_ports() -> None:
    body = jobs.load_example("judge-teacher.yaml", namespace="ns")
    body["metadata"].update(name="demo", uid="u")
    rules = _egress(models.AsyncRLJob.model_validate(body))
    assert rules[2:] == [{"ports": [{"protocol": "TCP", "port": 8000}]}]  # both on :8000, one rule


def test_only_the_trainer_reaches_the_api_server() -> None:
    policy = _objects(_job())[("NetworkPolicy", "demo-trainer-egress")]["spec"]
    assert policy["podSelector"] == {"matchLabels": names.selector("demo", names.TRAINER)}
    assert policy["policyTypes"] == ["Egress"]
    assert {p["port"] for p in policy["egress"][0]["ports"]} == {443, 6443}


@pytest.mark.parametrize("path", ["/tmp", "/home/asyncrl/"])
def test_a_volume_on_an_operator_mount_is_refused(path: str) -> None:
    with pytest.raises(ValueError, match=r"volumes\[0\]\.mountPath"):
        _job(volumes=[{"name": "v", "claimName": "c", "mountPath": path}])
