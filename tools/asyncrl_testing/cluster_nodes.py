"""The fake GPU nodes of the test cluster: their manifest and the check that they are Ready.

Called by `cluster` after kwok is up. kwok manages only nodes carrying MANAGED_ANNOTATION; its
node-initialize stage keeps the capacity/allocatable set here and adds the Ready condition.
"""

from __future__ import annotations

from typing import Any

MANAGED_ANNOTATION = "kwok.x-k8s.io/node=fake"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPUS_PER_NODE = 8


def gpu_node(name: str, gpus: int = GPUS_PER_NODE) -> dict[str, Any]:
    """A Node object as an 8-GPU H100 machine would register it (status is kept on create)."""
    resources = {
        "cpu": "96",
        "memory": "1Ti",
        "pods": "110",
        "ephemeral-storage": "1Ti",
        GPU_RESOURCE: str(gpus),
    }
    key, value = MANAGED_ANNOTATION.split("=", 1)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {key: value, "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                GPU_PRODUCT_LABEL: GPU_PRODUCT,
                "nvidia.com/gpu.count": str(gpus),
            },
        },
        "spec": {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def all_ready(node_list: dict[str, Any], names: list[str]) -> bool:
    """True when every named node is Ready, untainted by not-ready, and advertises its GPUs."""
    nodes = {item["metadata"]["name"]: item for item in node_list.get("items", [])}
    for name in names:
        node = nodes.get(name)
        if node is None:
            return False
        status = node.get("status", {})
        ready = any(
            cond.get("type") == "Ready" and cond.get("status") == "True"
            for cond in status.get("conditions", [])
        )
        tainted = any(
            taint.get("key", "").startswith("node.kubernetes.io/not-ready")
            for taint in node.get("spec", {}).get("taints", []) or []
        )
        if not ready or tainted or status.get("allocatable", {}).get(GPU_RESOURCE) != str(GPUS_PER_NODE):
            return False
    return True
