"""The probe endpoints beside /metrics: the operator's /readyz (a resync listing within the window) and
the workloads' /healthz and /readyz (asyncrl_workloads.metrics.READY), served by the real WSGI servers."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

from asyncrl_operator import metrics as operator_metrics
from asyncrl_workloads import metrics as workload_metrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_operator_is_ready_only_while_its_resync_lists_jobs() -> None:
    port = _free_port()
    operator_metrics.serve(port, ready_window=0.5, addr="127.0.0.1")
    assert _get(port, "/readyz")[0] == 503  # no listing yet
    operator_metrics.mark_listed()
    assert _get(port, "/readyz")[0] == 200
    assert not operator_metrics.ready(window=-1.0)  # a listing older than the window does not count
    assert "asyncrl_operator_reconcile_seconds" in _get(port, "/metrics")[1]


def test_workload_readyz_follows_ready_and_healthz_always_answers() -> None:
    port = _free_port()
    workload_metrics.serve(port, addr="127.0.0.1")
    assert _get(port, "/readyz")[0] == 503 and _get(port, "/healthz") == (200, "ok\n")
    workload_metrics.READY.set()
    try:
        assert _get(port, "/readyz")[0] == 200
    finally:
        workload_metrics.READY.clear()
    assert _get(port, "/metrics")[0] == 200
