"""The endpoints room without a server: token bucket on a fake clock, back-off bounds, the classification
of the openai SDK's exceptions, keys kept out of messages, settings from a job spec, health, the runner,
the termination message. Real servers: tests/dataplane/test_endpoints.py."""

from __future__ import annotations

import asyncio
import pathlib
import random
import time

import httpx2 as httpx  # the HTTP library under openai's SDK
import openai
import pytest
from asyncrl_api import models
from asyncrl_testing import jobs
from asyncrl_workloads import termination
from asyncrl_workloads.endpoints import bucket, client, errors, health, runner, settings

KEY = "sk-test-5ecret"
URL = "http://judge.models.svc:8000/v1"


def endpoint(**kw: object) -> settings.Endpoint:
    base: dict[str, object] = {
        "name": "judge",
        "base_url": URL,
        "model": "tiny",
        "api_key": KEY,
        "key_ref": "Secret judge-key key apiKey",
    }
    return settings.Endpoint(**{**base, **kw})  # type: ignore[arg-type]


# --- token bucket ---------------------------------------------------------------------------------------


def max_in_window(times: list[float], width: float) -> int:
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] < t - width + 1e-12:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


@pytest.mark.parametrize(("rps", "burst"), [(5.0, 1), (10.0, 4), (2.5, 7)])
def test_bucket_grants_never_exceed_burst_plus_rate_in_any_window(rps: float, burst: int) -> None:
    now = [0.0]
    tb = bucket.TokenBucket(rps, burst, clock=lambda: now[0])
    rng = random.Random(0)
    grants: list[float] = []
    for _ in range(400):  # bursts of arrivals and idle gaps
        now[0] += rng.choice([0.0, 0.0, 0.0, rng.random() * 0.2, rng.random() * 3])
        grants.append(now[0] + tb.reserve())
    for width in (0.05, 1 / rps, burst / rps, 1.0, 5.0, 30.0):
        assert max_in_window(grants, width) <= burst + rps * width + 1e-9
    assert max_in_window(grants, 1e-9) <= burst  # the burst passes at once, no more


def test_bucket_serves_a_full_bucket_at_once_then_the_rate() -> None:
    now = [100.0]
    tb = bucket.TokenBucket(4.0, 3, clock=lambda: now[0])
    assert [tb.reserve() for _ in range(5)] == [0.0, 0.0, 0.0, 0.25, 0.5]
    now[0] += 10.0  # idle: refills to burst, never above
    assert [tb.reserve() for _ in range(4)] == [0.0, 0.0, 0.0, 0.25]


def test_bucket_acquire_sleeps_for_its_reservation_and_reports_it() -> None:
    now = [0.0]
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    tb = bucket.TokenBucket(2.0, 1, clock=lambda: now[0], sleep=sleep)
    waits = asyncio.run(_acquire_n(tb, 3))
    assert waits == [0.0, 0.5, 1.0] and slept == [0.5, 1.0]


async def _acquire_n(tb: bucket.TokenBucket, n: int) -> list[float]:
    return list(await asyncio.gather(*(tb.acquire() for _ in range(n))))


def test_bucket_refuses_a_rate_of_zero() -> None:
    with pytest.raises(ValueError):
        bucket.TokenBucket(0.0, 1)


# --- back-off -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "ceiling"), [(0, 0.5), (1, 1.0), (3, 4.0), (5, 16.0), (6, 30.0), (20, 30.0)]
)
def test_backoff_is_full_jitter_under_an_exponential_ceiling(attempt: int, ceiling: float) -> None:
    assert client.backoff(attempt, None, rng=lambda: 0.0) == 0.0
    assert client.backoff(attempt, None, rng=lambda: 0.999999) == pytest.approx(ceiling, rel=1e-5)
    samples = [client.backoff(attempt, None) for _ in range(200)]
    assert all(0.0 <= s <= ceiling for s in samples)


def test_backoff_honours_retry_after() -> None:
    assert client.backoff(0, 7.0, rng=lambda: 0.1) == 7.0


# --- classification -------------------------------------------------------------------------------------

REQUEST = httpx.Request("POST", URL + "/chat/completions")


def status_error(code: int, body: str = '{"error":"x"}', headers: dict[str, str] | None = None) -> Exception:
    response = httpx.Response(code, request=REQUEST, text=body, headers=headers or {})
    cls = {
        400: openai.BadRequestError,
        401: openai.AuthenticationError,
        403: openai.PermissionDeniedError,
        404: openai.NotFoundError,
        413: openai.APIStatusError,
        422: openai.UnprocessableEntityError,
        429: openai.RateLimitError,
        500: openai.InternalServerError,
        503: openai.InternalServerError,
    }[code]
    return cls(f"Error code: {code}", response=response, body=None)


