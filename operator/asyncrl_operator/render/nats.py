"""The optional managed NATS server: a one-pod StatefulSet with JetStream on (file storage) and its Service.

Called by ``render.render`` when ``spec.bus.nats.managed``. It keeps running while the job is
suspended, so queued trajectories survive; with ``bus.nats.storage`` the store is a
PersistentVolumeClaim (kept on suspend), otherwise an emptyDir.
"""

from __future__ import annotations

from typing import Any

from asyncrl_api import models

from asyncrl_operator.render import configmap, names

MONITOR_PORT = 8222
STORE_DIR = "/data/jetstream"


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
        "volumeMounts": [{"name": "store", "mountPath": "/data"}],
        "readinessProbe": {
            "httpGet": {"path": "/healthz?js-enabled-only=true", "port": "monitor"},
            "periodSeconds": 5,
        },
    }
    spec: dict[str, Any] = {
        "replicas": 1,
        "serviceName": name,
        "selector": {"matchLabels": names.selector(job.metadata.name, names.NATS)},
        "template": {
            "metadata": {"labels": names.labels(job.metadata.name, names.NATS)},
            "spec": {"containers": [container], "automountServiceAccountToken": False},
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
        "metadata": names.metadata(job, name, names.NATS),
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
