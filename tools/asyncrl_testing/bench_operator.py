"""Reconcile benchmark (a script, not a test): N AsyncRLJobs against the real apiserver, time until
all of a job's children exist, and the operator's peak RSS.

    .venv/bin/python tools/asyncrl_testing/bench_operator.py --jobs 200 --rate 10
    .venv/bin/python tools/asyncrl_testing/bench_operator.py --jobs 200 --rate 0      # one burst

"All children exist" is measured as the arrival (watch event) of the job's rollout StatefulSet: the
operator applies children in render() order and the rollout StatefulSet is the last one, so its
existence implies every other child's. Jobs are created with the python client (POST), timestamped
just before the request. Jobs are created suspended by default (children, no pods) so the figure is
the operator's latency, not the scheduler's; --running creates pods too.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import kubernetes  # noqa: E402

from asyncrl_testing import cluster, cluster_client, jobs, operator_proc, procfs  # noqa: E402


def _watch_rollouts(api: Any, namespace: str, seen: dict[str, float], stop: threading.Event) -> None:
    apps = kubernetes.client.AppsV1Api(api)
    watch = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]
    for event in watch.stream(  # type: ignore[no-untyped-call]
        apps.list_namespaced_stateful_set,
        namespace,
        label_selector="asyncrl.dev/role=rollout",
        timeout_seconds=600,
    ):
        if event["type"] == "ADDED":
            seen.setdefault(event["object"].metadata.labels["asyncrl.dev/job"], time.monotonic())
        if stop.is_set():
            watch.stop()  # type: ignore[no-untyped-call]


def _peak_rss_mb(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _metric(text: str, name: str) -> float:
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")), 0.0)


def run(n_jobs: int, rate: float, running: bool, workdir: pathlib.Path) -> dict[str, Any]:
    with (
        cluster.start_cluster(workdir / "cluster", gpu_nodes=2) as c,
        operator_proc.running(c, workdir, resync_seconds=60.0) as op,
    ):
        c.kubectl("create", "namespace", "bench")
        api = cluster_client.api_client(c)
        custom = kubernetes.client.CustomObjectsApi(api)
        seen: dict[str, float] = {}
        created: dict[str, float] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=_watch_rollouts, args=(api, "bench", seen, stop), daemon=True)
        watcher.start()
        time.sleep(1.0)
        rss_start = _peak_rss_mb(op.proc.pid) if op.proc else float("nan")
        begin = time.monotonic()
        for i in range(n_jobs):
            name = f"bench-{i:04d}"
            body = jobs.make_job(
                name,
                "bench",
                suspend=not running,
                rollout={"replicas": 1, "gpusPerReplica": 0},
                trainer={"replicas": 1, "gpusPerReplica": 0},
                weightSync={"backend": "gloo"},
            )
            created[name] = time.monotonic()
            custom.create_namespaced_custom_object("asyncrl.dev", "v1alpha1", "bench", "asyncrljobs", body)
            if rate > 0:
                time.sleep(max(0.0, begin + (i + 1) / rate - time.monotonic()))
        deadline = time.monotonic() + 300
        while len(seen) < n_jobs and time.monotonic() < deadline:
            time.sleep(0.2)
        stop.set()
        latencies = sorted(seen[n] - created[n] for n in created if n in seen)
        result = {
            "jobs": n_jobs,
            "rate_per_s": rate or "burst",
            "running_pods": running,
            "children_ready_for": len(latencies),
            "p50_s": round(statistics.median(latencies), 3) if latencies else None,
            "p99_s": round(latencies[max(0, int(len(latencies) * 0.99) - 1)], 3) if latencies else None,
            "max_s": round(latencies[-1], 3) if latencies else None,
            "operator_rss_before_mb": round(rss_start, 1),
            "operator_peak_rss_mb": round(_peak_rss_mb(op.proc.pid), 1) if op.proc else None,
            "operator_cpu_seconds": round(procfs.cpu_seconds(op.proc.pid), 1) if op.proc else None,
            "wall_seconds": round(time.monotonic() - begin, 1),
            "load_average_1m": round(__import__("os").getloadavg()[0], 1),
            "reconciles": _metric(op.metrics(), "asyncrl_operator_reconcile_seconds_count"),
            "reconcile_seconds_sum": _metric(op.metrics(), "asyncrl_operator_reconcile_seconds_sum"),
        }
        api.close()
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rate", type=float, default=10.0, help="jobs created per second (0: one burst)")
    parser.add_argument("--running", action="store_true", help="running jobs (pods), not suspended")
    parser.add_argument("--json", type=pathlib.Path, help="also write the result object here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-") as tmp:
        result = run(args.jobs, args.rate, args.running, pathlib.Path(tmp))
        print(json.dumps(result, indent=2))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
