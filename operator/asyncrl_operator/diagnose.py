"""What is wrong with a job, read from its pods' status and the Secrets it names. Pure: no client, no clock.

Called by ``asyncrl_operator.status`` (pods -> problems, restarts) and ``asyncrl_operator.reconcile``
(each Secret it fetched -> a problem or none; the Secret's body is dropped right after).

The channel from the workloads is the pod status, which the kubelet writes and the operator already
watches (``handlers.on_pod_event``): a process that fails at start-up or gives up on an endpoint writes
ONE line to its termination message and exits non-zero; endpoint errors read
``<Kind>: <judge|teacher> endpoint <baseURL>: <message>``. Rollout and trainer containers run with
``terminationMessagePolicy: FallbackToLogsOnError`` (``render.pods``), so a crash without a message still
leaves its last log lines, whose last non-empty line is the error. Why not Events or a status report:
pod status needs no new RBAC for pods, no client in the workloads, and survives the process (a report
written by a process that is exiting may never arrive); the kubelet also keeps the last termination
message in ``lastState`` while the container restarts, so the line stays visible through a crash loop.

A problem is (condition, reason, message, pod): endpoint lines go to EndpointsReady (reason = Kind),
everything else a pod reports (Unschedulable, image pulls, CreateContainerConfigError, crash loops) to
Degraded. A pod that is Ready, or a container that is running and ready, has no problem, whatever
``lastState`` still holds.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal

from asyncrl_operator.render import names, secrets

Body = dict[str, Any]
ConditionType = Literal["EndpointsReady", "Degraded"]

ENDPOINT_KINDS = (
    "Unauthorized",
    "Unreachable",
    "NotFound",
    "BadResponse",
    "RateLimited",
    "ServerError",
    "BadRequest",
)
"""The classes of endpoint errors (the workloads' endpoints room), each a reason of EndpointsReady."""
_ENDPOINT_LINE = re.compile(rf"^({'|'.join(ENDPOINT_KINDS)}): (judge|teacher) endpoint \S+: ")
WAITING_REASONS = (
    "CreateContainerConfigError",
    "CreateContainerError",
    "InvalidImageName",
    "ErrImagePull",
    "ImagePullBackOff",
    "RunContainerError",
)
"""Waiting reasons the kubelet gives with a message worth showing as they are."""
ORDER = ("Unschedulable", *WAITING_REASONS, "CrashLoopBackOff", "OOMKilled", "Error")
"""Most pressing first: a pod's problems in the order it meets them."""
MAX_MESSAGE = 1024


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong, for one condition."""

    condition: ConditionType
    reason: str
    """Short CamelCase reason: an endpoint Kind, a kubelet/scheduler reason, SecretNotFound, ..."""
    message: str
    """What the pod or the check said, naming the pod (or the Secret)."""
    pod: str = ""
    """The pod it comes from; empty for a Secret check."""


def last_line(text: str | None) -> str:
    """The last non-empty line (the error of a traceback or of a one-line termination message)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:MAX_MESSAGE] if lines else ""


def endpoint_kind(line: str) -> str | None:
    """The Kind of an endpoint error line, or None for any other line."""
    match = _ENDPOINT_LINE.match(line)
    return match.group(1) if match else None


def _problem(pod: str, reason: str, detail: str) -> Problem:
    kind = endpoint_kind(detail)
    if kind is not None:
        return Problem("EndpointsReady", kind, f"{detail} (pod {pod})", pod)
    return Problem("Degraded", reason, f"pod {pod}: {detail}"[:MAX_MESSAGE], pod)


def _crash_detail(terminated: Body) -> str:
    line = last_line(terminated.get("message"))
    if line:
        return line
    return f"exit code {terminated.get('exitCode')} ({terminated.get('reason') or 'Error'})"


def _failed(terminated: Body | None) -> bool:
    return terminated is not None and int(terminated.get("exitCode") or 0) != 0


def container_problem(pod: str, cs: Body) -> Problem | None:
    """A container's problem: waiting with a kubelet reason, terminated non-zero, or restarted after
    failing and not ready yet (the crash loop between two exits)."""
    state, last = cs.get("state") or {}, cs.get("lastState") or {}
    waiting, terminated = state.get("waiting"), state.get("terminated")
    if state.get("running") is not None and cs.get("ready"):
        return None
    if waiting is not None:
        reason = str(waiting.get("reason") or "")
        if reason in WAITING_REASONS:
            return _problem(pod, reason, str(waiting.get("message") or reason))
        if reason == "CrashLoopBackOff":
            if _failed(last.get("terminated")):
                return _problem(pod, reason, _crash_detail(last["terminated"]))
            return _problem(pod, reason, str(waiting.get("message") or reason))
        return None
    restarted = int(cs.get("restartCount") or 0) > 0
    if _failed(terminated):
        assert terminated is not None
        reason = "CrashLoopBackOff" if restarted else str(terminated.get("reason") or "Error")
        return _problem(pod, reason, _crash_detail(terminated))
    if state.get("running") is not None and _failed(last.get("terminated")):
        return _problem(pod, "CrashLoopBackOff", _crash_detail(last["terminated"]))
    return None