def chained(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "kind", "status", "retryable"),
    [
        (status_error(401), "Unauthorized", 401, False),
        (status_error(403), "Unauthorized", 403, False),
        (status_error(404), "NotFound", 404, False),
        (status_error(429), "RateLimited", 429, True),
        (status_error(500), "ServerError", 500, True),
        (status_error(503), "ServerError", 503, True),
        (status_error(400), "BadRequest", 400, False),
        (status_error(413), "BadRequest", 413, False),
        (status_error(422), "BadRequest", 422, False),
        (openai.APIConnectionError(request=REQUEST), "Unreachable", None, True),
        (openai.APITimeoutError(request=REQUEST), "Unreachable", None, True),
        (
            openai.APIResponseValidationError(httpx.Response(200, request=REQUEST), None),
            "BadResponse",
            None,
            False,
        ),
        (ConnectionRefusedError(111, "Connection refused"), "Unreachable", None, True),
    ],
)
def test_classify_maps_sdk_exceptions_to_kinds(
    exc: Exception, kind: str, status: int | None, retryable: bool
) -> None:
    err = errors.classify(exc, endpoint())
    assert (err.kind, err.status, err.retryable) == (kind, status, retryable)
    assert err.line().startswith(f"{kind}: judge endpoint {URL}: ")
    assert err.code() == (str(status) if status is not None else kind)


def test_unauthorized_names_the_secret_and_the_usual_mistakes() -> None:
    err = errors.classify(status_error(401), endpoint())
    assert "Secret judge-key key apiKey" in err.message
    assert "whitespace" in err.message and "/v1" in err.message
    no_key = errors.classify(status_error(401), endpoint(api_key=None, key_ref=None))
    assert "no API key is configured" in no_key.message


def test_a_key_with_a_newline_that_httpx_refuses_to_send_is_unauthorized_without_the_key() -> None:
    ep = endpoint(api_key=KEY + "\n")
    refused = httpx.LocalProtocolError(f"Illegal header value b'Bearer {KEY}\\n'")
    err = errors.classify(chained(openai.APIConnectionError(request=REQUEST), refused), ep)
    assert err.kind == "Unauthorized" and err.status is None and not err.retryable
    assert "it does: it starts or ends with whitespace" in err.message
    assert KEY not in err.line()


def test_unreachable_names_host_and_port_and_the_cause() -> None:
    refused = chained(
        openai.APIConnectionError(request=REQUEST), httpx.ConnectError("All connection attempts failed")
    )
    err = errors.classify(refused, endpoint())
    assert "judge.models.svc:8000" in err.message and "refused" in err.message
    timeout = errors.classify(openai.APITimeoutError(request=REQUEST), endpoint(timeout=7.0))
    assert "no complete answer from judge.models.svc:8000 within timeoutSeconds (7 s)" in timeout.message
    deadline = errors.classify(TimeoutError(), endpoint(timeout=3.0))  # asyncio.timeout's, in Client._call
    assert (deadline.kind, deadline.retryable) == ("Unreachable", True)
    assert "timeoutSeconds (3 s)" in deadline.message
    https = errors.classify(
        openai.APIConnectionError(request=REQUEST), endpoint(base_url="https://x.example/v1")
    )
    assert "x.example:443" in https.message


def test_not_found_lists_the_served_models() -> None:
    err = errors.classify(status_error(404), endpoint(), served_models=["tiny-a", "tiny-b"])
    assert "'tiny'" in err.message and "tiny-a, tiny-b" in err.message


def test_rate_limited_keeps_retry_after() -> None:
    err = errors.classify(status_error(429, headers={"Retry-After": "2.5"}), endpoint())
    assert err.retry_after == 2.5
    assert errors.classify(status_error(429, headers={"Retry-After": "soon"}), endpoint()).retry_after is None


def test_bad_response_quotes_the_first_200_characters() -> None:
    body = "<html>" + "x" * 500
    err = errors.bad_response(endpoint(), body, "the answer is not JSON")
    assert err.kind == "BadResponse" and err.code() == "BadResponse"
    assert ("<html>" + "x" * 194) in err.message and "x" * 195 not in err.message


def redirect_error(
    code: int, history: list[httpx.Response], headers: dict[str, str] | None = None
) -> Exception:
    response = httpx.Response(code, request=REQUEST, headers=headers or {}, history=history, text="<html>")
    return openai.APIStatusError(f"Error code: {code}", response=response, body=None)


