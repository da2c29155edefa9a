"""spec.agent.workers: admission, the Deployment `<job>-agent` and its budget, the job's network policy
around it, and the status it gives (AgentsReady, status.agents for the AGENTS column). Pure: the cluster
layer (tests/cluster/test_operator.py) applies the same objects to the real apiserver."""

from __future__ import annotations

import datetime
from typing import Any

import pydantic
import pytest
from asyncrl_api import models
from asyncrl_operator import admission, diagnose, render, status
from asyncrl_operator.render import names
from asyncrl_testing import jobs

NOW = datetime.datetime(2026, 12, 3, 10, 0, 0, tzinfo=datetime.UTC)
SECRET_KEY = {"secretKeyRef": {"name": "s", "key": "k"}}
GATEWAY = {
    "loop": "gateway",
    "gateway": {"adminKeySecret": {"name": "gw-admin", "key": "apiKey"}, "sessionTimeoutSeconds": 300},
}


def _body(workers: dict[str, Any] | None = None, **patch: Any) -> dict[str, Any]:
    agent = {**GATEWAY, **({"workers": workers} if workers is not None else {})}
    return jobs.make_job(
        "gw", "team-a", agent=agent, data={"prompts": "builtin:lookup", "format": "chat"}, **patch
    )


def _job(workers: dict[str, Any] | None = None, ready_rollouts: int = 1, **patch: Any) -> models.AsyncRLJob:
    body = _body(workers, **patch)
    body["metadata"]["uid"] = "u"
    body["status"] = {"rollout": {"readyReplicas": ready_rollouts}}
    return models.AsyncRLJob.model_validate(body)


def _objects(job: models.AsyncRLJob) -> dict[tuple[str, str], Any]:
    return {(o["kind"], o["metadata"]["name"]): o for o in render.render(job)}


def test_a_gateway_job_without_workers_renders_no_agents() -> None:
    objects = _objects(_job())
    assert ("Deployment", "gw-agent") not in objects and ("PodDisruptionBudget", "gw-agent") not in objects
    pruned = {("Deployment", "gw-agent"), ("PodDisruptionBudget", "gw-agent"), ("NetworkPolicy", "gw-agent")}
    assert pruned <= set(render.optional("gw"))


def test_workers_run_the_users_agent_with_the_gateway_url_and_the_admin_key_from_its_secret() -> None:
    workers = {
        "image": "registry.example/agent:1",
        "command": ["python3", "agent.py"],
        "args": ["--n", "8"],
        "replicas": 3,
        "env": [
            {"name": "MODE", "value": "fast"},
            {"name": "TOOL_KEY", "valueFrom": {"secretKeyRef": {"name": "tools", "key": "k"}}},
        ],
        "envFrom": [{"configMapRef": {"name": "agent-settings"}}],
        "resources": {"requests": {"cpu": 1, "memory": "2Gi"}},
        "nodeSelector": {"pool": "cpu"},
    }
    objects = _objects(_job(workers))
    deployment = objects[("Deployment", "gw-agent")]
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["selector"]["matchLabels"] == {names.JOB: "gw", names.ROLE: "agent"}
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/agent:1"
    assert (container["command"], container["args"]) == (["python3", "agent.py"], ["--n", "8"])
    env = {e["name"]: e for e in container["env"]}
    assert env["ASYNCRL_GATEWAY_URL"]["value"] == "http://gw-gateway.team-a.svc:8100"
    assert env["ASYNCRL_GATEWAY_ADMIN_KEY"] == {
        "name": "ASYNCRL_GATEWAY_ADMIN_KEY",
        "valueFrom": {"secretKeyRef": {"name": "gw-admin", "key": "apiKey"}},
    }
    assert env["MODE"]["value"] == "fast" and "valueFrom" in env["TOOL_KEY"]
    assert container["envFrom"] == [{"configMapRef": {"name": "agent-settings", "optional": False}}]
    assert container["resources"]["requests"]["cpu"] == "1" and "nvidia.com/gpu" not in container["resources"]
    assert pod["nodeSelector"] == {"pool": "cpu"} and pod["automountServiceAccountToken"] is False
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] and not context["allowPrivilegeEscalation"]
    assert context["capabilities"] == {"drop": ["ALL"]} and pod["securityContext"]["runAsNonRoot"]
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp", "/home/asyncrl"}
    budget = objects[("PodDisruptionBudget", "gw-agent")]["spec"]
    assert budget["maxUnavailable"] == 1 and budget["selector"] == deployment["spec"]["selector"]
    # the key's value is nowhere: only its Secret's name
    assert "gw-admin" in str(deployment) and "apiKey" in str(deployment)


