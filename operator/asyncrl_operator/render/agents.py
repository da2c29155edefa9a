"""The agents a gateway job runs itself (spec.agent.workers): a Deployment ``<job>-agent`` and its budget.

Called by ``render.render``; ``render.optional`` names both so that removing ``workers`` prunes them.

- Replicas: ``workers.replicas`` once a rollout replica is ready (the job's status says so: agents that
  start before any gateway serves would only crash-loop on refused connections), 0 while the job is
  suspended or finished. Level-triggered: the reconcile that sees the first ready rollout scales them up.
- Env: the user's variables, then the gateway Service's URL (``ASYNCRL_GATEWAY_URL``) and the admin key
  (``ASYNCRL_GATEWAY_ADMIN_KEY``) as a secretKeyRef to spec.agent.gateway.adminKeySecret, so the key is in
  no spec, ConfigMap or rendered value. With ``sessionCommand`` the container runs the builtin driver,
  ``asyncrl agent --concurrency C --timeout T -- CMD`` (T = 90% of the gateway's sessionTimeoutSeconds,
  so a run is killed, and its session aborted, before the gateway would expire it).
- Hardening as the workload pods (``render.security``): non-root uid 10001, no privilege escalation, all
  capabilities dropped, RuntimeDefault seccomp, read-only root with /tmp and HOME as emptyDirs, no
  service-account token (an agent has no business with the API server).
- Network: agent pods carry the job's label (so their status and restarts count for the job) but the
  job's own NetworkPolicy excludes role ``agent`` (``render.network``): an agent runs the user's code
  and must not reach the trainer or NATS, only the gateway port, which ``render.gateway``'s policy opens
  to every pod of the namespace. Their own policy ``<job>-agent`` admits no ingress (an agent serves
  nothing); their egress is left to the namespace's policies (a coding agent's tools may need the web).
- Budget: ``maxUnavailable: 1``; an evicted agent only loses its open sessions, which expire uncounted
  in training.
"""

from __future__ import annotations

from typing import Any

from asyncrl_api import agents, config, models, task

from asyncrl_operator.render import names, pods, secrets, security

DRIVER = "asyncrl"
DRIVER_TIMEOUT_FRACTION = 0.9
"""Of the gateway's sessionTimeoutSeconds: when the driver kills a session's process."""
REVIEW_IGNORES = {"container-image-pull-policy"}
"""As the workload pods' (``render.pods.REVIEW_IGNORES``). No probes: an agent serves no port (no Service
selects it); a wedged one shows as its sessions expiring, a crash as a restart."""


def spec(job: models.AsyncRLJob) -> tuple[task.GatewaySpec, agents.AgentWorkersSpec] | None:
    agent = job.spec.agent
    if agent is None or agent.loop != "gateway" or agent.gateway is None or agent.workers is None:
        return None
    return agent.gateway, agent.workers


def desired_replicas(job: models.AsyncRLJob, workers: agents.AgentWorkersSpec) -> int:
    """0 while suspended or finished or before any rollout replica is ready, else workers.replicas."""
    if pods.stopped(job) or job.status.rollout.ready_replicas < 1:
        return 0
    return workers.replicas


def command(gateway: task.GatewaySpec, workers: agents.AgentWorkersSpec) -> dict[str, list[str]]:
    """The container's command and args (only those set)."""
    if workers.session_command:
        timeout = round(gateway.session_timeout_seconds * DRIVER_TIMEOUT_FRACTION, 3)
        argv = [DRIVER, "agent", "--concurrency", str(workers.concurrency()), "--timeout", f"{timeout:g}"]
        return {"command": [*argv, "--", *workers.session_command]}
    out: dict[str, list[str]] = {}
    if workers.command:
        out["command"] = list(workers.command)
    if workers.args:
        out["args"] = list(workers.args)
    return out


def env(job: models.AsyncRLJob, gateway: task.GatewaySpec, workers: agents.AgentWorkersSpec) -> list[Any]:
    url = names.gateway_service_url(job.metadata.name, job.metadata.namespace, gateway.port)
    return [
        {"name": "HOME", "value": security.HOME},  # the emptyDir: the image's HOME may not be writable
        *(e.to_api() for e in workers.env),
        {"name": config.GATEWAY_URL_ENV, "value": url},
        secrets.secret_env(config.GATEWAY_ADMIN_KEY_ENV, gateway.admin_key_secret),
    ]


def render_network_policy(job: models.AsyncRLJob) -> dict[str, Any]:
    """No ingress to the agent pods: they are clients of the gateway and serve nothing."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": names.metadata(job, names.agent(job.metadata.name), "network"),
        "spec": {
            "podSelector": {"matchLabels": names.selector(job.metadata.name, names.AGENT)},
            "policyTypes": ["Ingress"],
            "ingress": [],
        },
    }


def render_deployment(job: models.AsyncRLJob) -> dict[str, Any] | None:
    found = spec(job)
    if found is None:
        return None
    gateway, workers = found
    name = job.metadata.name
    scratch = [(security.TMP_VOLUME, security.TMP), (security.HOME_VOLUME, security.HOME)]
    container: dict[str, Any] = {
        "name": names.AGENT,
        "image": workers.image,
        **command(gateway, workers),
        "env": env(job, gateway, workers),
        "resources": pods.resources(0, workers.resources),
        "volumeMounts": [{"name": v, "mountPath": path} for v, path in scratch],
        "securityContext": security.container_security_context(),
        "terminationMessagePolicy": pods.TERMINATION_MESSAGE_POLICY,
    }
    if workers.env_from:
        container["envFrom"] = [e.to_api() for e in workers.env_from]
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [{"name": v, "emptyDir": {}} for v, _ in scratch],
        "securityContext": security.pod_security_context(),
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
        **pods.scheduling(job, workers.node_selector, workers.tolerations),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            **names.metadata(job, names.agent(name), names.AGENT),
            "annotations": security.review_ignores(REVIEW_IGNORES),
        },
        "spec": {
            "replicas": desired_replicas(job, workers),
            "selector": {"matchLabels": names.selector(name, names.AGENT)},
            "template": {
                "metadata": {"labels": names.labels(name, names.AGENT)},
                "spec": pod_spec,
            },
        },
    }
