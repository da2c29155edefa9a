"""The local gateway's front URL: one address for a local run's agents, in front of its rollout replicas.

Started by `runner` for a gateway job (spec.agent.loop: gateway) on spec.agent.gateway.port, where the
Service `<job>-gateway` serves on a cluster; replica i listens on port + 1 + i (`gateway.LocalGateway`).
Like the Service, it spreads requests over the replicas: each request goes to the next replica in turn
(the Service picks one per connection; one agent's keep-alive connection would otherwise land every
group on one replica, whose admission then answers 429 while another has room). Two things it does that
a Service does not, both for requests that the replica answered without doing anything: a replica that
refuses the connection (not up yet, restarting) is skipped, and a 429 to ``POST /rl/groups`` or
``/rl/sessions`` (no admission on that replica) is tried on the others before the agent gets it. Sessions
carry their replica's own URL (``base_url``), so their calls never pass here.

Standard library only (a `ThreadingHTTPServer` in a daemon thread, `http.client` to the replicas);
answers are streamed through as they come (server-sent events included).
"""

from __future__ import annotations

import http.client
import http.server
import itertools
import json
import threading
import urllib.parse
from collections.abc import Sequence

ADMISSION_ROUTES = ("/rl/groups", "/rl/sessions")
"""A 429 here means no admission on that replica: nothing was opened, so another replica may be asked."""
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade",
})  # fmt: skip
TIMEOUT_S = 600.0
"""A replica's answer (a long completion) may take this long."""


class Front:
    """The front's server, its replicas (base URLs) and the round-robin over them."""

    def __init__(self, port: int, replicas: Sequence[str], host: str = "127.0.0.1") -> None:
        self.host, self.replicas = host, [urllib.parse.urlsplit(url) for url in replicas]
        self._turn = itertools.count()
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"front": self})
        self.server = http.server.ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="gateway-front", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.server.server_port}"

    def start(self) -> Front:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def order(self) -> list[urllib.parse.SplitResult]:
        """The replicas in the order this request tries them: the next in turn first."""
        with self._lock:
            start = next(self._turn) % len(self.replicas)
        return self.replicas[start:] + self.replicas[:start]


class _Handler(http.server.BaseHTTPRequestHandler):
    front: Front
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._forward()

    def do_POST(self) -> None:  # noqa: N802
        self._forward()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
        del format, args  # no access log: the replicas count requests (asyncrl_gateway_requests_total)

    def _forward(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}}
        admission = self.command == "POST" and self.path.split("?")[0] in ADMISSION_ROUTES
        refused: tuple[int, str, list[tuple[str, str]], bytes] | None = None  # the last 429, read
        for replica in self.front.order():
            host = replica.hostname or "127.0.0.1"
            conn = http.client.HTTPConnection(host, replica.port, timeout=TIMEOUT_S)
            try:
                conn.connect()
            except OSError:  # not listening (starting, restarting): nothing was sent
                conn.close()
                continue
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:  # sent, then lost: never sent twice
                conn.close()
                self._error(502, f"the gateway replica failed mid-request ({exc}); retry", "bad_gateway")
                return
            if admission and response.status == 429:
                refused = (response.status, response.reason, response.getheaders(), response.read())
                conn.close()
                continue
            try:
                self._relay(response.status, response.reason, response.getheaders(), response)
            except (OSError, http.client.HTTPException):  # either side went away mid-answer
                self.close_connection = True
            finally:
                conn.close()
            return
        if refused is not None:
            self._relay(*refused)
        else:
            self._error(503, "no gateway replica is serving yet (the engines start); retry", "unavailable")

    def _relay(
        self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes | http.client.HTTPResponse
    ) -> None:
        """A replica's answer: its status and headers, the body chunked as it comes (a stream of events
        is passed on event by event)."""
        self.send_response(status, reason)
        for name, value in headers:
            if name.lower() not in HOP_BY_HOP | {"content-length", "date", "server"}:
                self.send_header(name, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunks = iter([body]) if isinstance(body, bytes) else iter(lambda: body.read1(65536), b"")
        for chunk in chunks:
            if chunk:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def _error(self, status: int, message: str, code: str) -> None:
        """An OpenAI-shaped error of the front's own (no replica answered), with Retry-After."""
        error = {"message": message, "type": "server_error", "param": None, "code": code}
        body = json.dumps({"error": error})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(body.encode())
