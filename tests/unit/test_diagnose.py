"""diagnose: pods as the kubelet and the scheduler report them -> problems; Secrets -> missing keys."""

from __future__ import annotations

from typing import Any

import pytest
from asyncrl_api import models
from asyncrl_operator import diagnose
from asyncrl_operator.diagnose import Problem
from asyncrl_operator.render import secrets
from asyncrl_testing import jobs

POD = "demo-rollout-0"
PVC = (
    '0/2 nodes are available: persistentvolumeclaim "rl-storage" not found. preemption: 0/2 nodes are'
    " available: 2 Preemption is not helpful for scheduling."
)
GPUS = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are available."
JUDGE_401 = (
    "Unauthorized: judge endpoint http://judge.models.svc:8000/v1: 401 Unauthorized; check Secret judge-key"
    " key apiKey for stray whitespace or newlines"
)
TRACEBACK = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: no such task\n\n  \n'


def pod(
    containers: list[dict[str, Any]] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    phase: str = "Running",
    name: str = POD,
    role: str = "rollout",
    **meta: Any,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"asyncrl.dev/job": "demo", "asyncrl.dev/role": role}, **meta},
        "status": {"phase": phase, "conditions": conditions or [], "containerStatuses": containers or []},
    }


def container(state: dict[str, Any], ready: bool = False, restarts: int = 0, **last: Any) -> dict[str, Any]:
    out = {"name": "rollout", "image": "img", "ready": ready, "restartCount": restarts, "state": state}
    if last:
        out["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error", **last}}
    return out


def waiting(reason: str, message: str | None = None) -> dict[str, Any]:
    return {"waiting": {"reason": reason, **({"message": message} if message else {})}}


def unscheduled(message: str) -> dict[str, Any]:
    return {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}


RUNNING = {"running": {"startedAt": "2026-11-29T10:00:00Z"}}
READY = {"type": "Ready", "status": "True"}
BACKOFF = "back-off 5m0s restarting failed container=rollout pod=demo-rollout-0"

CASES = [
    (
        "claim missing",
        pod(conditions=[unscheduled(PVC)], phase="Pending"),
        "Unschedulable",
        f"pod {POD}: {PVC}",
    ),
    (
        "not enough GPUs",
        pod(conditions=[unscheduled(GPUS)], phase="Pending"),
        "Unschedulable",
        f"pod {POD}: {GPUS}",
    ),
    (
        "image pull",
        pod([container(waiting("ErrImagePull", 'failed to pull image "asyncrl/rollout:nope": not found'))]),
        "ErrImagePull",
        f'pod {POD}: failed to pull image "asyncrl/rollout:nope": not found',
    ),
    (
        "image pull back-off",
        pod([container(waiting("ImagePullBackOff", 'Back-off pulling image "x"'))]),
        "ImagePullBackOff",
        f'pod {POD}: Back-off pulling image "x"',
    ),
    (
        "invalid image name",
        pod([container(waiting("InvalidImageName", 'couldn\'t parse image name "A:B"'))]),
        "InvalidImageName",
        f'pod {POD}: couldn\'t parse image name "A:B"',
    ),
    (
        "missing Secret",
        pod(
            [container(waiting("CreateContainerConfigError", 'secret "judge-key" not found'))],
            phase="Pending",
        ),
        "CreateContainerConfigError",
        f'pod {POD}: secret "judge-key" not found',
    ),
    (
        "crash loop: the last non-empty line of the last termination",
        pod([container(waiting("CrashLoopBackOff", BACKOFF), restarts=4, message=TRACEBACK)]),
        "CrashLoopBackOff",
        f"pod {POD}: ValueError: no such task",
    ),
    (
        "crash loop without a termination message",
        pod([container(waiting("CrashLoopBackOff", BACKOFF), restarts=4, exitCode=2)]),
        "CrashLoopBackOff",
        f"pod {POD}: exit code 2 (Error)",
    ),
    (
        "running again after a failure, not ready yet",
        pod([container(RUNNING, restarts=1, message="RuntimeError: NCCL timeout")]),
        "CrashLoopBackOff",
        f"pod {POD}: RuntimeError: NCCL timeout",
    ),
    (
        "first exit, killed for memory",
        pod([container({"terminated": {"exitCode": 137, "reason": "OOMKilled"}})]),
        "OOMKilled",
        f"pod {POD}: exit code 137 (OOMKilled)",
    ),
]