def _pod_ready(st: Body) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])


def pod_problems(pod: Body) -> list[Problem]:
    """The problems of one pod (none while it is Ready, terminating or finished)."""
    meta, st = pod.get("metadata") or {}, pod.get("status") or {}
    name = str(meta.get("name", ""))
    if meta.get("deletionTimestamp") or st.get("phase") in ("Succeeded", "Failed") or _pod_ready(st):
        return []
    for cond in st.get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            return [_problem(name, "Unschedulable", str(cond.get("message") or "no node fits the pod"))]
    found = (container_problem(name, cs) for cs in st.get("containerStatuses") or [])
    return [p for p in found if p is not None]


def failure_of(pod: Body) -> Problem:
    """Why a pod failed, for a trainer gang restart's record: its first problem, else what a Failed pod's
    status says (evicted, node lost)."""
    found = pod_problems(pod) or [
        p for cs in (pod.get("status") or {}).get("containerStatuses") or [] if (p := _exited(pod, cs))
    ]
    if found:
        return found[0]
    st, name = pod.get("status") or {}, str((pod.get("metadata") or {}).get("name", ""))
    return Problem(
        "Degraded", str(st.get("reason") or "PodFailed"), f"pod {name}: {st.get('message') or 'failed'}", name
    )


def _exited(pod: Body, cs: Body) -> Problem | None:
    name = str((pod.get("metadata") or {}).get("name", ""))
    for terminated in (
        (cs.get("state") or {}).get("terminated"),
        (cs.get("lastState") or {}).get("terminated"),
    ):
        if _failed(terminated):
            assert terminated is not None
            return _problem(name, "CrashLoopBackOff", _crash_detail(terminated))
    return None


def _rank(problem: Problem) -> tuple[int, str]:
    order = ORDER.index(problem.reason) if problem.reason in ORDER else len(ORDER)
    return order, problem.pod


def problems(pods: list[Body]) -> list[Problem]:
    """Every pod's problems, most pressing first (endpoint errors before the rest, then by ORDER)."""
    found = [p for pod in pods for p in pod_problems(pod)]
    return sorted(found, key=lambda p: (p.condition != "EndpointsReady", *_rank(p)))


def restarts(pods: list[Body]) -> int:
    """Container restarts of the job's current pods, trainer pods left out: a trainer container that
    restarts makes the operator restart the whole gang (``pod_events.handle_pod``), which is counted in
    status.restarts.trainer already (and the restarted pods are replaced, so their counts vanish)."""
    return sum(
        int(cs.get("restartCount") or 0)
        for pod in pods
        if ((pod.get("metadata") or {}).get("labels") or {}).get(names.ROLE) != names.TRAINER
        for cs in (pod.get("status") or {}).get("containerStatuses") or []
    )


def secret_problem(use: secrets.SecretUse, secret: Body | None, namespace: str) -> Problem | None:
    """A Secret key the spec names that is missing or empty -> SecretNotFound / SecretKeyMissing, on
    EndpointsReady for an endpoint's key and on Degraded for the gateway's admin key, the NATS creds and a
    tracker's credential (a missing one would hold the pods in CreateContainerConfigError). Reads only the
    key names of ``secret``, never a value beyond checking it is not empty."""
    degrades = use.usage in ("gateway", "nats", "tracking")
    condition: ConditionType = "Degraded" if degrades else "EndpointsReady"
    ref, where = use.ref, f'Secret "{use.ref.name}" in namespace {namespace}'
    if secret is None:
        why = f'{where} not found ({use.field}); create it with the key "{ref.key}"'
        return Problem(condition, "SecretNotFound", why)
    data = secret.get("data") or {}
    if data.get(ref.key):
        return None
    keys = ", ".join(sorted(data)[:8]) or "none"
    why = f'{where} has no non-empty key "{ref.key}" ({use.field}; its keys: {keys})'
    return Problem(condition, "SecretKeyMissing", why)
