"""PodDisruptionBudgets: how many of a role's pods a voluntary disruption (an eviction: ``kubectl
drain``, the cluster autoscaler, a node upgrade) may take at once.

Called by ``render.render``. A budget limits evictions only. The operator's own deletions go through
plain DELETEs, never evictions, so no budget stands in their way: suspend and finish scale the
StatefulSets to zero (the StatefulSet controller deletes the pods), a trainer gang restart deletes
every trainer pod (``reconcile.handle_pod``), and deleting the job garbage-collects everything.

- rollout: ``maxUnavailable: 1``. Replicas are independent (a replaced one re-joins at the next policy
  version), so a drain may take them one at a time while the others keep generating.
- trainer: ``maxUnavailable: 0``. The trainer is a gang: evicting any rank kills the step of every rank
  and the operator then restarts the whole gang from the last checkpoint, so no eviction is allowed
  while the job runs. A node drain therefore waits on a running trainer pod until the job is suspended
  (``spec.suspend: true``, which lets the drain finish once the pods are gone), finishes or is deleted;
  the cluster autoscaler leaves such a node alone. That is the intent: an admin decides when to give up
  training progress, not a rolling node upgrade.
- agent (spec.agent.workers): ``maxUnavailable: 1``; an evicted agent loses only its open sessions.
- all: ``unhealthyPodEvictionPolicy: AlwaysAllow``. A pod that is not Ready (crash-looping, a
  rollout whose engine never loads) protects nothing, so it never blocks a drain.
- the managed NATS server gets none: it is one pod, and a budget of 0 for it would block drains for the
  job's whole life (it also runs while the job is suspended); its restart only loses the queue when the
  store is an emptyDir, which the job survives (rollouts republish, the trainer resumes).
"""

from __future__ import annotations

from typing import Any

from asyncrl_api import models

from asyncrl_operator.render import names

MAX_UNAVAILABLE = {names.ROLLOUT: 1, names.TRAINER: 0, names.AGENT: 1}


def render_pod_disruption_budget(job: models.AsyncRLJob, role: str) -> dict[str, Any]:
    """``<job>-<role>``'s budget, over the role's pod selector."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": names.metadata(job, names.child(job.metadata.name, role), role),
        "spec": {
            "maxUnavailable": MAX_UNAVAILABLE[role],
            "selector": {"matchLabels": names.selector(job.metadata.name, role)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
