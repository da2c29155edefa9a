"""What went wrong with an endpoint call, in one of seven classes, with the fix in the message.

``classify`` is called by ``client.py`` for every failed attempt (and the preflight); ``bad_response``
for an answer that came but cannot be used. ``EndpointError.line()`` is the termination-message line a
rollout or trainer writes before exiting (``termination.write``); the operator matches

    ^(KINDS joined by |): (judge|teacher) endpoint

and shows the class as the EndpointsReady condition's reason, the line as its message.

    Unauthorized  401/403, or a key the HTTP library refuses to send (a newline in it): names the Secret
                  and key, says to check stray whitespace/newlines and a duplicated /v1 in the base URL;
                  a redirect where an answer should be (a login page): names where it went
    Unreachable   refused, DNS, no complete answer within timeoutSeconds, proxy, TLS: names host and
                  port                                                               retryable
    NotFound      404 (model or path): lists the served models when /models answered
    BadResponse   an answer that is not JSON or has no choices[0]: quotes its first 200 characters, after
                  the message of an error object the server sent in place of choices
    RateLimited   429 (Retry-After kept), or a 2xx error object saying 429/rate limit retryable
    ServerError   5xx, or a 2xx error object saying 5xx/server error/overloaded       retryable
    BadRequest    any other 4xx (e.g. prompt too long): this request only, not retried

No message ever holds the API key: the HTTP library's own errors can (h11 quotes a refused header
value whole), so every message is scrubbed of the key before it is stored.
"""

from __future__ import annotations

import json
import socket
import typing
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

import openai

from asyncrl_workloads.endpoints import settings

Kind = Literal[
    "Unauthorized", "Unreachable", "NotFound", "BadResponse", "RateLimited", "ServerError", "BadRequest"
]
KINDS: tuple[Kind, ...] = typing.get_args(Kind)
RETRYABLE: frozenset[Kind] = frozenset({"RateLimited", "Unreachable", "ServerError"})
BODY_QUOTE_CHARS = 200


class Response(Protocol):
    """What ``redirected`` reads of an HTTP response (the SDK's httpx response; its package name has
    changed across SDK versions, so it is not imported)."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def url(self) -> object: ...
    @property
    def history(self) -> Sequence[Response]: ...


class EndpointError(Exception):
    """A classified endpoint failure; ``str()`` is ``line()``."""

    def __init__(
        self,
        kind: Kind,
        endpoint: settings.Endpoint,
        message: str,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.kind: Kind = kind
        self.endpoint = endpoint.name
        self.base_url = endpoint.base_url
        self.message = scrub(message, endpoint.api_key)
        self.status = status
        self.retry_after = retry_after
        self.retryable = kind in RETRYABLE
        super().__init__(self.line())

    def line(self) -> str:
        """The termination-message line: ``Kind: name endpoint base_url: message``."""
        return f"{self.kind}: {self.endpoint} endpoint {self.base_url}: {self.message}"

    def code(self) -> str:
        """The metrics' ``code`` label: the HTTP status, or the class when no usable answer came."""
        return str(self.status) if self.status is not None else self.kind


def scrub(text: str, key: str | None) -> str:
    """``text`` without the key (nor its stripped form)."""
    for secret in {key, key.strip()} if key else ():
        if secret:
            text = text.replace(secret, "***")
    return text


def classify(
    exc: BaseException,
    endpoint: settings.Endpoint,
    body_hint: str = "",
    served_models: Sequence[str] | None = None,
) -> EndpointError:
    """The EndpointError for an exception raised by an openai SDK call (or the HTTP stack below it).

    ``body_hint``: the answer's text when the caller has it; ``served_models``: the ids GET {base}/models
    returned, for a 404 (the client fetches them; None when that failed too)."""
    if isinstance(exc, EndpointError):
        return exc
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if 300 <= status < 400 or (exc.response.history and status < 500 and status != 429):
            return redirected(endpoint, exc.response)
        body = body_hint or _text(exc)
        return _from_status(status, endpoint, body, served_models, retry_after(exc))
    if isinstance(exc, openai.APIConnectionError | OSError | TimeoutError):
        if _refused_header(exc, endpoint):
            return EndpointError("Unauthorized", endpoint, _unauthorized("the key was not sent", endpoint))
        return EndpointError("Unreachable", endpoint, _unreachable(exc, endpoint))
    if isinstance(exc, openai.APIResponseValidationError | ValueError | KeyError | TypeError):
        return bad_response(endpoint, body_hint, f"{type(exc).__name__}: {exc}")
    return EndpointError("Unreachable", endpoint, f"{endpoint.host_port()}: {type(exc).__name__}: {exc}")


