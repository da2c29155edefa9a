"""Properties of render(job) that must hold for any job: names, labels, owners, wiring, suspend, hashes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asyncrl_api import config, models
from asyncrl_operator import render
from asyncrl_operator.render import configmap, names
from asyncrl_testing import jobs


def _job(name: str = "demo", **patch: Any) -> models.AsyncRLJob:
    body = jobs.make_job(name, "ns", **patch)
    body["metadata"]["uid"] = "uid-1"
    return models.AsyncRLJob.model_validate(body)


def _by_kind(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["labels"][names.ROLE]): o for o in objects}


def _container(sts: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = sts["spec"]["template"]["spec"]["containers"][0]
    return container


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_every_object_is_owned_labelled_and_namespaced() -> None:
    for obj in render.render(_job()):
        meta = obj["metadata"]
        assert meta["namespace"] == "ns"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "asyncrl.dev/v1alpha1",
                "kind": "AsyncRLJob",
                "name": "demo",
                "uid": "uid-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["labels"][names.JOB] == "demo"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "asyncrl-operator"


@pytest.mark.parametrize("length", [1, 40, 63, 120, 253])
def test_names_stay_within_63_characters_for_any_name(length: int) -> None:
    name = ("a" * length)[:length]
    job = models.AsyncRLJob.model_validate(
        {**jobs.make_job("x", "ns"), "metadata": {"name": name, "uid": "u"}}
    )
    objects = render.render(job)
    child_names = [o["metadata"]["name"] for o in objects]
    assert all(len(n) <= names.MAX_CHILD_NAME for n in child_names)
    assert len(set(render.kinds_and_names(objects))) == len(objects)
    for obj in objects:
        assert all(len(v) <= 63 for v in obj["metadata"]["labels"].values())
        if obj["kind"] == "StatefulSet":  # pod name "<sts>-<ordinal>" and controller-revision-hash label
            assert len(obj["metadata"]["name"]) + len("-1023") <= 63


def test_long_names_keep_distinct_children() -> None:
    a, b = "x" * 60 + "a", "x" * 60 + "b"
    assert names.trainer(a) != names.trainer(b)


def test_configmap_carries_the_job_config_with_in_cluster_endpoints() -> None:
    objects = render.render(_job())
    cm = next(o for o in objects if o["kind"] == "ConfigMap")
    assert cm["metadata"]["name"] == "demo-config"
    cfg = config.JobConfig.model_validate_json(cm["data"]["job.json"])
    assert cfg.endpoints.nats_url == "nats://demo-nats.ns.svc:4222"
    assert cfg.endpoints.trainer_host == "demo-trainer-0.demo-trainer.ns.svc"
    assert cfg.endpoints.weight_sync_port == 29600
    assert cfg.spec == _job().spec


def test_external_nats_renders_no_server_and_points_at_the_url() -> None:
    job = _job(bus={"nats": {"managed": False, "url": "nats://bus.infra:4222"}})
    objects = render.render(job)
    assert not any(o["metadata"]["name"] == "demo-nats" for o in objects)
    assert configmap.job_config(job).endpoints.nats_url == "nats://bus.infra:4222"


def test_trainer_is_wired_like_torchrun() -> None:
    objects = _by_kind(render.render(_job(trainer={"replicas": 2, "gpusPerReplica": 1})))
    sts = objects[("StatefulSet", "trainer")]
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["podManagementPolicy"] == "Parallel"
    container = _container(sts)
    env = _env(container)
    assert env["WORLD_SIZE"] == "2" and env["LOCAL_RANK"] == "0"
    assert env["RANK"] == {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}
    assert env["MASTER_ADDR"] == "demo-trainer-0.demo-trainer.ns.svc" and env["MASTER_PORT"] == "29500"
    assert env["ASYNCRL_ROLE"] == "trainer"
    assert container["command"] == ["asyncrl-trainer", "--config", "/etc/asyncrl/job.json"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    svc = objects[("Service", "trainer")]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True


def test_multi_gpu_trainer_pods_run_torchrun() -> None:
    sts = _by_kind(render.render(_job(trainer={"replicas": 2, "gpusPerReplica": 4})))[
        ("StatefulSet", "trainer")
    ]
    command = _container(sts)["command"]
    assert command[:3] == ["torchrun", "--nnodes=2", "--nproc-per-node=4"]
    assert command[-4:] == ["--no-python", "asyncrl-trainer", "--config", "/etc/asyncrl/job.json"]
    assert "RANK" not in _env(_container(sts))


def test_megatron_trainer_pods_get_one_cuda_work_queue() -> None:
    megatron = {"replicas": 1, "gpusPerReplica": 2, "backend": "megatron", "parallelism": {"tp": 2}}
    for trainer, expected in (({"replicas": 1, "gpusPerReplica": 2}, None), (megatron, "1")):
        sts = _by_kind(render.render(_job(trainer=trainer)))[("StatefulSet", "trainer")]
        assert _env(_container(sts)).get("CUDA_DEVICE_MAX_CONNECTIONS") == expected


def test_rollout_has_gpus_identity_and_no_api_token() -> None:
    sts = _by_kind(render.render(_job(rollout={"replicas": 3, "gpusPerReplica": 2})))[
        ("StatefulSet", "rollout")
    ]
    assert sts["spec"]["replicas"] == 3
    pod = sts["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    container = _container(sts)
    assert container["command"] == ["asyncrl-rollout", "--config", "/etc/asyncrl/job.json"]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert _env(container)["ASYNCRL_REPLICA"] == {
        "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}
    }


@pytest.mark.parametrize("patch", [{"suspend": True}])
def test_suspend_scales_both_roles_to_zero_and_keeps_the_bus(patch: dict[str, Any]) -> None:
    objects = _by_kind(render.render(_job(**patch)))
    assert objects[("StatefulSet", "rollout")]["spec"]["replicas"] == 0
    assert objects[("StatefulSet", "trainer")]["spec"]["replicas"] == 0
    assert objects[("StatefulSet", "nats")]["spec"]["replicas"] == 1


def test_finished_jobs_run_no_pods() -> None:
    job = _job()
    job.status.phase = "Succeeded"
    objects = _by_kind(render.render(job))
    assert objects[("StatefulSet", "trainer")]["spec"]["replicas"] == 0


def _hash(job: models.AsyncRLJob) -> str:
    sts = _by_kind(render.render(job))[("StatefulSet", "trainer")]
    value: str = sts["spec"]["template"]["metadata"]["annotations"][names.CONFIG_HASH]
    return value


def test_config_hash_ignores_live_fields_but_tracks_the_rest() -> None:
    base = _hash(_job())
    assert _hash(_job(rollout={"replicas": 7})) == base
    assert _hash(_job(suspend=True, maxSteps=10, ttlSecondsAfterFinished=5)) == base
    assert _hash(_job(trainer={"optimizer": {"lr": 3e-6}})) != base


JOB_PODS = {
    "matchLabels": {names.JOB: "demo"},
    "matchExpressions": [{"key": names.ROLE, "operator": "NotIn", "values": [names.AGENT]}],
}
"""The job's own pods: its agent workers run the user's code and get only the gateway's port."""


