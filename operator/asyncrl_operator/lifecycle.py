"""Role-aware lifecycle decisions, as pure predicates over pods and jobs.

Called by ``asyncrl_operator.reconcile``: which pod failure restarts the trainer gang, which counts as
a rollout replacement, when a finished job's TTL has run out, and whether a job's name is too long.
"""

from __future__ import annotations

import datetime
from typing import Any

from asyncrl_api import models
from asyncrl_api import status as api_status

from asyncrl_operator import status
from asyncrl_operator.render import names

Body = dict[str, Any]


def role_of(pod: Body) -> str | None:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(names.ROLE)


def job_of(pod: Body) -> str | None:
    """The owning job's name (the asyncrl.dev/job label; jobs' names are short enough to be exact)."""
    return ((pod.get("metadata") or {}).get("labels") or {}).get(names.JOB)


def is_terminating(pod: Body) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def pod_failed(pod: Body) -> bool:
    """The pod failed (phase Failed: evicted, node lost, or marked failed) or a container restarted
    (its process died and the kubelet restarted it in place)."""
    st = pod.get("status") or {}
    if st.get("phase") == "Failed":
        return True
    return any(int(c.get("restartCount") or 0) > 0 for c in st.get("containerStatuses") or [])


def failure_key(pod: Body) -> str:
    """Identity of one failure (pod uid + container restarts), so one failure is handled once."""
    st = pod.get("status") or {}
    restarts = sum(int(c.get("restartCount") or 0) for c in st.get("containerStatuses") or [])
    return f"{pod['metadata'].get('uid')}/{st.get('phase')}/{restarts}"


def trainer_gang_needs_restart(pod: Body) -> bool:
    """A failed trainer pod takes the whole gang down: NCCL/gloo groups cannot lose a rank."""
    return role_of(pod) == names.TRAINER and pod_failed(pod)


def rollout_replaced(pod: Body) -> bool:
    """A failed rollout pod: the StatefulSet controller replaces it alone; we only count it."""
    return role_of(pod) == names.ROLLOUT and (pod.get("status") or {}).get("phase") == "Failed"


def ttl_expired(job: models.AsyncRLJob, now: datetime.datetime) -> bool:
    """Finished for at least spec.ttlSecondsAfterFinished."""
    ttl = job.spec.ttl_seconds_after_finished
    if ttl is None or job.status.phase not in api_status.FINISHED_PHASES:
        return False
    done = status.parse_time(job.status.completion_time)
    return done is not None and (now - done).total_seconds() >= ttl


def name_problem(name: str) -> str | None:
    """The handler-side twin of the CRD's name rule (for CRDs installed without it)."""
    if len(name) > models.MAX_NAME_LENGTH:
        return f"metadata.name: may be at most {models.MAX_NAME_LENGTH} characters (got {len(name)})"
    return None
