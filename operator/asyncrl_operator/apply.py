"""The only module that talks to the API server: server-side apply, reads, deletes, status patches.

Used by ``asyncrl_operator.reconcile`` (and so by the handlers). Raw REST through the ``kubernetes``
package's ApiClient (kubeconfig or in-cluster auth, TLS, retries), so that every object -- built-in
or our CRD -- goes through the same few calls. Every write of a child is a server-side apply under
the field manager ``asyncrl-operator`` with ``force=true``: re-applying an unchanged object is a
no-op on the server, so a restarted operator re-applies everything and creates no duplicates.
"""

from __future__ import annotations

import json
from typing import Any

import kubernetes
from asyncrl_api import models

from asyncrl_operator import render

Body = dict[str, Any]

# kind key (render.kind_key: PodGroup.<group> for the two PodGroups) -> plural. Every kind render() emits,
# plus Pods, Secrets (only ever read one by one, to check a key the spec names exists:
# reconcile._secret_problems) and our own jobs.
PLURALS: dict[str, str] = {
    "ConfigMap": "configmaps",
    "Service": "services",
    "ServiceAccount": "serviceaccounts",
    "Pod": "pods",
    "Secret": "secrets",
    "Event": "events",
    "StatefulSet": "statefulsets",
    "Deployment": "deployments",
    "NetworkPolicy": "networkpolicies",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "PodGroup.scheduling.x-k8s.io": "podgroups",
    "PodGroup.scheduling.volcano.sh": "podgroups",
    models.KIND: models.PLURAL,
}
API_VERSIONS: dict[str, str] = {
    "ConfigMap": "v1",
    "Service": "v1",
    "ServiceAccount": "v1",
    "Pod": "v1",
    "Secret": "v1",
    "Event": "v1",
    "StatefulSet": "apps/v1",
    "Deployment": "apps/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
    "PodDisruptionBudget": "policy/v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "PodGroup.scheduling.x-k8s.io": "scheduling.x-k8s.io/v1alpha1",
    "PodGroup.scheduling.volcano.sh": "scheduling.volcano.sh/v1beta1",
    models.KIND: models.API_VERSION,
}

ApiError = kubernetes.client.ApiException


def error_message(exc: ApiError, limit: int = 300) -> str:
    """``: <the API server's message>`` of a failed call (an admission webhook's refusal, a validation
    error), cut to ``limit`` characters; empty when the body carries none."""
    try:
        message = str(json.loads(exc.body or "{}").get("message") or "")
    except (ValueError, AttributeError):
        return ""
    return f": {message[:limit]}" if message else ""


def path(kind: str, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    """The REST path of a namespaced object or collection."""
    api_version = API_VERSIONS[kind]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    out = f"{prefix}/namespaces/{namespace}/{PLURALS[kind]}"
    if name:
        out += f"/{name}"
    if subresource:
        out += f"/{subresource}"
    return out


class Client:
    """A thin synchronous client; one per operator process (thread-safe: urllib3 pools)."""

    def __init__(self, api_client: Any) -> None:
        self._api = api_client

    @classmethod
    def from_environment(cls) -> Client:
        """In-cluster config when running in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
        try:
            kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]
        return cls(kubernetes.client.ApiClient())

    def _call(
        self,
        method: str,
        url: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        request = self._api.param_serialize(
            method,
            url,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self._api.call_api(*request, _request_timeout=30)
        response.read()
        if not 200 <= response.status <= 299:
            raise ApiError(http_resp=response)
        data = response.data
        return json.loads(data) if data else None

    def apply(self, obj: Body) -> Body:
        """Server-side apply one object; returns the object as stored (with its status)."""
        meta = obj["metadata"]
        url = path(render.kind_key(obj), meta["namespace"], meta["name"])
        query = [("fieldManager", render.names.MANAGER), ("force", "true")]
        result: Body = self._call("PATCH", url, obj, query, "application/apply-patch+yaml")
        return result

    def get(self, kind: str, namespace: str, name: str) -> Body | None:
        """The object, or None when it does not exist."""
        try:
            result: Body = self._call("GET", path(kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    def select(self, kind: str, namespace: str, selector: dict[str, str]) -> list[Body]:
        """Objects of a kind in a namespace matching a label selector."""
        query = [("labelSelector", ",".join(f"{k}={v}" for k, v in selector.items()))]
        result = self._call("GET", path(kind, namespace), query=query)
        items: list[Body] = result.get("items", [])
        return items

    def list_jobs(self, namespace: str | None) -> list[Body]:
        """Every AsyncRLJob in one namespace, or cluster-wide."""
        url = path(models.KIND, namespace) if namespace else f"/apis/{models.API_VERSION}/{models.PLURAL}"
        result = self._call("GET", url)
        items: list[Body] = result.get("items", [])
        return items

    def list_nodes(self) -> list[Body]:
        """Every Node (spec.rollout.autoscale's GPU-fit warning; cluster-wide installs only)."""
        result = self._call("GET", "/api/v1/nodes")
        items: list[Body] = result.get("items", [])
        return items

    def delete(self, kind: str, namespace: str, name: str, uid: str | None = None) -> bool:
        """Delete (background propagation); with ``uid``, only that incarnation. False if already gone."""
        body: Body = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._call("DELETE", path(kind, namespace, name), body)
        except ApiError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    def patch_status(self, namespace: str, name: str, status: Body) -> Body:
        """JSON merge patch of a job's status subresource (only the keys given)."""
        url = path(models.KIND, namespace, name, "status")
        result: Body = self._call(
            "PATCH", url, {"status": status}, content_type="application/merge-patch+json"
        )
        return result

    def scale(self, namespace: str, name: str, replicas: int) -> Body:
        """Set a job's rollout replicas through its /scale subresource (what an HPA calls)."""
        url = path(models.KIND, namespace, name, "scale")
        body = {"spec": {"replicas": replicas}}
        result: Body = self._call("PATCH", url, body, content_type="application/merge-patch+json")
        return result

    def post_event(self, job: Body, kind: str, reason: str, message: str, when: str) -> None:
        """A core/v1 Event on the job (``kubectl describe arj`` lists it)."""
        meta = job["metadata"]
        event = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": models.API_VERSION, "kind": models.KIND, "name": meta["name"],
                "namespace": meta["namespace"], "uid": meta.get("uid"),
            },
            "type": kind, "reason": reason, "message": message[:1024],
            "firstTimestamp": when, "lastTimestamp": when, "count": 1,
            "source": {"component": "asyncrl-operator"}, "reportingComponent": "asyncrl-operator",
        }  # fmt: skip
        self._call("POST", path("Event", meta["namespace"]), event)

    def close(self) -> None:
        self._api.close()
