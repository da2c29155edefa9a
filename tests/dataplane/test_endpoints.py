"""The endpoints client against real servers: vLLM's own OpenAI server on the tiny chat model (with
``--api-key``; one per module) and a small HTTP server for the faults vLLM will not produce.

Every call runs on an ``endpoints.runner.Runner`` loop, as the judge's and the teacher's do."""

from __future__ import annotations

import asyncio
import json
import pathlib
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asyncrl_testing import fault_server, openai_server, turns
from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.endpoints import client as client_mod
from asyncrl_workloads.endpoints import errors, runner, settings

pytestmark = pytest.mark.dataplane

KEY = "sk-endpoints-test-key"


@pytest.fixture(scope="module")
def vllm(chat_model: pathlib.Path) -> Iterator[openai_server.Server]:
    with openai_server.serve(chat_model, api_key=KEY, name="tiny") as server:
        yield server


@pytest.fixture(scope="module")
def loop() -> Iterator[runner.Runner]:
    r = runner.Runner(name="test-endpoints")
    r.start()
    yield r
    r.stop()


@pytest.fixture
def faults() -> Iterator[fault_server.FaultServer]:
    with fault_server.serve() as fs:
        yield fs


@pytest.fixture
def make(loop: runner.Runner) -> Iterator[Callable[..., client_mod.Client]]:
    """Factory of Clients, closed on the runner's loop after the test."""
    made: list[client_mod.Client] = []

    def build(ep: settings.Endpoint, metrics: metrics_mod.Bound | None = None) -> client_mod.Client:
        made.append(client_mod.Client(ep, metrics))
        return made[-1]

    yield build
    for c in made:
        loop.call(c.close())


def endpoint(base_url: str, **kw: Any) -> settings.Endpoint:
    fields: dict[str, Any] = {
        "name": "judge",
        "base_url": base_url,
        "model": "tiny",
        "api_key": KEY,
        "key_ref": "Secret judge-key key apiKey",
        "timeout": 60.0,  # a first request on a loaded CPU box takes > 10 s (vLLM warms up)
        "max_retries": 0,
        **kw,
    }
    return settings.Endpoint(**fields)


def fails(loop: runner.Runner, client: client_mod.Client) -> errors.EndpointError:
    with pytest.raises(errors.EndpointError) as info:
        loop.call(client.preflight("chat"), timeout=120)
    return info.value


def bound(job: str) -> metrics_mod.Bound:
    return metrics_mod.Bound(metrics_mod.Identity("test", job, "rollout"))


def requests_counted(job: str, code: str) -> float:
    labels = {
        "namespace": "test",
        "job": job,
        "role": "rollout",
        "replica": "0",
        "endpoint": "judge",
        "code": code,
    }
    return metrics_mod.REGISTRY.get_sample_value("asyncrl_endpoint_requests_total", labels) or 0.0


# --- vLLM ------------------------------------------------------------------------------------------------


def test_preflight_passes_for_chat_and_prompt_logprobs(
    make: Callable[..., client_mod.Client], loop: runner.Runner, vllm: openai_server.Server
) -> None:
    client = make(endpoint(vllm.base_url), bound("preflight"))
    loop.call(client.preflight("chat"), timeout=120)
    loop.call(client.preflight("prompt_logprobs"), timeout=120)
    assert requests_counted("preflight", "200") == 2
    assert client.health.failing_for(time.monotonic()) == 0.0


def test_prompt_logprobs_equal_the_models_own(
    make: Callable[..., client_mod.Client],
    loop: runner.Runner,
    vllm: openai_server.Server,
    chat_model: pathlib.Path,
    tokenizer: Any,
) -> None:
    import torch
    import transformers

    ids = tokenizer.encode("the judge reads every word", add_special_tokens=False)
    client = make(endpoint(vllm.base_url))
    got = loop.call(client.prompt_logprobs(ids), timeout=120)
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(chat_model, dtype=torch.float32)
    model.eval()
    want = turns.hf_logprobs(model, ids[:1], ids[1:]).tolist()
    assert len(got) == len(ids) and got[0] is None
    assert got[1:] == pytest.approx(want, abs=1e-4)