def bad_response(endpoint: settings.Endpoint, body: str, why: str) -> EndpointError:
    """An answer that came (2xx) but cannot be used: ``why`` and the first 200 characters of it."""
    quoted = body[:BODY_QUOTE_CHARS]
    return EndpointError("BadResponse", endpoint, f"{why}; the answer began: {quoted!r}", status=None)


RATE_LIMITED_TYPES = frozenset(
    {"rate_limit_error", "rate_limit_exceeded", "rate_limited", "too_many_requests"}
)
SERVER_ERROR_TYPES = frozenset(
    {"server_error", "api_error", "overloaded_error", "internal_error", "overloaded"}
)


def answered_error(endpoint: settings.Endpoint, body: str, error: object) -> EndpointError:
    """A 2xx whose body is an error object (``{"error": {"message": ...}}`` or ``{"error": "..."}``, as
    some proxies and aggregators send) in place of choices, the error's own message first. Its class
    follows what the object says, as the HTTP status would have: a ``code`` of 429 or a rate-limit
    ``type`` is RateLimited, a 5xx ``code`` or a server/overloaded ``type`` ServerError (both retried:
    "upstream provider overloaded" usually passes), anything else BadResponse."""
    code = kind = None
    if isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]:
        details = [f"{k} {error[k]}" for k in ("code", "type") if isinstance(error.get(k), str | int)]
        text = error["message"] + (f" ({', '.join(details)})" if details else "")
        code, kind = str(error.get("code") or ""), str(error.get("type") or "").lower()
    else:
        text = error if isinstance(error, str) else json.dumps(error)
    said = f"the endpoint answered an error: {text[:BODY_QUOTE_CHARS]}"
    quoted = f"; the answer began: {body[:BODY_QUOTE_CHARS]!r}"
    if code == "429" or kind in RATE_LIMITED_TYPES or (code or "").lower() in RATE_LIMITED_TYPES:
        return EndpointError("RateLimited", endpoint, said + quoted)
    if (code and code.isdigit() and code.startswith("5") and len(code) == 3) or kind in SERVER_ERROR_TYPES:
        return EndpointError("ServerError", endpoint, said + quoted)
    return bad_response(endpoint, body, said)


def redirected(endpoint: settings.Endpoint, response: Response) -> EndpointError:
    """A redirect where an answer should be: the 3xx itself (``response``, its Location kept), or the
    unusable end of redirects the HTTP library followed (a login page's 200 HTML, its 401/403/404/405).

    Unauthorized, not BadResponse: an OpenAI-compatible server answers a POST itself; what redirects it
    is almost always a login in front of the API (an SSO portal, oauth2-proxy, a cloud's identity-aware
    proxy) sending what it takes for a browser to its sign-in page. The fix is the user's credentials or
    base URL, as for a 401 (the EndpointsReady reason Unauthorized points there), not the model server
    a BadResponse would send them to; and, as a 401, retrying cannot help. A 5xx or 429 after a redirect
    keeps its own class."""
    hops = [*response.history, response] if 300 <= response.status_code < 400 else list(response.history)
    codes = " -> ".join(str(r.status_code) for r in hops)
    if 300 <= response.status_code < 400:
        to = response.headers.get("location") or "nowhere (no Location header)"
        ended = ""
    else:
        to, ended = str(response.url), f" (which answered HTTP {response.status_code})"
    to = to[:BODY_QUOTE_CHARS]
    msg = (
        f"the endpoint redirected the request (HTTP {codes}) to {to}{ended} instead of answering it, as a "
        "login page in front of an API does: this client authenticates only with a Bearer API key (here: "
        f"{_key_source(endpoint)}), never through an SSO/OAuth login; use an API key the endpoint accepts "
        "without a login, or a base URL that is not behind one"
    )
    return EndpointError("Unauthorized", endpoint, msg, hops[0].status_code)