def test_network_policy_admits_only_the_jobs_pods_except_metrics() -> None:
    policy = next(o for o in render.render(_job()) if o["kind"] == "NetworkPolicy")
    spec = policy["spec"]
    assert spec["podSelector"] == JOB_PODS
    assert spec["ingress"][0] == {"from": [{"podSelector": JOB_PODS}]}
    assert "from" not in spec["ingress"][1]
    assert {p["port"] for p in spec["ingress"][1]["ports"]} == {config.DEFAULT_METRICS_PORT, 8222}


def test_progress_role_is_limited_to_this_job() -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in render.render(_job())}
    role = objects[("Role", "demo-trainer")]
    assert all(rule["resourceNames"] == ["demo"] for rule in role["rules"])
    assert {"asyncrljobs/status"} == {
        r for rule in role["rules"] for r in rule["resources"] if "patch" in rule["verbs"]
    }
    binding = objects[("RoleBinding", "demo-trainer")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "demo-trainer", "namespace": "ns"}]
    trainer = objects[("StatefulSet", "demo-trainer")]
    assert trainer["spec"]["template"]["spec"]["serviceAccountName"] == "demo-trainer"


def test_scheduling_fields_reach_the_pods() -> None:
    job = _job(
        scheduling={"schedulerName": "volcano", "queueName": "rl", "priorityClassName": "high"},
        trainer={"nodeSelector": {"pool": "train"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]},
    )
    trainer = _by_kind(render.render(job))[("StatefulSet", "trainer")]["spec"]["template"]
    assert trainer["spec"]["schedulerName"] == "volcano" and trainer["spec"]["priorityClassName"] == "high"
    assert trainer["spec"]["nodeSelector"] == {"pool": "train"}
    assert trainer["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    rollout = _by_kind(render.render(job))[("StatefulSet", "rollout")]["spec"]["template"]
    assert rollout["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "rl"  # the trainer's: render.gang
    assert trainer["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "demo-trainer"  # Volcano's


def test_render_is_pure_and_deterministic() -> None:
    job = _job()
    before = job.model_dump()
    assert json.dumps(render.render(job)) == json.dumps(render.render(job))
    assert job.model_dump() == before


GATEWAY = {
    "data": {"format": "chat"},
    "agent": {
        "loop": "gateway",
        "gateway": {"port": 8200, "adminKeySecret": {"name": "gw-admin", "key": "k"}},
    },
}


def _named(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_gateway_rollout_gets_the_port_the_admin_key_from_its_secret_and_its_own_url() -> None:
    rollout = _named(render.render(_job(**GATEWAY)))[("StatefulSet", "demo-rollout")]
    container = _container(rollout)
    assert {"name": "gateway", "containerPort": 8200, "protocol": "TCP"} in container["ports"]
    env = [e["name"] for e in container["env"]]
    # $(POD_NAME) and $(POD_NAMESPACE) expand only from variables defined earlier in the list
    assert env.index("ASYNCRL_GATEWAY_URL") > max(env.index("POD_NAME"), env.index("POD_NAMESPACE"))
    assert _env(container)["ASYNCRL_GATEWAY_ADMIN_KEY"] == {"secretKeyRef": {"name": "gw-admin", "key": "k"}}
    assert (
        _env(container)["ASYNCRL_GATEWAY_URL"] == "http://$(POD_NAME).demo-rollout.$(POD_NAMESPACE).svc:8200"
    )
    assert container["readinessProbe"]["httpGet"]["port"] == "metrics"


def test_gateway_service_spreads_sessions_over_the_rollout_pods_and_the_headless_one_lists_the_port() -> None:
    objects = _named(render.render(_job(**GATEWAY)))
    service = objects[("Service", "demo-gateway")]
    assert service["spec"] == {
        "type": "ClusterIP",
        "selector": {names.JOB: "demo", names.ROLE: "rollout"},
        "ports": [{"name": "gateway", "port": 8200, "targetPort": 8200, "protocol": "TCP"}],
    }
    headless = objects[("Service", "demo-rollout")]["spec"]
    assert {"name": "gateway", "port": 8200, "targetPort": 8200, "protocol": "TCP"} in headless["ports"]


def test_gateway_policy_opens_only_the_gateway_port_of_rollout_pods_to_the_namespace() -> None:
    objects = _named(render.render(_job(**GATEWAY)))
    assert (
        objects[("NetworkPolicy", "demo-net")] == _named(render.render(_job()))[("NetworkPolicy", "demo-net")]
    )
    assert objects[("NetworkPolicy", "demo-gateway")]["spec"] == {
        "podSelector": {"matchLabels": {names.JOB: "demo", names.ROLE: "rollout"}},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 8200}]}],
    }