def test_wrong_key_is_unauthorized(
    make: Callable[..., client_mod.Client], loop: runner.Runner, vllm: openai_server.Server
) -> None:
    err = fails(loop, make(endpoint(vllm.base_url, api_key="sk-wrong")))
    assert (err.kind, err.status) == ("Unauthorized", 401)
    assert "Secret judge-key key apiKey" in err.message and "sk-wrong" not in err.line()


def test_key_with_a_trailing_newline_is_unauthorized_with_the_whitespace_hint(
    make: Callable[..., client_mod.Client], loop: runner.Runner, vllm: openai_server.Server
) -> None:
    err = fails(loop, make(endpoint(vllm.base_url, api_key=KEY + "\n")))
    assert err.kind == "Unauthorized" and not err.retryable
    assert "it starts or ends with whitespace" in err.message and KEY not in err.line()


def test_wrong_model_is_not_found_listing_the_served_model(
    make: Callable[..., client_mod.Client], loop: runner.Runner, vllm: openai_server.Server
) -> None:
    err = fails(loop, make(endpoint(vllm.base_url, model="judge-70b")))
    assert (err.kind, err.status) == ("NotFound", 404)
    assert "'judge-70b'" in err.message and "serves: tiny" in err.message


# --- transport faults and bad answers --------------------------------------------------------------------


def test_closed_port_is_unreachable_naming_host_and_port(
    make: Callable[..., client_mod.Client], loop: runner.Runner
) -> None:
    from asyncrl_workloads.local import process

    port = process.free_port()  # nothing listens on it once the probe socket closed
    err = fails(loop, make(endpoint(f"http://127.0.0.1:{port}/v1")))
    assert err.kind == "Unreachable" and err.retryable and f"127.0.0.1:{port}" in err.message
    assert "refused" in err.message


@pytest.mark.parametrize(
    ("reply", "quoted"), [(fault_server.NO_CHOICES, '{"id":"x"}'), (fault_server.HTML, "<html><body><h1>502")]
)
def test_answers_without_choices_are_bad_responses_quoting_the_body(
    make: Callable[..., client_mod.Client],
    loop: runner.Runner,
    faults: fault_server.FaultServer,
    reply: fault_server.Reply,
    quoted: str,
) -> None:
    faults.default = reply
    err = fails(loop, make(endpoint(faults.base_url, max_retries=3), bound("bad-response")))
    assert err.kind == "BadResponse" and not err.retryable and quoted in err.message
    assert len(faults.arrivals) == 1 and requests_counted("bad-response", "BadResponse") >= 1


def test_rate_limited_then_ok_waits_retry_after_and_succeeds(
    make: Callable[..., client_mod.Client], loop: runner.Runner, faults: fault_server.FaultServer
) -> None:
    faults.script(fault_server.status(429, retry_after=1.5))
    client = make(endpoint(faults.base_url, max_retries=2), bound("retry-after"))
    assert loop.call(client.chat([{"role": "user", "content": "hi"}], max_tokens=4, temperature=0.0)) == "7"
    first, second = faults.arrivals
    assert second - first >= 1.5
    assert requests_counted("retry-after", "429") == 1 and requests_counted("retry-after", "200") == 1


def test_persistent_503_is_a_server_error_after_every_retry(
    make: Callable[..., client_mod.Client], loop: runner.Runner, faults: fault_server.FaultServer
) -> None:
    faults.default = fault_server.status(503)
    err = fails(loop, make(endpoint(faults.base_url, max_retries=3), bound("server-error")))
    assert (err.kind, err.status) == ("ServerError", 503)
    assert len(faults.arrivals) == 4 and requests_counted("server-error", "503") == 4


