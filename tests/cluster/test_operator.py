"""The operator on the real control plane: apply -> children -> kwok pods Running -> status Running
(in a namespace enforcing the restricted Pod Security Standard), printer columns, scale, gang restart,
single rollout replacement, suspend/resume, maxSteps, TTL, Stalled, garbage collection, and a
crash-restarted operator that creates no duplicates."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from asyncrl_testing import cluster_wait, gang_bins, jobs, operator_proc
from asyncrl_testing.operator_proc import bind_storage, condition, get_json, job_status, pods
from asyncrl_workloads import tinymodel

pytestmark = pytest.mark.cluster

CHILD_KINDS = (
    "configmap,service,serviceaccount,role,rolebinding,networkpolicy,poddisruptionbudget,statefulset"
)
RESTRICTED = "pod-security.kubernetes.io/enforce=restricted"
BASE_JOB_CHILDREN = 14
"""jobs.make_job's children of CHILD_KINDS: ConfigMap, 3 Services (rollout, trainer, NATS), ServiceAccount,
Role, RoleBinding, 2 NetworkPolicies (the job's, the trainer's egress), 2 PodDisruptionBudgets and 3
StatefulSets (rollout, trainer, NATS)."""


REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def operator(
    cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_proc.OperatorProcess]:
    with operator_proc.running(cluster, tmp_path_factory.mktemp("operator"), resync_seconds=3.0) as op:
        yield op


def apply(cluster: Any, body: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))


def children(cluster: Any, namespace: str, job: str) -> list[tuple[str, str]]:
    items = get_json(cluster, CHILD_KINDS, "-n", namespace, "-l", f"asyncrl.dev/job={job}").get("items") or []
    return sorted((o["kind"], o["metadata"]["name"]) for o in items)


def running_pods(
    cluster: Any, namespace: str, job: str, role: str, count: int, timeout: float = 90
) -> list[Any]:
    return cluster_wait.wait_until(
        lambda: [
            p for p in pods(cluster, namespace, job, role) if not p["metadata"].get("deletionTimestamp")
        ],
        lambda ps: len(ps) == count and all(p["status"].get("phase") == "Running" for p in ps),
        f"{count} {role} pods of {job} Running",
        timeout=timeout,
    )


def wait_phase(
    cluster: Any, namespace: str, job: str, phase: str, timeout: float = 90, true: tuple[str, ...] = ()
) -> Any:
    """The job's status once in `phase` with the conditions `true` True (Running comes with one ready
    rollout: RolloutReady may turn True a moment later)."""
    try:
        return cluster_wait.wait_until(
            lambda: job_status(cluster, namespace, job),
            lambda st: (
                st.get("phase") == phase and all(condition(st, kind).get("status") == "True" for kind in true)
            ),
            f"{job} phase {phase}" + (f" with {', '.join(true)}" if true else ""),
            timeout=timeout,
        )
    except cluster_wait.WaitTimeout as exc:
        seen = cluster.kubectl("get", "arj,sts,pods", "-n", namespace, "-o", "wide", check=False).stdout
        seen += cluster.kubectl("get", "nodes", check=False).stdout
        seen += cluster.kubectl(
            "get", "events", "-n", namespace, "--field-selector=type=Warning", check=False
        ).stdout
        raise cluster_wait.WaitTimeout(f"{exc}\n{seen}") from None


def uids(items: list[Any]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in items}


def start_job(cluster: Any, namespace: str, name: str = "demo", **patch: Any) -> Any:
    apply(cluster, jobs.make_job(name, namespace, **patch))
    return wait_phase(cluster, namespace, name, "Running")


def fail_pod(cluster: Any, namespace: str, pod: str) -> None:
    """Mark a pod Failed through its status subresource, as a kubelet does when the pod dies."""
    patch = {"status": {"phase": "Failed", "reason": "Error", "message": "simulated failure"}}
    cluster.kubectl(
        "patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(patch)
    )


def report_progress(cluster: Any, namespace: str, job: str, **progress: Any) -> None:
    cluster.kubectl(
        "patch",
        "asyncrljob",
        job,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"progress": progress}}),
    )


def test_every_example_passes_the_real_apiservers_admission(cluster, namespace, operator):
    """Every file in examples/ through the CRD's schema and CEL rules on the real apiserver (a server-side
    dry run: nothing is created). The unit layer checks the same files against the pydantic mirror."""
    files = sorted(jobs.EXAMPLES.glob("*.yaml"))
    out = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, *(a for f in files for a in ("-f", str(f)))
    ).stdout
    assert out.count("(server dry run)") == len(files), out
    assert cluster.kubectl("get", "asyncrljobs", "-n", namespace, "-o", "name").stdout.strip() == ""


MATH_RECORDS = [
    {"prompt": "What is 2 + 3? Put the final answer in \\boxed{}.", "answer": "5"},
    {
        "prompt": "Natalia sold 48 clips in April and half as many in May. How many in all?",
        "answer": "#### 72",
    },
]


def test_the_examples_rendered_rollout_passes_its_own_start_up_checks(cluster, namespace, operator, tmp_path):
    """examples/job.yaml as the real apiserver stores it and the operator renders it: the rollout
    container's command and environment, run here with the job.json the ConfigMap holds, pointed at a tiny
    chat model and a few math records in place of the user's volume (data and model paths aside, every
    other field as rendered: the reward asyncrl_workloads.rewards.math:boxed_answer, the chat format, the
    validation set). Its start-up checks (config, reward import, records, chat template) pass: it stops
    only at NATS, which is unreachable here (exit 1 with that line, not exit 2 for the job)."""
    bind_storage(cluster, namespace, "rl-storage")
    cluster.kubectl("apply", "-n", namespace, "-f", str(jobs.EXAMPLES / "job.yaml"))
    rollout = cluster_wait.wait_until(
        lambda: cluster.kubectl(
            "get", "statefulset", "math-rollout", "-n", namespace, "-o", "json", check=False
        ),
        lambda done: done.returncode == 0,
        "the rendered rollout StatefulSet",
        timeout=30,
    )
    container = json.loads(rollout.stdout)["spec"]["template"]["spec"]["containers"][0]
    body = json.loads(get_json(cluster, "configmap", "math-config", "-n", namespace)["data"]["job.json"])
    model = tinymodel.create_tiny_model(tmp_path / "model", seed=0, chat=True)
    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in MATH_RECORDS))
    body["spec"]["model"]["path"] = str(model)
    body["spec"]["data"].update(prompts=str(data), validation=str(data))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    body["endpoints"]["natsUrl"] = f"nats://127.0.0.1:{closed}"
    config = tmp_path / "job.json"
    config.write_text(json.dumps(body))
    command = [str(pathlib.Path(sys.executable).parent / container["command"][0]), *container["command"][1:]]
    command[command.index("--config") + 1] = str(config)
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env = {**os.environ, **env, "ASYNCRL_REPLICA": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1, done.stderr[-3000:]
    assert last.startswith("asyncrl-rollout: endpoints.natsUrl: cannot reach NATS"), done.stderr[-3000:]


def test_example_job_runs_with_every_child_and_a_meaningful_status(cluster, namespace, operator):
    # Every pod of the job (rollout, trainer, managed NATS) must meet the restricted Pod Security
    # Standard: the StatefulSet controller's creates go through the PodSecurity admission plugin, and
    # a refused pod would leave a FailedCreate event and never run.
    cluster.kubectl("label", "namespace", namespace, RESTRICTED)
    assert 'violates PodSecurity "restricted:latest"' in cluster.privileged_pod_refusal(namespace)
    bind_storage(cluster, namespace, "rl-storage")
    cluster.kubectl("apply", "-n", namespace, "-f", str(jobs.EXAMPLES / "job.yaml"))
    expected = sorted(
        [
            ("ConfigMap", "math-config"),
            ("NetworkPolicy", "math-net"),
            ("NetworkPolicy", "math-trainer-egress"),
            ("PodDisruptionBudget", "math-rollout"),
            ("PodDisruptionBudget", "math-trainer"),
            ("Role", "math-trainer"),
            ("RoleBinding", "math-trainer"),
            ("Service", "math-nats"),
            ("Service", "math-rollout"),
            ("Service", "math-trainer"),
            ("ServiceAccount", "math-trainer"),
            ("StatefulSet", "math-nats"),
            ("StatefulSet", "math-rollout"),
            ("StatefulSet", "math-trainer"),
        ]
    )
    cluster_wait.wait_until(
        lambda: children(cluster, namespace, "math"),
        lambda c: c == expected,
        "all children of math",
        timeout=30,
    )
    job = get_json(cluster, "asyncrljob", "math", "-n", namespace)
    assert_render_command_printed_what_the_operator_created(cluster, namespace, job)
    trainer = get_json(cluster, "statefulset", "math-trainer", "-n", namespace)
    assert trainer["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    container = trainer["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert {e["name"] for e in container["env"]} >= {"MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK"}
    rollout = get_json(cluster, "statefulset", "math-rollout", "-n", namespace)
    assert rollout["spec"]["replicas"] == 2
    config = json.loads(get_json(cluster, "configmap", "math-config", "-n", namespace)["data"]["job.json"])
    assert config["spec"]["rollout"]["engine"]["args"] == {"max_num_seqs": 256}
    assert config["endpoints"]["trainerHost"] == f"math-trainer-0.math-trainer.{namespace}.svc"

    running_pods(cluster, namespace, "math", "rollout", 2)
    running_pods(cluster, namespace, "math", "trainer", 1)
    running_pods(cluster, namespace, "math", "nats", 1)
    refused = get_json(cluster, "events", "-n", namespace, "--field-selector=reason=FailedCreate")["items"]
    assert refused == [], [e["message"] for e in refused]
    ready_kinds = ("Ready", "TrainerReady", "RolloutReady", "BusReady", "Progressing")
    status = wait_phase(cluster, namespace, "math", "Running", true=ready_kinds)
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/readyz", timeout=5) as ready:
        assert ready.status == 200  # the chart's readiness probe: its resync loop lists jobs
    assert condition(status, "InvalidSpec").get("status") == "False"
    assert status["observedGeneration"] == job["metadata"]["generation"]

    report_progress(
        cluster,
        namespace,
        "math",
        step=12,
        paramVersion=11,
        staleness={"p50": 1.0, "max": 2},
        queueDepth=37,
        stepTime=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    table = cluster_wait.wait_until(
        lambda: cluster.kubectl("get", "arj", "-n", namespace).stdout.splitlines(),
        lambda lines: len(lines) == 2 and "Running" in lines[1],
        "kubectl get arj row",
        timeout=30,
    )
    assert table[0].split() == [
        "NAME",
        "PHASE",
        "STEP",
        "POLICY-VER",
        "LAG",
        "QUEUE",
        "ROLLOUT",
        "TRAINER",
        "AGENTS",
        "REASON",
        "AGE",
    ]
    assert table[1].split()[:8] == ["math", "Running", "12", "11", "2", "37", "2/2", "1/1"]


def assert_render_command_printed_what_the_operator_created(cluster: Any, namespace: str, job: Any) -> None:
    """`asyncrl render examples/job.yaml -n NS` (the console script, as a user runs it) printed every object
    the operator created from the same file on the real apiserver: each printed field is in the stored
    object with the same value (the apiserver adds defaults, status and its own metadata, drops empty
    values; quantities come back as strings), and the uid it leaves empty is the job's."""
    script = pathlib.Path(sys.executable).parent / "asyncrl"
    done = subprocess.run(
        [str(script), "render", str(jobs.EXAMPLES / "job.yaml"), "--namespace", namespace],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    printed = list(yaml.safe_load_all(done.stdout))
    assert sorted((o["kind"], o["metadata"]["name"]) for o in printed) == children(cluster, namespace, "math")
    for obj in printed:
        for ref in obj["metadata"]["ownerReferences"]:
            ref["uid"] = job["metadata"]["uid"]
        stored = get_json(cluster, obj["kind"].lower(), obj["metadata"]["name"], "-n", namespace)
        assert_within(obj, stored, f"{obj['kind']}/{obj['metadata']['name']}")


def assert_within(printed: Any, stored: Any, where: str) -> None:
    if isinstance(printed, dict):
        assert isinstance(stored, dict), where
        for key, value in printed.items():
            if key not in stored:  # the API's omitempty drops false, 0, "" and empty lists and maps
                assert value in (False, 0, "", [], {}), f"{where}.{key}: printed {value!r}, not stored"
                continue
            assert_within(value, stored[key], f"{where}.{key}")
    elif isinstance(printed, list):
        assert isinstance(stored, list) and len(stored) == len(printed), where
        for i, (a, b) in enumerate(zip(printed, stored, strict=True)):
            assert_within(a, b, f"{where}[{i}]")
    else:
        assert str(printed) == str(stored), f"{where}: printed {printed!r}, stored {stored!r}"


def test_scale_changes_only_the_rollout_role(cluster, namespace, operator):
    start_job(cluster, namespace)
    trainer_before = uids(running_pods(cluster, namespace, "demo", "trainer", 2))
    cluster.kubectl("scale", "asyncrljob/demo", "-n", namespace, "--replicas=4")
    running_pods(cluster, namespace, "demo", "rollout", 4)
    assert uids(running_pods(cluster, namespace, "demo", "trainer", 2)) == trainer_before
    cluster_wait.wait_until(
        lambda: job_status(cluster, namespace, "demo").get("rollout", {}),
        lambda r: r.get("ready") == "4/4",
        "status.rollout.ready 4/4",
        timeout=30,
    )
    scale = json.loads(
        cluster.kubectl(
            "get", "--raw", f"/apis/asyncrl.dev/v1alpha1/namespaces/{namespace}/asyncrljobs/demo/scale"
        ).stdout
    )
    assert scale["spec"]["replicas"] == 4 and "asyncrl.dev/role=rollout" in scale["status"]["selector"]


def test_failed_trainer_pod_restarts_the_whole_gang_and_leaves_rollouts(cluster, namespace, operator):
    start_job(cluster, namespace)
    trainer_before = uids(running_pods(cluster, namespace, "demo", "trainer", 2))
    rollout_before = uids(running_pods(cluster, namespace, "demo", "rollout", 2))
    fail_pod(cluster, namespace, "demo-trainer-1")
    cluster_wait.wait_until(
        lambda: uids(running_pods(cluster, namespace, "demo", "trainer", 2)),
        lambda now: set(now) == set(trainer_before) and not set(now.values()) & set(trainer_before.values()),
        "every trainer pod recreated",
        timeout=90,
    )
    assert uids(running_pods(cluster, namespace, "demo", "rollout", 2)) == rollout_before
    status = cluster_wait.wait_until(
        lambda: job_status(cluster, namespace, "demo"),
        lambda st: st.get("restarts", {}).get("trainer") == 1,
        "restarts.trainer 1",
    )
    assert status["restarts"].get("rollout", 0) == 0
    wait_phase(cluster, namespace, "demo", "Running")
    assert 'asyncrl_job_restarts_total{role="trainer"}' in operator.metrics()


def test_failed_rollout_pod_is_replaced_alone(cluster, namespace, operator):
    start_job(cluster, namespace)
    trainer_before = uids(running_pods(cluster, namespace, "demo", "trainer", 2))
    rollout_before = uids(running_pods(cluster, namespace, "demo", "rollout", 2))
    fail_pod(cluster, namespace, "demo-rollout-0")
    after = cluster_wait.wait_until(
        lambda: uids(running_pods(cluster, namespace, "demo", "rollout", 2)),
        lambda now: now.get("demo-rollout-0") not in (None, rollout_before["demo-rollout-0"]),
        "demo-rollout-0 replaced",
        timeout=90,
    )
    assert after["demo-rollout-1"] == rollout_before["demo-rollout-1"]
    assert uids(running_pods(cluster, namespace, "demo", "trainer", 2)) == trainer_before
    cluster_wait.wait_until(
        lambda: job_status(cluster, namespace, "demo").get("restarts", {}),
        lambda r: r.get("rollout") == 1 and r.get("trainer", 0) == 0,
        "restarts.rollout 1",
    )


def test_suspend_scales_roles_to_zero_and_resume_brings_them_back(cluster, namespace, operator):
    bind_storage(cluster, namespace, "data")
    start_job(cluster, namespace, volumes=[{"name": "data", "claimName": "data", "mountPath": "/data"}])
    nats_before = uids(running_pods(cluster, namespace, "demo", "nats", 1))
    cluster.kubectl(
        "patch", "asyncrljob", "demo", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    wait_phase(cluster, namespace, "demo", "Suspended")
    cluster_wait.wait_until(
        lambda: pods(cluster, namespace, "demo", "trainer") + pods(cluster, namespace, "demo", "rollout"),
        lambda ps: ps == [],
        "no trainer or rollout pods",
        timeout=60,
    )
    assert uids(running_pods(cluster, namespace, "demo", "nats", 1)) == nats_before  # the bus is kept
    assert get_json(cluster, "pvc", "data", "-n", namespace)["status"]["phase"] == "Bound"  # volumes are kept
    cluster.kubectl(
        "patch", "asyncrljob", "demo", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    running_pods(cluster, namespace, "demo", "trainer", 2)
    running_pods(cluster, namespace, "demo", "rollout", 2)
    wait_phase(cluster, namespace, "demo", "Running")


def test_max_steps_succeeds_and_ttl_deletes_the_job_and_its_children(cluster, namespace, operator):
    start_job(cluster, namespace, maxSteps=5, ttlSecondsAfterFinished=3)
    report_progress(cluster, namespace, "demo", step=5, paramVersion=5)
    wait_phase(cluster, namespace, "demo", "Succeeded", timeout=30)
    cluster_wait.wait_until(
        lambda: get_json(cluster, "asyncrljob", "demo", "-n", namespace),
        lambda j: j == {},
        "job deleted by its TTL",
        timeout=60,
    )
    cluster_wait.wait_until(
        lambda: (
            children(cluster, namespace, "demo")
            + [p["metadata"]["name"] for p in pods(cluster, namespace, "demo")]
        ),
        lambda left: left == [],
        "children garbage-collected",
        timeout=90,
    )


def test_deleting_a_job_garbage_collects_everything(cluster, namespace, operator):
    start_job(cluster, namespace)
    assert len(children(cluster, namespace, "demo")) == BASE_JOB_CHILDREN
    cluster.kubectl("delete", "asyncrljob", "demo", "-n", namespace, "--wait=true", "--timeout=60s")
    cluster_wait.wait_until(
        lambda: (
            children(cluster, namespace, "demo")
            + [p["metadata"]["name"] for p in pods(cluster, namespace, "demo")]
        ),
        lambda left: left == [],
        "children garbage-collected",
        timeout=90,
    )


def test_step_not_advancing_sets_stalled_and_a_refused_tracker_shows(cluster, namespace, operator):
    """Stalled from a step time that stops moving; and a tracker that refuses the key (the trainer's
    report, spec.tracking) is TrackingReady False with its reason in `kubectl describe arj`."""
    tracking = {"mlflow": {"trackingURI": "http://mlflow.mlops:5000", "experiment": "e"}}
    start_job(cluster, namespace, progress={"stalledAfterSeconds": 10}, tracking=tracking)
    old = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
    report_progress(cluster, namespace, "demo", step=3, stepTime=old)
    status = cluster_wait.wait_until(
        lambda: job_status(cluster, namespace, "demo"),
        lambda st: condition(st, "Stalled").get("status") == "True",
        "Stalled",
        timeout=30,
    )
    assert condition(status, "Progressing").get("status") == "False"
    refused = {"backend": "mlflow", "ready": False, "reason": "Unauthorized",
               "message": "mlflow: RestException: UNAUTHENTICATED: invalid token"}  # fmt: skip
    report_progress(
        cluster, namespace, "demo", step=4, stepTime=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        tracking=[refused],
    )  # fmt: skip
    status = cluster_wait.wait_until(
        lambda: job_status(cluster, namespace, "demo"),
        lambda st: (
            condition(st, "Stalled").get("status") == "False"
            and condition(st, "TrackingReady").get("reason") == "Unauthorized"
        ),
        "not Stalled, TrackingReady Unauthorized",
        timeout=30,
    )
    assert condition(status, "TrackingReady")["status"] == "False"
    described = cluster.kubectl("describe", "arj", "demo", "-n", namespace).stdout
    assert "TrackingReady" in described and "invalid token" in described, described


def test_operator_killed_mid_reconcile_creates_no_duplicates(cluster, namespace, operator):
    names = [f"crash{i}" for i in range(6)]
    cpu = {  # 6 jobs > the nodes' 16 GPUs
        "rollout": {"gpusPerReplica": 0},
        "trainer": {"gpusPerReplica": 0},
        "weightSync": {"backend": "gloo"},
    }
    bodies = [json.dumps(jobs.make_job(n, namespace, **cpu)) for n in names]
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(bodies))
    # SIGKILL as soon as the first child exists: the operator is then inside its first reconciles.
    cluster_wait.wait_until(
        lambda: get_json(cluster, CHILD_KINDS, "-n", namespace, "-l", "asyncrl.dev/job").get("items") or [],
        lambda items: len(items) > 0,
        "a first child",
        timeout=30,
        interval=0.05,
    )
    operator.kill()
    at_kill = {n: len(children(cluster, namespace, n)) for n in names}
    print("children per job when the operator was killed:", at_kill)
    operator.start()
    for name in names:
        wait_phase(cluster, namespace, name, "Running")
        assert len(children(cluster, namespace, name)) == BASE_JOB_CHILDREN
        running_pods(cluster, namespace, name, "trainer", 2)
        running_pods(cluster, namespace, name, "rollout", 2)
    assert len(pods(cluster, namespace, "crash0")) == 5  # 2 trainer + 2 rollout + 1 nats, no strays
    sts = get_json(cluster, "statefulset", "crash0-trainer", "-n", namespace, "--show-managed-fields")
    managers = {m["manager"] for m in sts["metadata"]["managedFields"] if m["operation"] == "Apply"}
    assert managers == {"asyncrl-operator"}
    generation = sts["metadata"]["generation"]
    time.sleep(7)  # two resyncs re-apply every child: nothing changes
    assert (
        get_json(cluster, "statefulset", "crash0-trainer", "-n", namespace)["metadata"]["generation"]
        == generation
    )


def _report_utilization(
    cluster: Any, namespace: str, job: str, wait: float, blocked: float, rate: float | None = None
) -> None:
    """A trainer report as trainer rank 0 sends it (steplog.report): the signals and the report's time;
    with ``rate``, samplesPerSecond and a samplesConsumed that grew at that rate since the last report
    (an older trainer leaves samplesPerSecond out)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() % 1 * 1000):03d}Z"
    utilization: dict[str, Any] = {
        "trainerWaitFraction": wait,
        "rolloutBlockedFraction": blocked,
        "steps": 20,
    }
    extra: dict[str, Any] = {}
    if rate is not None:
        utilization["samplesPerSecond"] = rate
        last_at, consumed = _consumed.get((namespace, job), (time.time(), 0.0))
        consumed += rate * (time.time() - last_at)
        _consumed[(namespace, job)] = (time.time(), consumed)
        extra["samplesConsumed"] = int(consumed)
    report_progress(cluster, namespace, job, step=3, utilization=utilization, lastUpdateTime=now, **extra)


_consumed: dict[tuple[str, str], tuple[float, float]] = {}
"""(time, samplesConsumed) of each job's last report with a rate (``_report_utilization``)."""


def _scale_while_reporting(
    cluster: Any,
    namespace: str,
    wait: float,
    blocked: float,
    replicas: int,
    timeout: float = 60,
    rate: float | None = None,
) -> dict[str, Any]:
    """Report every second (a new report time each) until spec.rollout.replicas is `replicas`."""
    deadline = time.monotonic() + timeout
    while True:
        _report_utilization(cluster, namespace, "demo", wait, blocked, rate)
        job = get_json(cluster, "asyncrljob", "demo", "-n", namespace)
        if job["spec"]["rollout"]["replicas"] == replicas:
            return job
        assert time.monotonic() < deadline, job.get("status", {}).get("autoscale")
        time.sleep(1.1)


def test_autoscale_sizes_the_rollouts_through_the_scale_subresource(cluster, namespace, operator):
    """spec.rollout.autoscale: a starved trainer's reports raise spec.rollout.replicas through /scale
    (status.autoscale and an Event say why, the StatefulSet follows the spec), reports at maxReplicas
    change nothing, and a blocked fleet brings it back down to minReplicas."""
    autoscale = {"minReplicas": 1, "maxReplicas": 2, "scaleUpStabilizationSeconds": 2,
                 "scaleDownStabilizationSeconds": 3, "scaleUpRetrySeconds": 15}  # fmt: skip
    start_job(cluster, namespace, rollout={"replicas": 1, "autoscale": autoscale})
    running_pods(cluster, namespace, "demo", "rollout", 1)
    _scale_while_reporting(cluster, namespace, wait=0.6, blocked=0.0, replicas=2)
    job = get_json(cluster, "asyncrljob", "demo", "-n", namespace, "--show-managed-fields")
    managers = {m["manager"] for m in job["metadata"]["managedFields"] if m.get("subresource") == "scale"}
    assert managers, "the replicas were not set through /scale"
    running_pods(cluster, namespace, "demo", "rollout", 2)
    assert get_json(cluster, "statefulset", "demo-rollout", "-n", namespace)["spec"]["replicas"] == 2
    status = cluster_wait.wait_until(
        lambda: job_status(cluster, namespace, "demo").get("autoscale") or {},
        lambda a: a.get("lastScaleReason", "").startswith("rollout replicas 1 -> 2"),
        "status.autoscale of the scale-up",
        timeout=30,
    )
    assert "trainer starved" in status["lastScaleReason"] and status["trainerWaitFraction"] == 0.6
    cluster_wait.wait_until(
        lambda: job_status(cluster, namespace, "demo").get("rollout", {}).get("readyReplicas"),
        lambda ready: ready == 2,
        "2 ready rollout replicas in status",
        timeout=60,
    )
    for _ in range(5):  # starved at maxReplicas: nothing changes
        _report_utilization(cluster, namespace, "demo", 0.6, 0.0)
        time.sleep(1.1)
    assert get_json(cluster, "asyncrljob", "demo", "-n", namespace)["spec"]["rollout"]["replicas"] == 2
    at_max = job_status(cluster, namespace, "demo")["autoscale"]
    assert (at_max["reason"], "at maxReplicas 2" in at_max["message"]) == ("Stable", True), at_max
    _scale_while_reporting(cluster, namespace, wait=0.0, blocked=0.95, replicas=1)
    events = get_json(cluster, "events", "-n", namespace, "--field-selector", "involvedObject.name=demo")[
        "items"
    ]
    reasons = [(e["reason"], e["message"].split(":")[0]) for e in events if e["reason"].startswith("Scale")]
    assert ("ScaleUp", "rollout replicas 1 -> 2") in reasons and (
        "ScaleDown",
        "rollout replicas 2 -> 1",
    ) in reasons
    described = cluster.kubectl("describe", "arj", "demo", "-n", namespace).stdout
    assert "rollouts held back" in described, described
    assert (
        job_status(cluster, namespace, "demo")["autoscale"].get("warning", "") == ""
    )  # 2 fit the kwok nodes
    # a maxReplicas the GPU nodes can never hold is accepted, with a warning in status and an Event
    cluster.kubectl("patch", "arj", "demo", "-n", namespace, "--type=merge",
                    "-p", '{"spec":{"rollout":{"autoscale":{"maxReplicas":1000}}}}')  # fmt: skip

    def warned() -> str:
        _report_utilization(cluster, namespace, "demo", 0.0, 0.0)
        return str(job_status(cluster, namespace, "demo")["autoscale"].get("warning", ""))

    warning = cluster_wait.wait_until(
        warned, lambda w: "maxReplicas 1000 can never" in w, "the fit warning", 30
    )
    assert "of 1 nvidia.com/gpu" in warning, warning
    described = cluster.kubectl("describe", "arj", "demo", "-n", namespace).stdout
    assert "MaxReplicasUnschedulable" in described, described
    # a scale-up that does not raise the trainer's consumed samples/s is undone, and not tried again at
    # once although the trainer still waits (the ceiling, in status)
    _scale_while_reporting(cluster, namespace, wait=0.6, blocked=0.0, replicas=2, rate=100.0)
    running_pods(cluster, namespace, "demo", "rollout", 2)
    job = _scale_while_reporting(cluster, namespace, wait=0.4, blocked=0.0, replicas=1, rate=90.0)
    running_pods(cluster, namespace, "demo", "rollout", 1)
    for _ in range(4):
        _report_utilization(cluster, namespace, "demo", 0.6, 0.0, 100.0)
        time.sleep(1.1)
    held = job_status(cluster, namespace, "demo")["autoscale"]
    assert (held["reason"], held["ceilingReplicas"], held["samplesPerSecond"]) == ("AtCeiling", 1, 100.0)
    assert get_json(cluster, "asyncrljob", "demo", "-n", namespace)["spec"]["rollout"]["replicas"] == 1
    reason = held["lastScaleReason"]
    assert reason.startswith("rollout replicas 2 -> 1: consumed samples/s "), held
    words = reason.split(" ")  # "... consumed samples/s A with 2 replicas against B with 1, ..."
    after, before = float(words[7]), float(words[12])
    assert 80 < after < 100 and 90 < before < 110, reason
    described = cluster.kubectl("describe", "arj", "demo", "-n", namespace).stdout
    assert "ScaleUpUndone" in described, described
    # once scaleUpRetrySeconds passed, the ceiling leaves status and a starved trainer scales up again
    _scale_while_reporting(cluster, namespace, wait=0.6, blocked=0.0, replicas=2, rate=100.0, timeout=60)
    cluster_wait.wait_until(
        lambda: job_status(cluster, namespace, "demo")["autoscale"],
        lambda a: "ceilingReplicas" not in a and "ceilingUntil" not in a,
        "the expired ceiling gone from status.autoscale",
        timeout=30,
    )
    # docs/autoscaling.md's HPA (autoscaling/v2) and KEDA ScaledObject (against KEDA's own CRD, from its Go
    # module) targeting an AsyncRLJob's /scale: accepted by the real API, unknown fields refused (strict)
    gang_bins.install_keda_crds(cluster)
    docs = (REPO / "docs" / "autoscaling.md").read_text()
    for heading in ("# hpa\n", "# keda-scaledobject\n"):
        (text,) = [b for b in docs.split("```yaml\n")[1:] if b.startswith(heading)]
        obj = yaml.safe_load(text.split("```")[0])
        obj["metadata"]["namespace"] = namespace
        obj["spec"]["scaleTargetRef"]["name"] = "demo"
        out = cluster.kubectl(
            "apply", "--dry-run=server", "--validate=strict", "-f", "-", input=json.dumps(obj)
        ).stdout
        assert "created (server dry run)" in out, (heading, out)
    typo = {**obj, "spec": {**obj["spec"], "minReplicas": 1}}  # HPA's field name, not KEDA's
    refused = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-f", "-", input=json.dumps(typo), check=False
    )
    assert refused.returncode != 0 and "minReplicas" in refused.stderr, refused.stderr
