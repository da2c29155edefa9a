"""The one client for OpenAI-compatible endpoints: the judge's chat, the teacher's prompt logprobs.

Called by ``rewards/scorer.py`` (``chat``, ``preflight("chat")``) and the trainer's teacher
(``prompt_logprobs``, ``preflight("prompt_logprobs")``), always on a ``runner.Runner`` loop: the client,
its HTTP connections and its semaphore belong to the loop they were first used on, and the callers' own
loop (vLLM's engine loop in a rollout) must never wait on network I/O.

Every call, per attempt:

    semaphore (maxConcurrency) -> token bucket (rateLimit)
    -> openai SDK request and the whole answer read, under one deadline (timeoutSeconds)
    -> answer parsed, or the failure classified (errors.classify)
    -> metrics (requests{endpoint, code}, latency, bucket wait) and health
    -> a retryable failure (RateLimited, Unreachable, ServerError) sleeps and tries again, up to
       maxRetries, unless the client has given up (``gave_up``): then the last error is raised

The deadline is the attempt's total (``asyncio.timeout`` around the send and the body read): the HTTP
library's own timeout bounds each read, so a server that sends a byte every second would never trip it
and hold the call, and the process, forever. It does not cover the semaphore and bucket waits before the
send (they are ours, not the endpoint's). A hung attempt that ends at its deadline counts as failing from
its start (``health``), and no retry starts once the client has given up, so a process whose endpoint
fails exits within about giveUpAfterSeconds + timeoutSeconds of the first failure.

The bucket is taken after the concurrency slot, right before sending: taken before it, the tokens of
requests queued behind a full semaphore would be spent while they wait and then sent together when slots
free, faster than the rate the bucket promises the server. A back-off sleep holds no slot.

The SDK runs with ``max_retries=0``: its own retries would hide attempts from the metrics and the bucket,
ignore our cap and jitter, and count time we cannot see. Back-off is full jitter, uniform(0, min(30 s,
0.5 s * 2**attempt)) (the AWS "exponential back-off and jitter" scheme), or the server's Retry-After in
seconds when it sends one. Answers are read as raw JSON rather than the SDK's models, so that an answer
without ``choices[0]`` is quoted in the BadResponse message exactly as it came (after the message of an
error object sent in its place). The SDK follows redirects; an unusable answer that came through one
(a login page) is classified as ``errors.redirected``, not as a bad answer.

An endpoint without a key gets a placeholder the SDK accepts (servers without auth ignore it).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, TypeVar

import openai

from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.endpoints import bucket as bucket_mod
from asyncrl_workloads.endpoints import errors, health, settings

T = TypeVar("T")
NO_KEY = "no-key"
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_CAP_SECONDS = 30.0
MODELS_TIMEOUT_SECONDS = 5.0
PING: list[dict[str, Any]] = [{"role": "user", "content": "ping"}]
PING_TOKEN_IDS = (0, 1)
"""The preflight's prompt for prompt logprobs: two ids every vocabulary has."""


def backoff(attempt: int, retry_after: float | None, rng: Callable[[], float] = random.random) -> float:
    """Seconds to sleep before retry ``attempt + 1`` (attempt 0 is the first try)."""
    if retry_after is not None:
        return retry_after
    return rng() * min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2.0**attempt)


