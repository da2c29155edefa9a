"""Pod hardening of the rollout and trainer pods: who they run as, what they may write and do.

Called by ``render.pods`` (volumes, mounts, resources) and by the role builders (security contexts).
The workload images (images/rollout, images/trainer) create the user ``asyncrl``, uid/gid 10001, with
HOME=/home/asyncrl; the pods run as that user and meet the restricted Pod Security Standard:

- non-root, uid/gid/fsGroup 10001 (kube-score asks for ids above 10000, so no id is shared with a
  node's own users), seccomp RuntimeDefault, no privilege escalation, every capability dropped.
  NVIDIA's device plugin hands GPUs to non-root containers (the container toolkit mounts the device
  nodes world-readable), and NCCL over TCP sockets and NVLink within a pod needs no capability. What
  this gives up: NCCL over InfiniBand/RoCE registers memory with ``IPC_LOCK`` (and pinned-memory
  limits); that capability is outside the baseline standard as well, so clusters with RDMA fabrics
  need a pod policy of their own and a patched pod spec -- the operator does not add it.
- a read-only root filesystem. What the processes write goes to emptyDirs: /tmp, HOME (vLLM, torch,
  triton, flashinfer and Hugging Face keep their caches under ~/.cache), /dev/shm (memory-backed, for
  NCCL and vLLM, ``render.pods``), and, when no volume of the job holds them, the trainer's
  checkpoint directory (checkpoints and the validation generations log) and a ``model.create`` tiny
  model's directory: the writable layer they used to land in is gone, and an emptyDir keeps them as
  long as the pod, as that layer did.
- ``fsGroupChangePolicy: OnRootMismatch``: the kubelet chowns a claim to the fsGroup only when its
  root is not already owned by it, instead of walking a multi-GB model volume on every pod start.
  Volumes that ignore fsGroup (NFS) must be writable by uid 10001 where the job writes (checkpoints).
- ephemeral-storage (``resources``): requested and limited, so the scheduler counts the caches and a
  runaway writer is evicted before it fills the node's disk.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from asyncrl_api import models

from asyncrl_operator.render import names

UID = 10001
"""uid and gid of the ``asyncrl`` user of the rollout and trainer images."""
HOME = "/home/asyncrl"
TMP = "/tmp"
TMP_VOLUME = "asyncrl-tmp"
HOME_VOLUME = "asyncrl-home"
CHECKPOINT_VOLUME = "asyncrl-checkpoints"
MODEL_VOLUME = "asyncrl-model"

EPHEMERAL = "ephemeral-storage"
EPHEMERAL_REQUEST = "2Gi"
"""What a pod's caches take in steady state: vLLM's torch.compile and CUDA-graph cache, triton and
flashinfer kernels, logs; the scheduler places the pod where that much disk is free."""
EPHEMERAL_LIMIT = "50Gi"
"""The eviction bound: room for the caches many times over, plus checkpoints of a small model when
checkpoint.path is on no volume (a large model's belong on a claim from spec.volumes). A role's own
``resources.requests/limits.ephemeral-storage`` replace both defaults."""


REVIEW_IGNORE = "kube-score/ignore"
"""Annotation naming the static review's checks that do not apply to an object, set by the builder that
decides it with the reason beside it (tests/unit/test_review.py runs kube-score on every example)."""


def review_ignores(checks: Iterable[str]) -> dict[str, str]:
    return {REVIEW_IGNORE: ",".join(sorted(checks))}


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "fsGroup": UID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """The container's own context (kube-score and some admission policies read only this level)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _covered(path: str, mounts: list[str]) -> bool:
    """Whether ``path`` lies on one of the mount points (or is one)."""
    path = path.rstrip("/") or "/"
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts)


def scratch_dirs(job: models.AsyncRLJob, role: str) -> list[tuple[str, str]]:
    """(volume name, mount path) of the emptyDirs a role's pods write to: /tmp, HOME, and the
    checkpoint (trainer) and ``model.create`` directories when no other mount holds them."""
    out = [(TMP_VOLUME, TMP), (HOME_VOLUME, HOME)]
    taken = [TMP, HOME] + [v.mount_path for v in job.spec.volumes]
    if role == names.TRAINER and not _covered(job.spec.trainer.checkpoint.path, taken):
        out.append((CHECKPOINT_VOLUME, job.spec.trainer.checkpoint.path))
        taken.append(job.spec.trainer.checkpoint.path)
    if job.spec.model.create is not None and not _covered(job.spec.model.path, taken):
        out.append((MODEL_VOLUME, job.spec.model.path))
    return out


def ephemeral_storage(requests: dict[str, str], limits: dict[str, str]) -> None:
    """Add the default ephemeral-storage request and limit unless the role sets either (the API server
    then defaults a missing request to the limit, and a request alone stays unbounded by choice)."""
    if EPHEMERAL in requests or EPHEMERAL in limits:
        return
    requests[EPHEMERAL] = EPHEMERAL_REQUEST
    limits[EPHEMERAL] = EPHEMERAL_LIMIT
