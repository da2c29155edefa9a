"""A small real HTTP server for the endpoint faults an honest vLLM server will not produce.

Used by tests/dataplane/test_endpoints.py (and the judge's tests): answers every POST from a script of
replies, then a default one, and records when each request arrived (``arrivals``, time.monotonic), so
rate limits are measured where they matter, at the server.

    with fault_server.serve() as fs:                        # answers a valid chat.completion
        fs.script(fault_server.status(429, retry_after=1))  # the next request gets a 429, then ok again
        fs.default = fault_server.HANG                      # every later one: no answer at all

``DRIP`` sends its headers and then its body a byte a second (a stuck proxy or server that keeps the
connection alive: no read ever waits long, the answer never completes); ``redirect(fs.login_url)``
sends a request to a login page, as an SSO proxy in front of an API does; ``answered_error(...)`` is a
200 whose body is an error object. GET .../models lists the one model ``fault``; GET /login is an HTML
sign-in page. The server is the standard library's threaded HTTP server on a thread of the test process
(daemon threads; a hung or dripping handler is released on exit).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import http.server
import json
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

MODEL = "fault"


@dataclasses.dataclass(frozen=True)
class Reply:
    status: int = 200
    body: str | None = None
    """None: a valid chat.completion whose content is ``content``."""
    content_type: str = "application/json"
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    hang: bool = False
    """Never answer (until the server closes)."""
    drip_every: float | None = None
    """Send the headers (with the whole body's Content-Length), then the body one byte per this many
    seconds (until the client leaves or the server closes)."""
    content: str = "7"


OK = Reply()
NO_CHOICES = Reply(body='{"id":"x"}')
HTML = Reply(body="<html><body><h1>502 Bad Gateway</h1><p>nginx</p></body></html>", content_type="text/html")
HANG = Reply(hang=True)
DRIP = Reply(drip_every=1.0)
LOGIN_PATH = "/login"
LOGIN_PAGE = "<html><body><h1>Sign in</h1><form action='/login' method='post'>SSO</form></body></html>"


def redirect(location: str, code: int = 302) -> Reply:
    """A redirect to ``location`` (an SSO login page: ``FaultServer.login_url``)."""
    return Reply(status=code, body="", content_type="text/html", headers={"Location": location})


def answered_error(error: object) -> Reply:
    """A 200 whose body is ``{"error": error}`` in place of choices (some proxies and aggregators)."""
    return Reply(body=json.dumps({"error": error}))


def status(code: int, retry_after: float | None = None, body: str = '{"error":"fault"}') -> Reply:
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
    return Reply(status=code, body=body, headers=headers)


def completion(content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fault",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class FaultServer:
    def __init__(self, default: Reply = OK) -> None:
        self.default = default
        self.arrivals: list[float] = []
        """time.monotonic() of each POST's arrival, in order."""
        self._script: collections.deque[Reply] = collections.deque()
        self._lock = threading.Lock()
        self.closing = threading.Event()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.login_url = f"http://127.0.0.1:{self.port}{LOGIN_PATH}?rd=%2Fv1%2Fchat%2Fcompletions"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="fault-server", daemon=True)
        self._thread.start()

    def script(self, *replies: Reply) -> None:
        """The next requests get ``replies`` in order, then ``default`` again."""
        with self._lock:
            self._script.extend(replies)

    def next_reply(self) -> Reply:
        with self._lock:
            self.arrivals.append(time.monotonic())
            return self._script.popleft() if self._script else self.default

    def close(self) -> None:
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(10)


@contextlib.contextmanager
def serve(default: Reply = OK) -> Iterator[FaultServer]:
    server = FaultServer(default)
    try:
        yield server
    finally:
        server.close()


def _handler(server: FaultServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            reply = server.next_reply()
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if reply.hang:
                server.closing.wait()
                return
            body = reply.body if reply.body is not None else json.dumps(completion(reply.content))
            if reply.drip_every is not None:
                self._drip(reply.status, body, reply.content_type, reply.drip_every)
            else:
                self._send(reply.status, body, reply.content_type, reply.headers)

        def do_GET(self) -> None:  # noqa: N802
            if self.path.rstrip("/").endswith("/models"):
                models = {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "fault"}]}
                self._send(200, json.dumps(models), "application/json", {})
            elif self.path.split("?")[0] == LOGIN_PATH:
                self._send(200, LOGIN_PAGE, "text/html", {})
            else:
                self._send(404, '{"error":"not found"}', "application/json", {})

        def _send(self, code: int, body: str, content_type: str, headers: Mapping[str, str]) -> None:
            data = body.encode()
            self._head(code, len(data), content_type, headers)
            self.wfile.write(data)

        def _drip(self, code: int, body: str, content_type: str, every: float) -> None:
            data = body.encode()
            self._head(code, len(data), content_type, {})
            self.close_connection = True  # the body is cut short when the client leaves
            for i in range(len(data)):
                if server.closing.wait(every):
                    return
                try:
                    self.wfile.write(data[i : i + 1])
                except OSError:  # the client gave up on the answer
                    return

        def _head(self, code: int, length: int, content_type: str, headers: Mapping[str, str]) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(length))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's signature)
            pass

    return Handler