LOGIN = "https://sso.example.com/login?rd=%2Fv1%2Fchat%2Fcompletions"


def test_a_redirect_is_unauthorized_naming_where_it_went_and_the_bearer_key() -> None:
    seen = errors.classify(redirect_error(302, [], {"Location": LOGIN}), endpoint())
    assert (seen.kind, seen.status, seen.retryable) == ("Unauthorized", 302, False)
    assert seen.message.startswith(f"the endpoint redirected the request (HTTP 302) to {LOGIN} instead")
    assert "Bearer API key (here: the API key from Secret judge-key key apiKey)" in seen.message
    assert "SSO/OAuth" in seen.message
    hop = httpx.Response(302, request=REQUEST, headers={"Location": LOGIN})
    followed = errors.classify(redirect_error(401, [hop]), endpoint(api_key=None, key_ref=None))
    assert (followed.kind, followed.status) == ("Unauthorized", 302)  # the login page's own 401
    assert "(HTTP 302) to " + URL in followed.message and "which answered HTTP 401" in followed.message
    assert "no key is configured" in followed.message
    assert errors.classify(redirect_error(503, [hop]), endpoint()).kind == "ServerError"  # its own class


@pytest.mark.parametrize(
    ("body", "said", "kind"),
    [
        (
            '{"error": {"message": "upstream provider overloaded", "type": "server_error", "code": 502}}',
            "the endpoint answered an error: upstream provider overloaded (code 502, type server_error); ",
            "ServerError",  # as the 502 it stands for: retried
        ),
        (
            '{"error": {"message": "slow down", "type": "rate_limit_exceeded"}}',
            "the endpoint answered an error: slow down (type rate_limit_exceeded); ",
            "RateLimited",
        ),
        (
            '{"error": {"message": "no", "code": 429}}',
            "the endpoint answered an error: no (code 429); ",
            "RateLimited",
        ),
        ('{"error": "quota exceeded"}', "the endpoint answered an error: quota exceeded; ", "BadResponse"),
        ('{"error": {"code": 7}}', 'the endpoint answered an error: {"code": 7}; ', "BadResponse"),
        ('{"id": "x"}', "the answer has no choices[0]; ", "BadResponse"),
    ],
)
def test_an_error_object_in_place_of_choices_is_quoted_first_and_classed_by_what_it_says(
    body: str, said: str, kind: str
) -> None:
    with pytest.raises(errors.EndpointError) as info:
        client.Client(endpoint())._choice(body)
    assert info.value.kind == kind and info.value.retryable == (kind != "BadResponse")
    assert info.value.message.startswith(said) and repr(body) in info.value.message


@pytest.mark.parametrize("key", [KEY, KEY + "\n", " " + KEY])
@pytest.mark.parametrize("code", [400, 401, 403, 404, 429, 500])
def test_messages_never_contain_the_key(key: str, code: int) -> None:
    echo = f'{{"error":"bad key {key.strip()}"}}'  # a server that echoes the key back
    err = errors.classify(status_error(code, body=echo), endpoint(api_key=key), served_models=[key])
    assert key.strip() not in err.line() and key.strip() not in str(err)


# --- settings -------------------------------------------------------------------------------------------


def parse_spec(body: dict[str, object]) -> models.AsyncRLJobSpec:
    return models.AsyncRLJobSpec.model_validate(body["spec"])


def test_judge_settings_from_a_job_spec() -> None:
    spec = parse_spec(
        jobs.make_job(
            data={"prompts": "/data/p.jsonl"},
            reward={
                "type": "judge",
                "endpoint": {
                    "baseURL": URL,
                    "model": "judge-7b",
                    "apiKeySecret": {"name": "jk"},
                    "maxRetries": 2,
                    "giveUpAfterSeconds": 60,
                },
                "rateLimit": {"rps": 3, "burst": 6},
            },
        )
    )
    ep = settings.judge(spec, env={settings.JUDGE_API_KEY_ENV: KEY + "\n"})
    assert (ep.name, ep.model, ep.max_retries, ep.give_up_after, ep.rps, ep.burst) == (
        "judge",
        "judge-7b",
        2,
        60,
        3,
        6,
    )
    assert ep.api_key == KEY + "\n"  # kept as is: the 401 message points at the newline
    assert ep.key_ref == "Secret jk key apiKey" and KEY not in repr(ep)
    with pytest.raises(ValueError):
        settings.teacher(spec)