class Client:
    """Calls to one endpoint; ``metrics`` (optional) needs ``endpoint.name`` in metrics.ENDPOINT_NAMES."""

    def __init__(
        self,
        endpoint: settings.Endpoint,
        metrics: metrics_mod.Bound | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint, self.metrics, self.clock = endpoint, metrics, clock
        self.health = health.Health(endpoint.give_up_after)
        self.bucket = bucket_mod.TokenBucket(endpoint.rps, endpoint.burst) if endpoint.rps else None
        self._slots = asyncio.Semaphore(endpoint.max_concurrency)
        self._sdk: openai.AsyncOpenAI | None = None
        self._served: list[str] | None = None

    def sdk(self) -> openai.AsyncOpenAI:
        if self._sdk is None:
            self._sdk = openai.AsyncOpenAI(
                base_url=self.endpoint.base_url,
                api_key=self.endpoint.api_key or NO_KEY,
                max_retries=0,
                timeout=self.endpoint.timeout,
            )
        return self._sdk

    async def close(self) -> None:
        if self._sdk is not None:
            await self._sdk.close()
            self._sdk = None

    def gave_up(self, now: float | None = None) -> errors.EndpointError | None:
        """The last error once every attempt has failed for longer than giveUpAfterSeconds, else None."""
        return self.health.gave_up(self.clock() if now is None else now)

    async def preflight(self, kind: Literal["chat", "prompt_logprobs"]) -> None:
        """The one-token check; raises EndpointError when the endpoint cannot serve ``kind``."""
        if kind == "chat":
            await self.chat(PING, max_tokens=1, temperature=0.0)
        else:
            await self.prompt_logprobs(PING_TOKEN_IDS)

    async def chat(self, messages: Sequence[dict[str, Any]], *, max_tokens: int, temperature: float) -> str:
        """choices[0].message.content of a chat completion ("" when the server sent null)."""

        async def send(sdk: openai.AsyncOpenAI) -> Any:
            return await sdk.chat.completions.with_raw_response.create(
                model=self.endpoint.model,
                messages=list(messages),  # type: ignore[arg-type]
                max_tokens=max_tokens,
                temperature=temperature,
            )

        return await self._call(send, self._chat_content)

    async def prompt_logprobs(self, token_ids: Sequence[int]) -> list[float | None]:
        """log p(token_ids[i] | token_ids[:i]) for every i; the first is None (nothing conditions it)."""
        ids = list(token_ids)

        async def send(sdk: openai.AsyncOpenAI) -> Any:
            return await sdk.completions.with_raw_response.create(
                model=self.endpoint.model,
                prompt=ids,
                max_tokens=1,
                extra_body={"prompt_logprobs": 0, "return_token_ids": True},
            )

        return await self._call(send, lambda text: self._logprobs(text, ids))

    async def _call(
        self, send: Callable[[openai.AsyncOpenAI], Awaitable[Any]], parse: Callable[[str], T]
    ) -> T:
        attempt = 0
        sdk = self.sdk()  # made before the bucket: its setup (an SSL context) must not delay a granted send
        while True:
            async with self._slots:
                waited = await self.bucket.acquire() if self.bucket is not None else 0.0
                start = self.clock()
                try:
                    async with asyncio.timeout(self.endpoint.timeout):  # the whole attempt: see above
                        raw = await send(sdk)
                        await raw.http_response.aread()  # read already (not streamed): a no-op then
                    value = self._parse(raw.http_response, parse)
                except (openai.OpenAIError, errors.EndpointError, TimeoutError) as exc:  # else a bug: raised
                    err = await self._classify(exc)
                    self._count(err.code(), start, waited)
                    self.health.failed(err, start)
                else:
                    self._count(str(raw.status_code), start, waited)
                    self.health.succeeded(self.clock())
                    return value
            if not err.retryable or attempt >= self.endpoint.max_retries or self.gave_up() is not None:
                raise err
            await asyncio.sleep(min(backoff(attempt, err.retry_after), self.endpoint.give_up_after))
            if self.gave_up() is not None:  # gave up while sleeping: no attempt that could last timeout
                raise err
            attempt += 1

    def _parse(self, response: Any, parse: Callable[[str], T]) -> T:
        """``parse`` of the answer's text; an unusable answer reached through redirects is a redirect."""
        try:
            return parse(response.text)
        except errors.EndpointError:
            if response.history:
                raise errors.redirected(self.endpoint, response) from None
            raise

    async def _classify(self, exc: BaseException) -> errors.EndpointError:
        served = None
        if isinstance(exc, openai.NotFoundError):
            served = await self._served_models()
        return errors.classify(exc, self.endpoint, served_models=served)

    async def _served_models(self) -> list[str] | None:
        """GET {base}/models, best effort (once a list came, it is kept)."""
        if self._served is None:
            try:
                if self.bucket is not None:
                    await self.bucket.acquire()
                async with asyncio.timeout(MODELS_TIMEOUT_SECONDS):
                    page = await self.sdk().with_options(timeout=MODELS_TIMEOUT_SECONDS).models.list()
                self._served = [m.id for m in page.data]
            except Exception:  # a base URL that serves nothing; the 404 message says so
                return None
        return self._served

    def _count(self, code: str, start: float, waited: float) -> None:
        if self.metrics is None:
            return
        name = self.endpoint.name
        self.metrics.endpoint_requests_by(name, code).inc()
        self.metrics.endpoint_latency[name].observe(self.clock() - start)
        if waited > 0:
            self.metrics.endpoint_ratelimit_wait[name].inc(waited)

    def _choice(self, text: str) -> dict[str, Any]:
        """choices[0] of a JSON answer (BadResponse: not JSON, an error object, or no choices[0])."""
        try:
            data = json.loads(text)
        except ValueError:
            raise errors.bad_response(self.endpoint, text, "the answer is not JSON") from None
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            if isinstance(data, dict) and data.get("error"):
                raise errors.answered_error(self.endpoint, text, data["error"])
            raise errors.bad_response(self.endpoint, text, "the answer has no choices[0]")
        return choices[0]

    def _chat_content(self, text: str) -> str:
        message = self._choice(text).get("message")
        if not isinstance(message, dict):
            raise errors.bad_response(self.endpoint, text, "the answer has no choices[0].message")
        content = message.get("content")
        return content if isinstance(content, str) else ""

    def _logprobs(self, text: str, ids: list[int]) -> list[float | None]:
        choice = self._choice(text)
        rows = choice.get("prompt_logprobs")
        if not isinstance(rows, list):
            why = "the answer has no choices[0].prompt_logprobs: the teacher must be a vLLM server"
            why += " (prompt_logprobs)"
            raise errors.bad_response(self.endpoint, text, why)
        echoed = choice.get("prompt_token_ids")
        if echoed is not None and echoed != ids:
            why = f"the server changed the prompt's token ids (sent {len(ids)}, it read {len(echoed)})"
            raise errors.bad_response(self.endpoint, text, why)
        if len(rows) != len(ids):
            why = f"prompt_logprobs has {len(rows)} entries for {len(ids)} prompt tokens"
            raise errors.bad_response(self.endpoint, text, why)
        out: list[float | None] = [None]
        for i in range(1, len(ids)):
            entry = rows[i].get(str(ids[i])) if isinstance(rows[i], dict) else None
            if not isinstance(entry, dict) or not isinstance(entry.get("logprob"), int | float):
                raise errors.bad_response(self.endpoint, text, f"prompt_logprobs[{i}] lacks token {ids[i]}")
            out.append(float(entry["logprob"]))
        return out