def retry_after(exc: openai.APIStatusError) -> float | None:
    """The Retry-After header in seconds (the HTTP-date form is not honoured: None)."""
    value = exc.response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _from_status(
    status: int,
    endpoint: settings.Endpoint,
    body: str,
    served_models: Sequence[str] | None,
    wait: float | None,
) -> EndpointError:
    said = f"HTTP {status} {body[:BODY_QUOTE_CHARS]!r}"
    if status in (401, 403):
        return EndpointError("Unauthorized", endpoint, _unauthorized(said, endpoint), status)
    if status == 404:
        served = (
            f"; the server serves: {', '.join(served_models)}"
            if served_models
            else "; GET models did not answer with a list either: check the base URL's path"
        )
        msg = f"{said}: model {endpoint.model!r} or the path is not served{served}"
        return EndpointError("NotFound", endpoint, msg, status)
    if status == 429:
        after = f" (Retry-After {wait:g} s)" if wait is not None else ""
        msg = f"{said}: rate limited{after}; lower the job's rateLimit or raise the endpoint's quota"
        return EndpointError("RateLimited", endpoint, msg, status, wait)
    if status >= 500:
        return EndpointError("ServerError", endpoint, f"{said}: the server failed", status, wait)
    return EndpointError("BadRequest", endpoint, f"{said}: the server refused this request", status)


def _key_source(endpoint: settings.Endpoint) -> str:
    """Where the key the client sends comes from, or why it sends none."""
    if endpoint.api_key is not None:
        return f"the API key from {endpoint.key_ref or 'the environment'}"
    if endpoint.key_ref:
        return f"no key reached the process, {endpoint.key_ref} is empty or unset"
    return "no key is configured, set the endpoint's apiKeySecret"


def _unauthorized(said: str, endpoint: settings.Endpoint) -> str:
    key = endpoint.api_key
    if key is None:
        where = (
            f"no API key reached the process ({endpoint.key_ref} is empty or unset)"
            if endpoint.key_ref
            else "no API key is configured (set the endpoint's apiKeySecret)"
        )
    else:
        where = f"{_key_source(endpoint)} was refused"
    stray = " (it does: it starts or ends with whitespace)" if key is not None and key != key.strip() else ""
    double_v1 = " (it does)" if "/v1/v1" in endpoint.base_url.rstrip("/") + "/" else ""
    return (
        f"{said}: {where}; check the key for stray whitespace or newlines{stray} and the base URL for a "
        f"duplicated /v1{double_v1}"
    )


def _unreachable(exc: BaseException, endpoint: settings.Endpoint) -> str:
    chain = _chain(exc)
    if any(isinstance(e, openai.APITimeoutError | TimeoutError) for e in chain):
        return (
            f"no complete answer from {endpoint.host_port()} within timeoutSeconds ({endpoint.timeout:g} s), "
            "the deadline of each whole attempt (connect, send, read the answer to its end): the server "
            "hangs, sends its answer too slowly, or needs longer (then raise timeoutSeconds)"
        )
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or _says(chain, "All connection attempts"):
        why = "connection refused (nothing listens there)"
    elif any(isinstance(e, socket.gaierror) for e in chain) or _says(chain, "Name or service", "resolution"):
        why = "the host name does not resolve (DNS)"
    elif any("proxy" in type(e).__name__.lower() or "proxy" in str(e).lower() for e in chain):
        why = f"the proxy failed ({chain[-1]})"
    else:
        why = f"{type(chain[-1]).__name__}: {chain[-1]}"
    return f"cannot reach {endpoint.host_port()}: {why}"


def _refused_header(exc: BaseException, endpoint: settings.Endpoint) -> bool:
    """The HTTP library refused to send the key (a newline or other control character in it)."""
    key = endpoint.api_key
    if key is None or key.isprintable():
        return False
    return any("header" in str(e).lower() for e in _chain(exc))


def _says(chain: Sequence[BaseException], *phrases: str) -> bool:
    return any(p in str(e) for e in chain for p in phrases)


def _chain(exc: BaseException) -> list[BaseException]:
    """exc and its causes, outermost first (cycles cut)."""
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in out:
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


def _text(exc: openai.APIStatusError) -> str:
    try:
        return exc.response.text
    except Exception:  # a streamed body that was not read
        return str(exc.body or exc.message)