def test_teacher_without_rate_limit_has_no_bucket() -> None:
    spec = parse_spec(jobs.make_job(teacher={"endpoint": {"baseURL": URL, "model": "t"}}))
    ep = settings.teacher(spec, env={})
    assert ep.rps is None and ep.api_key is None and ep.key_ref is None
    assert client.Client(ep).bucket is None


# --- health ---------------------------------------------------------------------------------------------


def test_health_counts_from_the_first_failure_after_the_last_success() -> None:
    h = health.Health(give_up_after=10.0)
    err = errors.classify(status_error(503), endpoint())
    assert h.failing_for(5.0) == 0.0
    h.failed(err, 100.0)
    h.failed(err, 104.0)
    assert h.failing_for(108.0) == 8.0 and h.gave_up(108.0) is None
    assert h.gave_up(110.5) is err
    h.succeeded(111.0)
    assert h.failing_for(200.0) == 0.0 and h.gave_up(200.0) is None
    h.failed(errors.classify(status_error(400), endpoint()), 300.0)  # one bad request: not the endpoint
    assert h.failing_for(400.0) == 0.0


def test_a_failing_spell_starts_when_its_first_failed_attempt_started() -> None:
    h = health.Health(give_up_after=10.0)
    err = errors.classify(openai.APITimeoutError(request=REQUEST), endpoint())
    h.failed(err, started=100.0)  # an attempt that hung from 100 to its deadline, reported at 160
    assert h.failing_for(160.0) == 60.0 and h.gave_up(160.0) is err
    h.failed(err, started=90.0)  # an earlier attempt ending later: the spell began at its start
    assert h.failing_for(160.0) == 70.0
    h.succeeded(170.0)
    h.failed(err, started=165.0)  # began before that success ended: the spell starts at the success
    assert h.failing_for(175.0) == 5.0 and h.gave_up(175.0) is None


# --- the deadline and the give-up in Client._call ---------------------------------------------------------


def test_an_attempt_that_never_completes_fails_at_its_deadline_and_retries_stop_at_the_give_up() -> None:
    ep = endpoint(timeout=0.2, max_retries=20, give_up_after=1.5)  # back-off sleeps < 0.5 s at first
    sends: list[float] = []

    async def never(sdk: object) -> object:  # a send whose answer never ends (a dripping server)
        sends.append(time.monotonic())
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def call() -> errors.EndpointError:
        c = client.Client(ep)
        try:
            with pytest.raises(errors.EndpointError) as info:
                await c._call(never, str)
            assert c.gave_up() is info.value  # the process would exit now
            return info.value
        finally:
            await c.close()

    start = time.monotonic()
    err = asyncio.run(call())
    took = time.monotonic() - start
    assert err.kind == "Unreachable" and "timeoutSeconds (0.2 s)" in err.message
    assert 2 <= len(sends) < 21  # retried, then stopped long before maxRetries
    assert 1.5 < took < 1.5 + 0.2 + 5.0  # giveUpAfterSeconds + timeoutSeconds, generous for a loaded box
    assert sends[-1] - sends[0] <= 1.5 + 0.5  # no attempt starts once the client has given up


# --- runner ---------------------------------------------------------------------------------------------


def test_runner_runs_coroutines_off_the_callers_loop() -> None:
    r = runner.Runner(name="test")
    r.start()
    try:

        async def where() -> object:
            return asyncio.get_running_loop()

        async def caller() -> tuple[object, object]:
            return await r.run(where()), asyncio.get_running_loop()

        theirs, ours = asyncio.run(caller())
        assert theirs is r.loop and theirs is not ours
        assert r.call(where()) is r.loop

        async def boom() -> None:
            raise errors.classify(status_error(503), endpoint())

        with pytest.raises(errors.EndpointError):
            r.call(boom())
        pending = r.submit(asyncio.sleep(3600))
    finally:
        r.stop()
    assert pending.cancelled()


# --- termination message --------------------------------------------------------------------------------


def test_termination_message_is_one_line_of_at_most_4096_bytes(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "termination-log"
    monkeypatch.setenv(termination.PATH_ENV, str(target))
    termination.write("Unauthorized: judge endpoint http://x/v1: refused")
    assert target.read_text() == "Unauthorized: judge endpoint http://x/v1: refused\n"
    termination.write("é" * 5000)
    data = target.read_bytes()
    assert len(data) <= 4096 and data.endswith(b"\n") and data.decode().startswith("é")


def test_termination_write_never_raises(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv(termination.PATH_ENV, str(tmp_path / "missing-dir" / "log"))
    termination.write("ServerError: teacher endpoint http://x/v1: down")