def test_a_session_command_runs_under_the_builtin_driver_killed_before_the_gateway_expires_it() -> None:
    workers = {"sessionCommand": ["claude", "-p", "{prompt}"], "sessionConcurrency": 4}
    container = _objects(_job(workers))[("Deployment", "gw-agent")]["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert container["command"] == [
        "asyncrl", "agent", "--concurrency", "4", "--timeout", "270", "--", "claude", "-p", "{prompt}",
    ]  # fmt: skip
    assert "args" not in container and container["image"] == "ghcr.io/asyncrl/rollout:0.1.0"


@pytest.mark.parametrize(
    ("job", "replicas"),
    [
        (lambda: _job({"replicas": 2}, ready_rollouts=0), 0),  # no gateway serves yet
        (lambda: _job({"replicas": 2}, ready_rollouts=1), 2),
        (lambda: _job({"replicas": 2}, suspend=True), 0),
    ],
)
def test_agents_start_once_a_rollout_serves_and_stop_with_the_job(job: Any, replicas: int) -> None:
    assert _objects(job())[("Deployment", "gw-agent")]["spec"]["replicas"] == replicas


def test_agents_stop_when_the_job_finished() -> None:
    body = _body({"replicas": 2})
    body["status"] = {"phase": "Succeeded", "rollout": {"readyReplicas": 1}}
    deployment = _objects(models.AsyncRLJob.model_validate(body))[("Deployment", "gw-agent")]
    assert deployment["spec"]["replicas"] == 0


def test_the_jobs_policy_leaves_agents_out_and_the_gateway_port_is_open_to_them() -> None:
    objects = _objects(_job({"replicas": 1}))
    own = objects[("NetworkPolicy", "gw-net")]["spec"]
    excluded = {"key": names.ROLE, "operator": "NotIn", "values": ["agent"]}
    assert own["podSelector"]["matchExpressions"] == [excluded]  # an agent never reaches trainer or NATS
    assert own["ingress"][0]["from"][0]["podSelector"]["matchExpressions"] == [excluded]
    gateway = objects[("NetworkPolicy", "gw-gateway")]["spec"]
    assert gateway["ingress"][0]["from"] == [{"podSelector": {}}]  # every pod of the namespace
    own = objects[("NetworkPolicy", "gw-agent")]["spec"]
    assert own["podSelector"]["matchLabels"] == {names.JOB: "gw", names.ROLE: "agent"}
    assert (own["policyTypes"], own["ingress"]) == (["Ingress"], [])  # agents serve nothing


