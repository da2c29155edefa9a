"""A minimal HTTPS JSON client for the test apiserver and the components' health endpoints.

Called by `cluster` for readiness probes and for creating the fake GPU nodes, and by tests that need a
raw API call with some other identity (e.g. a service-account bearer token, to see a real 403).
Standard library only, so the harness starts before any Python Kubernetes client is imported.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import ssl
import urllib.error
import urllib.request
from typing import Any


@dataclasses.dataclass(frozen=True)
class Response:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def tls_context(
    ca_cert: pathlib.Path | None = None,
    client_cert: pathlib.Path | None = None,
    client_key: pathlib.Path | None = None,
) -> ssl.SSLContext:
    """A context that verifies the server against `ca_cert` (or not at all when None)."""
    if ca_cert is None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cafile=str(ca_cert))
    if client_cert is not None:
        context.load_cert_chain(str(client_cert), str(client_key) if client_key else None)
    return context


def request(
    url: str,
    method: str = "GET",
    body: Any = None,
    context: ssl.SSLContext | None = None,
    token: str | None = None,
    timeout: float = 10.0,
) -> Response:
    """Send one request; HTTP error statuses are returned, not raised (callers assert on them)."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, context=context, timeout=timeout) as resp:
            return Response(resp.status, resp.read())
    except urllib.error.HTTPError as exc:
        return Response(exc.code, exc.read())
