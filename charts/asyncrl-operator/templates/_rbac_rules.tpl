{{/*
The operator's permissions: exactly the calls operator/asyncrl_operator makes (apply.Client and the
kopf handlers), one rule per thing it touches, each with its call sites. Keep in step with
apply.py / reconcile.py / handlers.py; tests/cluster/test_helm_rbac.py proves the set sufficient (the
operator reconciles a job with this ServiceAccount's token) and minimal (`kubectl auth can-i`).
Deliberately absent: list/watch of secrets (only `get`, below), pods/exec|attach|portforward, deletecollection, escalate, bind,
impersonate, any cluster-scoped resource but `list nodes` in a cluster-wide install (the operator turns off
kopf's CRD/namespace discovery watches, settings.scanning.disabled; the Deployment restarts the operator
when the CRD changes).
*/}}
{{- define "asyncrl.rbacRules" -}}
# kopf lists+watches jobs and patches its progress/diff-base annotations; reconcile.reconcile GETs a
# job and DELETEs it when ttlSecondsAfterFinished ran out; the resync loop LISTs them.
- apiGroups: [asyncrl.dev]
  resources: [asyncrljobs]
  verbs: [get, list, watch, patch, delete]
# apply.Client.patch_status (merge patch of status). `get` is needed too, because the operator grants
# the trainer's per-job Role get+patch on it (render/rbac.py) and RBAC forbids granting what one lacks.
- apiGroups: [asyncrl.dev]
  resources: [asyncrljobs/status]
  verbs: [get, patch]
# spec.rollout.autoscale: autoscaler.on_job sets the rollout replicas through the job's /scale
# subresource (apply.Client.scale), as an HPA would, and posts an Event per change (rule below).
- apiGroups: [asyncrl.dev]
  resources: [asyncrljobs/scale]
  verbs: [patch]
# Children carry controller ownerReferences with blockOwnerDeletion: true; clusters running the
# OwnerReferencesPermissionEnforcement admission plugin require update on the owner's finalizers.
- apiGroups: [asyncrl.dev]
  resources: [asyncrljobs/finalizers]
  verbs: [update]
# apply.Client.apply: server-side apply (PATCH; creating on first apply needs create) of every kind
# render() emits. Children go away with their job through garbage collection; the one exception is
# below.
- apiGroups: [""]
  resources: [configmaps, serviceaccounts]
  verbs: [create, patch]
# Services and NetworkPolicies: applied as above; reconcile._prune GETs and DELETEs (uid precondition,
# only if this job owns it) the gateway's Service and NetworkPolicy when agent.loop stops being gateway.
- apiGroups: [""]
  resources: [services]
  verbs: [get, create, patch, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [create, patch]
# PodDisruptionBudgets of the roles (render/disruption.py): applied as above; reconcile._prune GETs and
# DELETEs (uid precondition, only if this job owns it) the agents' one when spec.agent.workers is removed.
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch, delete]
# PodGroups of a job's trainer gang (render/gang.py: scheduler-plugins' coscheduling and Volcano, by
# spec.scheduling.schedulerName): applied as above; reconcile._prune GETs and DELETEs (uid precondition,
# only if this job owns it) the one a job's spec no longer renders. Granting them where the CRDs are not
# installed is harmless.
- apiGroups: [scheduling.x-k8s.io, scheduling.volcano.sh]
  resources: [podgroups]
  verbs: [get, create, patch, delete]
# StatefulSets: applied as above, GET by reconcile.refresh_status, watched by handlers.on_statefulset_event.
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch]
# The agent workers' Deployment (render/agents.py, spec.agent.workers): applied as above, GET by
# reconcile.refresh_status, pruned like the gateway's Service when workers is removed.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, create, patch, delete]
# Pods: watched by handlers.on_pod_event, LISTed per gang and DELETEd (with a uid precondition) by
# reconcile.handle_pod for a trainer gang restart or a failed rollout replica. Never exec/attach.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, delete]
# Secrets: only `get`, by name, of the Secrets a job's spec names (reward/teacher endpoint apiKeySecret,
# agent.gateway.adminKeySecret): reconcile._secret_problems checks the key exists and is non-empty, so
# a missing one is a condition on the job (EndpointsReady/Degraded, SecretNotFound/SecretKeyMissing)
# before any pod waits on it. Values are never logged or stored. No list/watch: the check reruns on
# every reconcile and resync instead.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
# kopf posts Events (warnings and errors of handlers) on the job.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if not .Values.watch.namespaced }}
# spec.rollout.autoscale's warning when maxReplicas is more than the GPU nodes can ever hold:
# autoscaler._fit_warning LISTs nodes (apply.Client.list_nodes) at most every 5 minutes. Cluster-scoped,
# so a namespaced install (a Role) goes without it and without the warning.
- apiGroups: [""]
  resources: [nodes]
  verbs: [list]
{{- end }}
{{- end -}}