def test_a_hanging_server_is_unreachable_by_timeout(
    make: Callable[..., client_mod.Client], loop: runner.Runner, faults: fault_server.FaultServer
) -> None:
    faults.default = fault_server.HANG
    timeout, retries = 1.0, 1
    start = time.monotonic()
    err = fails(loop, make(endpoint(faults.base_url, timeout=timeout, max_retries=retries)))
    took = time.monotonic() - start
    assert err.kind == "Unreachable" and "timeout" in err.message
    assert len(faults.arrivals) == retries + 1
    assert took < timeout * (retries + 1) + client_mod.BACKOFF_BASE_SECONDS + 2.0


def test_a_dripping_server_is_unreachable_at_the_deadline_of_each_whole_attempt(
    make: Callable[..., client_mod.Client], loop: runner.Runner, faults: fault_server.FaultServer
) -> None:
    faults.default = fault_server.DRIP  # a byte a second: no read waits long, the answer never ends
    body_seconds = len(json.dumps(fault_server.completion("7")))  # ~230 s to send it all
    timeout, retries = 2.0, 1
    start = time.monotonic()
    err = fails(loop, make(endpoint(faults.base_url, timeout=timeout, max_retries=retries), bound("drip")))
    took = time.monotonic() - start
    assert err.kind == "Unreachable" and err.retryable and "timeoutSeconds (2 s)" in err.message
    assert len(faults.arrivals) == retries + 1 and requests_counted("drip", "Unreachable") == retries + 1
    assert took < timeout * (retries + 1) + client_mod.BACKOFF_BASE_SECONDS + 10.0 < body_seconds


def test_a_dripping_server_is_given_up_on_within_give_up_plus_timeout(
    make: Callable[..., client_mod.Client], loop: runner.Runner, faults: fault_server.FaultServer
) -> None:
    faults.default = fault_server.DRIP
    timeout, give_up = 1.5, 2.5  # the first back-off sleeps < 0.5 s: at least one retry before the give-up
    client = make(endpoint(faults.base_url, timeout=timeout, max_retries=20, give_up_after=give_up))
    start = time.monotonic()
    err = fails(loop, client)
    took = time.monotonic() - start
    assert err.kind == "Unreachable" and client.gave_up() is err  # the rollout or trainer exits with it
    assert 2 <= len(faults.arrivals) < 21  # retried, then stopped at the give-up, not at maxRetries
    assert give_up < took < give_up + timeout + 5.0


def test_a_redirect_to_a_login_page_is_unauthorized_naming_it(
    make: Callable[..., client_mod.Client], loop: runner.Runner, faults: fault_server.FaultServer
) -> None:
    faults.default = fault_server.redirect(faults.login_url)  # the SDK follows it to a 200 HTML page
    err = fails(loop, make(endpoint(faults.base_url, max_retries=3), bound("redirect")))
    assert (err.kind, err.status, err.retryable) == ("Unauthorized", 302, False)
    assert f"redirected the request (HTTP 302) to {faults.login_url} (which answered HTTP 200)" in err.message
    assert "Bearer API key (here: the API key from Secret judge-key key apiKey)" in err.message
    assert len(faults.arrivals) == 1 and requests_counted("redirect", "302") == 1


def test_an_error_object_answered_with_200_is_quoted_first_and_retried_when_it_says_overloaded(
    make: Callable[..., client_mod.Client], loop: runner.Runner, faults: fault_server.FaultServer
) -> None:
    faults.default = fault_server.answered_error("quota exceeded")  # says nothing retryable
    err = fails(loop, make(endpoint(faults.base_url)))
    assert (err.kind, err.retryable) == ("BadResponse", False) and len(faults.arrivals) == 1
    assert err.message.startswith("the endpoint answered an error: quota exceeded")
    overloaded = fault_server.answered_error({"message": "upstream provider overloaded", "code": 502})
    faults.default = fault_server.OK
    faults.script(overloaded)  # a 502 in the body: ServerError, retried, and the next answer is used
    loop.call(make(endpoint(faults.base_url, max_retries=2)).preflight("chat"), timeout=120)
    assert len(faults.arrivals) == 3
    faults.default = overloaded
    err = fails(loop, make(endpoint(faults.base_url, max_retries=1)))
    assert (err.kind, err.retryable) == ("ServerError", True)
    assert err.message.startswith("the endpoint answered an error: upstream provider overloaded (code 502)")