@pytest.mark.parametrize(("pod_body", "reason", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_pod_that_cannot_start_or_keeps_failing_is_degraded(
    pod_body: Any, reason: str, message: str
) -> None:
    assert diagnose.pod_problems(pod_body) == [Problem("Degraded", reason, message, POD)]


def test_an_endpoint_line_is_an_endpoints_problem_with_its_kind() -> None:
    crashing = pod([container(waiting("CrashLoopBackOff", BACKOFF), restarts=2, message=JUDGE_401 + "\n")])
    assert diagnose.pod_problems(crashing) == [
        Problem("EndpointsReady", "Unauthorized", f"{JUDGE_401} (pod {POD})", POD)
    ]


@pytest.mark.parametrize(
    "line",
    [
        "Unreachable: teacher endpoint http://t:8000/v1: connection refused (host t, port 8000)",
        "BadResponse: judge endpoint https://j/v1: no choices[0] in the answer: <html>",
        "RateLimited: judge endpoint http://j/v1: 429 after 5 retries",
    ],
)
def test_endpoint_kinds_are_parsed_from_the_prefix(line: str) -> None:
    assert diagnose.endpoint_kind(line) == line.split(":")[0]


@pytest.mark.parametrize(
    "line", ["Unauthorized", "ValueError: judge endpoint x: y", "Unauthorized: gateway endpoint http://x: y"]
)
def test_other_lines_are_not_endpoint_errors(line: str) -> None:
    assert diagnose.endpoint_kind(line) is None


HEALTHY = [
    (
        "ready container with an old termination message",
        pod([container(RUNNING, ready=True, restarts=3, message=JUDGE_401)]),
    ),
    ("pod Ready", pod([container(waiting("CrashLoopBackOff"), restarts=1, message="x")], conditions=[READY])),
    ("creating", pod([container(waiting("ContainerCreating"))], phase="Pending")),
    ("exited cleanly", pod([container({"terminated": {"exitCode": 0, "reason": "Completed"}})])),
    (
        "terminating",
        pod([container(waiting("CrashLoopBackOff"), message="x")], deletionTimestamp="2026-11-29T10:00:00Z"),
    ),
    ("scheduled, not started", pod(conditions=[{"type": "PodScheduled", "status": "True"}], phase="Pending")),
]


@pytest.mark.parametrize("pod_body", [c[1] for c in HEALTHY], ids=[c[0] for c in HEALTHY])
def test_a_ready_or_starting_pod_has_no_problem(pod_body: Any) -> None:
    assert diagnose.pod_problems(pod_body) == []


def test_problems_put_endpoint_errors_first_then_the_earliest_in_a_pods_life() -> None:
    pods = [
        pod([container(waiting("CrashLoopBackOff", BACKOFF), restarts=1, message="boom")], name="a"),
        pod(conditions=[unscheduled(GPUS)], phase="Pending", name="b"),
        pod([container(waiting("CrashLoopBackOff", BACKOFF), restarts=1, message=JUDGE_401)], name="c"),
    ]
    assert [(p.reason, p.pod) for p in diagnose.problems(pods)] == [
        ("Unauthorized", "c"),
        ("Unschedulable", "b"),
        ("CrashLoopBackOff", "a"),
    ]


def test_restarts_sum_container_restarts_except_the_trainers_gang_restarted_ones() -> None:
    pods = [
        pod([container(RUNNING, restarts=3), container(RUNNING, restarts=1)]),
        pod([container(RUNNING, restarts=2)], name="demo-nats-0", role="nats"),
        pod([container(RUNNING, restarts=5)], name="demo-trainer-0", role="trainer"),
    ]
    assert diagnose.restarts(pods) == 6


def test_a_failed_trainer_pods_cause_is_its_error_line_or_its_status() -> None:
    crashed = pod(
        [container(RUNNING, ready=True, restarts=1, message=TRACEBACK)], name="demo-trainer-1", role="trainer"
    )
    assert diagnose.failure_of(crashed) == Problem(
        "Degraded", "CrashLoopBackOff", "pod demo-trainer-1: ValueError: no such task", "demo-trainer-1"
    )
    evicted = pod(phase="Failed", name="demo-trainer-0", role="trainer")
    evicted["status"].update(reason="Evicted", message="The node was low on resource: memory.")
    assert diagnose.failure_of(evicted) == Problem(
        "Degraded", "Evicted", "pod demo-trainer-0: The node was low on resource: memory.", "demo-trainer-0"
    )


def _judge_job() -> models.AsyncRLJob:
    endpoint = {"baseURL": "http://judge:8000/v1", "model": "judge", "apiKeySecret": {"name": "judge-key"}}
    return models.AsyncRLJob.model_validate(
        jobs.make_job("demo", "ns", reward={"type": "judge", "endpoint": endpoint})
    )


SECRET, FIELD = 'Secret "judge-key" in namespace ns', "spec.reward.endpoint.apiKeySecret"
SECRET_CASES = [
    (
        "absent",
        None,
        "SecretNotFound",
        f'{SECRET} not found ({FIELD}); create it with the key "apiKey"',
    ),
    (
        "other keys",
        {"data": {"api-key": "eA==", "b": "eQ=="}},
        "SecretKeyMissing",
        f'{SECRET} has no non-empty key "apiKey" ({FIELD}; its keys: api-key, b)',
    ),
    (
        "empty value",
        {"data": {"apiKey": ""}},
        "SecretKeyMissing",
        f'{SECRET} has no non-empty key "apiKey" ({FIELD}; its keys: apiKey)',
    ),
]


@pytest.mark.parametrize(
    ("secret", "reason", "message"), [c[1:] for c in SECRET_CASES], ids=[c[0] for c in SECRET_CASES]
)
def test_a_missing_secret_key_is_an_endpoints_problem(secret: Any, reason: str, message: str) -> None:
    (use,) = secrets.refs(_judge_job())
    assert diagnose.secret_problem(use, secret, "ns") == Problem("EndpointsReady", reason, message)


def test_a_present_key_is_no_problem_and_a_gateway_key_degrades() -> None:
    (use,) = secrets.refs(_judge_job())
    assert diagnose.secret_problem(use, {"data": {"apiKey": "c2VjcmV0"}}, "ns") is None
    gateway = secrets.SecretUse(
        "gateway", models.SecretKeyRef(name="gw"), "spec.agent.gateway.adminKeySecret"
    )
    problem = diagnose.secret_problem(gateway, None, "ns")
    assert problem is not None and (problem.condition, problem.reason) == ("Degraded", "SecretNotFound")
