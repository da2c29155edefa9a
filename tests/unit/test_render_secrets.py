"""The Secrets a job names reach its containers as secretKeyRef env vars only, and the operator's check
list names each of them; rollout and trainer containers keep their last error in the termination message."""

from __future__ import annotations

from typing import Any

from asyncrl_api import config, models
from asyncrl_operator import diagnose, render
from asyncrl_operator.render import secrets
from asyncrl_testing import jobs

JUDGE = {
    "baseURL": "http://judge:8000/v1",
    "model": "judge",
    "apiKeySecret": {"name": "judge-key", "key": "k"},
}
TEACHER = {"endpoint": {"baseURL": "http://teacher:8000/v1", "model": "t", "apiKeySecret": {"name": "t-key"}}}


def _containers(**patch: Any) -> dict[str, Any]:
    job = models.AsyncRLJob.model_validate(jobs.make_job("demo", "ns", **patch))
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["containers"][0]
        for o in render.render(job)
        if o["kind"] == "StatefulSet" and o["metadata"]["name"] != "demo-nats"
    }


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("valueFrom", e.get("value")) for e in container["env"]}


def test_the_judge_key_goes_to_the_rollout_and_the_teacher_key_to_the_trainer() -> None:
    c = _containers(reward={"type": "judge", "endpoint": JUDGE}, teacher=TEACHER)
    rollout, trainer = _env(c["demo-rollout"]), _env(c["demo-trainer"])
    assert rollout[config.JUDGE_API_KEY_ENV] == {"secretKeyRef": {"name": "judge-key", "key": "k"}}
    assert trainer[config.TEACHER_API_KEY_ENV] == {"secretKeyRef": {"name": "t-key", "key": "apiKey"}}
    assert config.TEACHER_API_KEY_ENV not in rollout and config.JUDGE_API_KEY_ENV not in trainer


def test_endpoints_without_a_key_and_function_rewards_get_no_key_env() -> None:
    keyless = {k: v for k, v in JUDGE.items() if k != "apiKeySecret"}
    for patch in ({}, {"reward": {"type": "judge", "endpoint": keyless}}):
        env = {n for c in _containers(**patch).values() for n in _env(c)}
        assert not env & {config.JUDGE_API_KEY_ENV, config.TEACHER_API_KEY_ENV}


def test_rollout_and_trainer_fall_back_to_their_logs_for_the_termination_message() -> None:
    for container in _containers().values():
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_refs_list_every_secret_the_job_names() -> None:
    gateway = {"loop": "gateway", "gateway": {"adminKeySecret": {"name": "gw"}}}
    body = jobs.make_job(
        "demo",
        "ns",
        reward={"type": "judge", "endpoint": JUDGE},
        teacher=TEACHER,
        agent=gateway,
        data={"format": "chat"},
    )
    refs = secrets.refs(models.AsyncRLJob.model_validate(body))
    assert [(r.usage, r.ref.name, r.ref.key, r.field) for r in refs] == [
        ("judge", "judge-key", "k", "spec.reward.endpoint.apiKeySecret"),
        ("teacher", "t-key", "apiKey", "spec.teacher.endpoint.apiKeySecret"),
        ("gateway", "gw", "apiKey", "spec.agent.gateway.adminKeySecret"),
    ]
    assert secrets.refs(models.AsyncRLJob.model_validate(jobs.make_job("demo", "ns"))) == []


EXTERNAL_NATS = {
    "nats": {"managed": False, "url": "nats://nats.infra:4222", "credentialsSecret": "nats-creds"}
}


def _pod_specs(**patch: Any) -> dict[str, dict[str, Any]]:
    job = models.AsyncRLJob.model_validate(jobs.make_job("demo", "ns", **patch))
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]
        for o in render.render(job)
        if o["kind"] == "StatefulSet"
    }


def test_nats_credentials_are_a_read_only_secret_file_on_both_roles_and_its_path_in_env() -> None:
    specs = _pod_specs(bus=EXTERNAL_NATS)
    assert set(specs) == {"demo-rollout", "demo-trainer"}  # no managed NATS StatefulSet
    for spec in specs.values():
        volume = {
            "name": secrets.NATS_CREDS_VOLUME,
            "secret": {
                "secretName": "nats-creds",
                "items": [{"key": "creds", "path": "creds"}],
                "defaultMode": 0o444,
            },
        }
        assert spec["volumes"][-1] == volume
        (container,) = spec["containers"]
        mount = {"name": secrets.NATS_CREDS_VOLUME, "mountPath": "/etc/asyncrl-nats", "readOnly": True}
        assert container["volumeMounts"][-1] == mount
        assert _env(container)[config.NATS_CREDS_ENV] == "/etc/asyncrl-nats/creds" == config.NATS_CREDS_PATH


def test_no_nats_credentials_mount_without_a_secret() -> None:
    external = {"nats": {"managed": False, "url": "nats://nats.infra:4222"}}
    for patch in ({}, {"bus": external}):
        for spec in _pod_specs(**patch).values():
            assert secrets.NATS_CREDS_VOLUME not in {v["name"] for v in spec["volumes"]}
            assert all(config.NATS_CREDS_ENV not in _env(c) for c in spec["containers"] if "env" in c)


def test_nats_credentials_are_checked_like_the_endpoint_keys_and_a_missing_one_degrades() -> None:
    refs = secrets.refs(models.AsyncRLJob.model_validate(jobs.make_job("demo", "ns", bus=EXTERNAL_NATS)))
    assert [(r.usage, r.ref.name, r.ref.key, r.field) for r in refs] == [
        ("nats", "nats-creds", "creds", "spec.bus.nats.credentialsSecret")
    ]
    missing = diagnose.secret_problem(refs[0], None, "ns")
    assert missing == diagnose.Problem(
        "Degraded",
        "SecretNotFound",
        'Secret "nats-creds" in namespace ns not found (spec.bus.nats.credentialsSecret); '
        'create it with the key "creds"',
    )
    no_key = diagnose.secret_problem(refs[0], {"data": {"user.creds": "eA=="}}, "ns")
    assert no_key is not None and (no_key.condition, no_key.reason) == ("Degraded", "SecretKeyMissing")
    assert diagnose.secret_problem(refs[0], {"data": {"creds": "eA=="}}, "ns") is None