@pytest.mark.parametrize(("rps", "burst"), [(20.0, 4), (8.0, 1)])
def test_rate_limit_holds_at_the_server(
    make: Callable[..., client_mod.Client],
    loop: runner.Runner,
    faults: fault_server.FaultServer,
    rps: float,
    burst: int,
) -> None:
    client = make(
        endpoint(faults.base_url, rps=rps, burst=burst, max_concurrency=64), bound(f"bucket-{burst}")
    )

    async def fire(n: int) -> list[str]:
        calls = (
            client.chat([{"role": "user", "content": "hi"}], max_tokens=1, temperature=0.0) for _ in range(n)
        )
        return list(await asyncio.gather(*calls))

    # Warm up as a job's preflight does: the SDK's lazily imported resources and `burst` pooled
    # connections are ready, so the first granted sends are not held back and then bunched with later ones.
    loop.call(fire(burst), timeout=60)
    time.sleep(burst / rps + 0.05)  # the bucket is full again
    faults.arrivals.clear()
    start = time.monotonic()
    assert loop.call(fire(3 * burst), timeout=60) == ["7"] * (3 * burst)
    assert time.monotonic() - start >= 2 * burst / rps  # the bucket made them wait: 2b tokens at r/s
    times = sorted(faults.arrivals)
    for width in (0.5 / rps, 1.0 / rps, burst / rps, 2 * burst / rps, 0.5):
        busiest = max(sum(1 for t in times if s <= t < s + width) for s in times)
        assert busiest <= burst + rps * width + 1, (width, busiest)
    labels = {
        "namespace": "test",
        "job": f"bucket-{burst}",
        "role": "rollout",
        "replica": "0",
        "endpoint": "judge",
    }
    waited = metrics_mod.REGISTRY.get_sample_value("asyncrl_endpoint_ratelimit_wait_seconds_total", labels)
    assert waited is not None and waited > 0


def test_give_up_after_failing_for_long_enough(
    make: Callable[..., client_mod.Client], loop: runner.Runner, faults: fault_server.FaultServer
) -> None:
    faults.default = fault_server.status(503)
    client = make(endpoint(faults.base_url, give_up_after=0.6))
    fails(loop, client)
    assert client.gave_up() is None
    time.sleep(0.3)
    fails(loop, client)
    first = client.health.failing_for(time.monotonic())
    assert first >= 0.3 and client.gave_up() is None
    time.sleep(0.4)
    given_up = client.gave_up()
    assert client.health.failing_for(time.monotonic()) > first
    assert given_up is not None and given_up.kind == "ServerError"
    assert given_up.line().startswith(f"ServerError: judge endpoint {faults.base_url}: ")
    faults.default = fault_server.OK  # the endpoint recovers: the spell ends
    loop.call(client.preflight("chat"))
    assert client.health.failing_for(time.monotonic()) == 0.0 and client.gave_up() is None


def test_random_token_ids_come_back_in_order(
    make: Callable[..., client_mod.Client], loop: runner.Runner, vllm: openai_server.Server, tokenizer: Any
) -> None:
    ids = random.Random(0).sample(range(tokenizer.vocab_size), 12)
    got = loop.call(make(endpoint(vllm.base_url)).prompt_logprobs(ids), timeout=120)
    assert len(got) == 12 and got[0] is None and all(g is not None and g <= 0.0 for g in got[1:])