@pytest.mark.parametrize(
    ("agent", "field", "message"),
    [
        ({"loop": "tool", "tools": ["m:f"], "workers": {}}, "spec.agent.workers", "agent.loop gateway"),
        ({**GATEWAY, "workers": {"command": ["a"], "sessionCommand": ["b"]}}, "sessionCommand", "leave"),
        ({**GATEWAY, "workers": {"command": ["a"], "sessionConcurrency": 2}}, "sessionConcurrency", "only"),
        (
            {**GATEWAY, "workers": {"env": [{"name": "ASYNCRL_GATEWAY_ADMIN_KEY", "value": "x"}]}},
            "env.0",
            "set by the operator",
        ),
        (
            {**GATEWAY, "workers": {"env": [{"name": "A", "value": "x", "valueFrom": SECRET_KEY}]}},
            "env.0",
            "not both",
        ),
        ({**GATEWAY, "workers": {"envFrom": [{"prefix": "X_"}]}}, "envFrom.0", "exactly one"),
        ({**GATEWAY, "workers": {"replicas": -1}}, "replicas", "greater than or equal to 0"),
    ],
)  # fmt: skip
def test_admission_refuses_workers_it_cannot_honour(agent: dict[str, Any], field: str, message: str) -> None:
    body = jobs.make_job("gw", "ns", agent=agent, data={"prompts": "builtin:lookup", "format": "chat"})
    job, why = admission.parse(body)
    assert job is None and why is not None and field in why and message in why, why
    with pytest.raises(pydantic.ValidationError):
        models.AsyncRLJob.model_validate(body)


def _status(
    job: models.AsyncRLJob, deployment: dict[str, Any] | None, pods: tuple[Any, ...] = (), rollouts: int = 1
) -> Any:
    ready = {"status": {"replicas": 1, "readyReplicas": 1}}
    rollout = {"status": {"replicas": 1, "readyReplicas": rollouts}}
    obs = status.Observed(now=NOW, trainer=ready, rollout=rollout, nats=ready, agents=deployment, pods=pods)
    return status.compute_status(job, obs)


def _agents_ready(st: Any) -> Any:
    return st.condition("AgentsReady")


def test_agents_ready_counts_the_deployments_pods_and_the_column_shows_ready_over_wanted() -> None:
    job = _job({"replicas": 2})
    st = _status(job, {"spec": {"replicas": 2}, "status": {"readyReplicas": 1}})
    assert (st.agents.ready, st.agents.replicas) == ("1/2", 2)
    assert (_agents_ready(st).status, _agents_ready(st).reason) == ("False", "NotReady")
    st = _status(job, {"spec": {"replicas": 2}, "status": {"readyReplicas": 2}})
    assert (_agents_ready(st).status, _agents_ready(st).reason) == ("True", "AllReady")
    assert st.agents.selector == "asyncrl.dev/job=gw,asyncrl.dev/role=agent"
    assert _status(_job(), None).agents is None and _agents_ready(_status(_job(), None)) is None


def test_agents_wait_for_the_gateway_and_are_scaled_to_zero_when_suspended() -> None:
    st = _status(_job({"replicas": 2}, ready_rollouts=0), {"spec": {"replicas": 0}, "status": {}}, rollouts=0)
    assert (_agents_ready(st).status, _agents_ready(st).reason) == ("False", "WaitingForGateway")
    assert st.agents.replicas == 0 and st.agents.ready == "0/2"
    st = _status(_job({"replicas": 2}, suspend=True), {"spec": {"replicas": 0}, "status": {}})
    assert (_agents_ready(st).status, _agents_ready(st).reason, st.agents.ready) == (
        "True",
        "ScaledToZero",
        "0/0",
    )


def test_a_crash_looping_agent_pod_shows_its_reason_and_last_line() -> None:
    pod = {
        "metadata": {"name": "gw-agent-5d8f9-abcde", "labels": {names.JOB: "gw", names.ROLE: "agent"}},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "agent",
                    "ready": False,
                    "restartCount": 4,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                    "lastState": {
                        "terminated": {
                            "exitCode": 1,
                            "reason": "Error",
                            "message": "Traceback\nKeyError: 'task'\n",
                        }
                    },
                }
            ],
        },
    }
    assert diagnose.problems([pod])  # the same problem Degraded shows
    st = _status(_job({"replicas": 1}), {"spec": {"replicas": 1}, "status": {}}, pods=(pod,))
    cond = _agents_ready(st)
    assert cond.status == "False" and cond.reason == "CrashLoopBackOff" and "KeyError: 'task'" in cond.message
