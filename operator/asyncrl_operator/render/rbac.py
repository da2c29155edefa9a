"""The per-job identity of trainer rank 0's progress reporter: a ServiceAccount, a Role that may only
get/patch this one job's status (``resourceNames``), and the RoleBinding.

Called by ``render.render``. The operator can grant this Role only because it holds the same verbs
itself (RBAC escalation check); the chart's operator ClusterRole must keep ``get, patch`` on
``asyncrljobs/status``.
"""

from __future__ import annotations

from typing import Any

from asyncrl_api import models

from asyncrl_operator.render import names


def render_service_account(job: models.AsyncRLJob) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": names.metadata(job, names.trainer(job.metadata.name), names.TRAINER),
    }


def render_role(job: models.AsyncRLJob) -> dict[str, Any]:
    only_this_job = [job.metadata.name]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": names.metadata(job, names.trainer(job.metadata.name), names.TRAINER),
        "rules": [
            {
                "apiGroups": [models.GROUP],
                "resources": [f"{models.PLURAL}/status"],
                "resourceNames": only_this_job,
                "verbs": ["get", "patch"],
            },
            {
                "apiGroups": [models.GROUP],
                "resources": [models.PLURAL],
                "resourceNames": only_this_job,
                "verbs": ["get"],
            },
        ],
    }


def render_role_binding(job: models.AsyncRLJob) -> dict[str, Any]:
    name = names.trainer(job.metadata.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": names.metadata(job, name, names.TRAINER),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": job.metadata.namespace}],
    }
