"""The local gateway's front URL (local/front.py) on real sockets: replicas stood in for by small HTTP
servers that answer `POST /rl/groups` the way a gateway replica does (200 with the group, or 429 with
Retry-After when its admission is full) and stream an event answer. The real replicas behind it:
tests/e2e/test_gateway_clients.py opens its sessions through the front of `asyncrl run`."""

from __future__ import annotations

import collections
import http.server
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from asyncrl_workloads.local import front, process


class Replica:
    """A stand-in gateway replica: counts the groups it opened; ``full`` answers 429 instead."""

    def __init__(self, name: str, full: bool = False) -> None:
        self.name, self.full, self.groups = name, full, 0
        replica = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                del format, args

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.path == "/rl/groups" and replica.full:
                    self._answer(429, {"error": {"code": "rate_limited"}}, {"Retry-After": "1"})
                elif self.path == "/rl/groups":
                    replica.groups += 1
                    request = json.loads(body)
                    auth = self.headers["Authorization"]
                    self._answer(200, {"replica": replica.name, "n": request["n"], "auth": auth})
                else:  # a stream of events, written in pieces
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for i in range(3):
                        event = f"data: {i}\n\n".encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")

            def _answer(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    started = [Replica("r0"), Replica("r1")]
    yield started
    for replica in started:
        replica.stop()


def serve(urls: list[str]) -> front.Front:
    return front.Front(process.free_port(), urls).start()


def post(url: str, body: Any) -> tuple[int, Any, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": "Bearer admin"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def test_two_replicas_both_get_groups_through_the_front(replicas: list[Replica]) -> None:
    gateway = serve([r.url for r in replicas])
    try:
        answers = [post(f"{gateway.url}/rl/groups", {"n": 4}) for _ in range(6)]
    finally:
        gateway.stop()
    assert [status for status, _, _ in answers] == [200] * 6
    served = collections.Counter(json.loads(body)["replica"] for _, body, _ in answers)
    assert served == {"r0": 3, "r1": 3} and [r.groups for r in replicas] == [3, 3]
    assert {json.loads(body)["auth"] for _, body, _ in answers} == {"Bearer admin"}  # headers go through


def test_a_full_replica_passes_its_groups_to_the_other_and_all_full_is_a_429(replicas: list[Replica]) -> None:
    replicas[0].full = True
    gateway = serve([r.url for r in replicas])
    try:
        answers = [post(f"{gateway.url}/rl/groups", {"n": 1}) for _ in range(4)]
        assert [status for status, _, _ in answers] == [200] * 4 and replicas[1].groups == 4
        replicas[1].full = True
        status, body, headers = post(f"{gateway.url}/rl/groups", {"n": 1})
    finally:
        gateway.stop()
    assert (status, json.loads(body)["error"]["code"], headers["Retry-After"]) == (429, "rate_limited", "1")


def test_a_replica_not_listening_is_skipped_and_none_is_a_503(replicas: list[Replica]) -> None:
    gone = f"http://127.0.0.1:{process.free_port()}"
    gateway = serve([gone, replicas[1].url])
    try:
        assert [post(f"{gateway.url}/rl/groups", {"n": 1})[0] for _ in range(2)] == [200, 200]
    finally:
        gateway.stop()
    assert replicas[1].groups == 2
    nobody = serve([gone])
    try:
        status, body, headers = post(f"{nobody.url}/rl/groups", {"n": 1})
    finally:
        nobody.stop()
    assert (status, json.loads(body)["error"]["code"], headers["Retry-After"]) == (503, "unavailable", "1")


def test_a_streamed_answer_comes_through_whole_with_its_headers(replicas: list[Replica]) -> None:
    gateway = serve([replicas[0].url])
    try:
        status, body, headers = post(f"{gateway.url}/sessions/s/v1/responses", {"stream": True})
    finally:
        gateway.stop()
    assert (status, headers["Content-Type"]) == (200, "text/event-stream")
    assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
