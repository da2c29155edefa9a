"""The optional managed NATS server: a one-pod StatefulSet with JetStream on (file storage) and its Service.

Called by ``render.render`` when ``spec.bus.nats.managed``. It keeps running while the job is
suspended, so queued trajectories survive; with ``bus.nats.storage`` the store is a
PersistentVolumeClaim (kept on suspend), otherwise an emptyDir.

Hardened like the workload pods (``render.security``): the official image runs ``nats-server`` as root
by default (no USER), but the server needs no privilege -- only its store writable, which fsGroup
gives it on the emptyDir and on block-storage claims -- so it runs as uid/gid 10001 with a read-only
root, no capabilities and seccomp RuntimeDefault. Probes as NATS's own Helm chart sets them: startup
``/healthz`` (JetStream recovered its store; up to 15 minutes for a large one), liveness
``?js-enabled-only`` (the server answers with JetStream on), readiness ``?js-server-only`` (the
JetStream server is current). Resources are fixed (the server is small next to the job): GOMEMLIMIT
from the memory limit, so Go's collector works within it.
"""

from __future__ import annotations

from typing import Any

from asyncrl_api import models

from asyncrl_operator.render import configmap, names, security

MONITOR_PORT = 8222
STORE_DIR = "/data/jetstream"
RESOURCES = {
    "requests": {"cpu": "100m", "memory": "256Mi", security.EPHEMERAL: "1Gi"},
    # The ephemeral limit bounds an emptyDir store: far above a full queue of trajectories (asyncrl's
    # default queue of 512 long trajectories is ~100 MB); set bus.nats.storage for a bigger store.
    "limits": {"cpu": "2", "memory": "4Gi", security.EPHEMERAL: "10Gi"},
}
REVIEW_IGNORES = {
    # The Service is a ClusterIP, not headless: clients dial one stable address across the pod's
    # restarts (a new pod IP), and one replica needs no per-pod DNS.
    "statefulset-has-servicename",
    # The user's image choice, pulled as the cluster's default policy says (render.pods.REVIEW_IGNORES).
    "container-image-pull-policy",
}


def render_nats_statefulset(job: models.AsyncRLJob) -> dict[str, Any]:
    name = names.nats(job.metadata.name)
    nats = job.spec.bus.nats
    container = {
        "name": names.NATS,
        "image": nats.image,
        "args": [
            "--jetstream",
            f"--store_dir={STORE_DIR}",
            f"--port={configmap.NATS_PORT}",
            f"--http_port={MONITOR_PORT}",
            f"--server_name={name}",
        ],
        "ports": [
            {"name": "client", "containerPort": configmap.NATS_PORT, "protocol": "TCP"},
            {"name": "monitor", "containerPort": MONITOR_PORT, "protocol": "TCP"},
        ],
        "env": [
            {
                "name": "GOMEMLIMIT",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1"}},
            }
        ],
        "resources": RESOURCES,
        "volumeMounts": [{"name": "store", "mountPath": "/data"}],
        "startupProbe": {
            "httpGet": {"path": "/healthz", "port": "monitor"},
            "periodSeconds": 10,
            "failureThreshold": 90,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz?js-enabled-only=true", "port": "monitor"},
            "periodSeconds": 30,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": "/healthz?js-server-only=true", "port": "monitor"},
            "periodSeconds": 5,
        },
        "securityContext": security.container_security_context(),
    }
    spec: dict[str, Any] = {
        "replicas": 1,
        "serviceName": name,
        "selector": {"matchLabels": names.selector(job.metadata.name, names.NATS)},
        "template": {
            "metadata": {"labels": names.labels(job.metadata.name, names.NATS)},
            "spec": {
                "containers": [container],
                "securityContext": security.pod_security_context(),
                "automountServiceAccountToken": False,
            },
        },
    }
    if nats.storage:
        spec["volumeClaimTemplates"] = [
            {
                "metadata": {"name": "store"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": nats.storage}},
                },
            }
        ]
    else:
        spec["template"]["spec"]["volumes"] = [{"name": "store", "emptyDir": {}}]
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            **names.metadata(job, name, names.NATS),
            "annotations": security.review_ignores(REVIEW_IGNORES),
        },
        "spec": spec,
    }


def render_nats_service(job: models.AsyncRLJob) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": names.metadata(job, names.nats(job.metadata.name), names.NATS),
        "spec": {
            "selector": names.selector(job.metadata.name, names.NATS),
            "ports": [
                {"name": "client", "port": configmap.NATS_PORT, "targetPort": configmap.NATS_PORT},
                {"name": "monitor", "port": MONITOR_PORT, "targetPort": MONITOR_PORT},
            ],
        },
    }