@pytest.mark.parametrize(
    "patch",
    [{}, {"data": {"format": "chat"}, "agent": {"tools": ["asyncrl_workloads.tasks.lookup:lookup"]}}],
    ids=["no-agent", "tool-loop"],
)
def test_only_a_gateway_job_renders_the_optional_children(patch: dict[str, Any]) -> None:
    optional = {(kind, name) for kind, name in render.optional("demo") if name == names.gateway("demo")}
    assert len(optional) == 2 and optional <= set(render.kinds_and_names(render.render(_job(**GATEWAY))))
    objects = render.render(_job(**patch))
    assert not optional & set(render.kinds_and_names(objects))
    assert "ASYNCRL_GATEWAY_URL" not in json.dumps(objects)
    rollout = _named(objects)[("Service", "demo-rollout")]
    assert [p["name"] for p in rollout["spec"]["ports"]] == ["metrics"]


@pytest.mark.parametrize("length", [1, 40, 120, 253])
def test_gateway_names_stay_within_bounds_and_distinct(length: int) -> None:
    body = {**jobs.make_job("x", "ns", **GATEWAY), "metadata": {"name": "g" * length, "uid": "u"}}
    objects = render.render(models.AsyncRLJob.model_validate(body))
    assert all(len(o["metadata"]["name"]) <= names.MAX_CHILD_NAME for o in objects)
    assert len(set(render.kinds_and_names(objects))) == len(objects)
