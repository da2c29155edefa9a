"""NATS names for one AsyncRLJob: the trajectory stream and subject, the weight-announce subject and the
validation subject.

Called by the rollout publisher, the trainer consumer (bus/jetstream.py), the weight-sync announce path
and the local runner. Kubernetes names are DNS labels/subdomains (lowercase alphanumerics, '-' and '.'),
while NATS subject tokens must not contain '.', '*', '>' or whitespace and stream names must not contain
'.', '*', '>', '/' or '\\'. Every character outside [A-Za-z0-9_-] therefore becomes '_'. A Kubernetes
namespace never contains '_' or '.', so `ARL_<ns>_<job>` cannot collide across namespaces.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

#: Name of the trainer's durable pull consumer on the trajectory stream.
TRAINER_CONSUMER = "trainer"


def sanitize(token: str) -> str:
    """Return `token` usable both as a NATS subject token and inside a stream name."""
    if not token:
        raise ValueError("a NATS name token must not be empty")
    return _UNSAFE.sub("_", token)


def stream_name(namespace: str, job: str) -> str:
    """JetStream stream holding the job's trajectories: `ARL_<ns>_<job>`."""
    return f"ARL_{sanitize(namespace)}_{sanitize(job)}"


def trajectory_subject(namespace: str, job: str) -> str:
    """Subject the rollout replicas publish trajectories to: `asyncrl.<ns>.<job>.traj`."""
    return f"asyncrl.{sanitize(namespace)}.{sanitize(job)}.traj"


def weights_subject(namespace: str, job: str) -> str:
    """Core-NATS subject on which trainer rank 0 announces each new policy version."""
    return f"asyncrl.{sanitize(namespace)}.{sanitize(job)}.weights"


def validation_subject(namespace: str, job: str) -> str:
    """Core-NATS subject on which rollout replica 0 sends validation runs (spec.data.validation) to
    trainer rank 0: `asyncrl.<ns>.<job>.validation`."""
    return f"asyncrl.{sanitize(namespace)}.{sanitize(job)}.validation"
