"""Admission across gateway replicas (gateway/http.py ``GatewayApp._forward``, gateway/service.py
``Gateway.peers``) on real sockets: three real GatewayApps served by uvicorn in one event loop, each over a
stand-in worker whose admission is full or free (no engine: opening a group needs none). A replica that
cannot admit a group offers it to its peers; what the agent gets back is the first peer's 200 as it is."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
from asyncrl_workloads import metrics
from asyncrl_workloads.gateway import http, service

KEY = "admin-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
FORWARDED = "asyncrl_gateway_groups_forwarded_total"


class Worker:
    """The part of RolloutWorker the gateway's admission uses; ``free`` groups are admitted."""

    def __init__(self, free: int, members: int) -> None:
        self.free, self.asked = free, 0
        self.admission = types.SimpleNamespace(members=members)

    def start_group(
        self, produce: Callable[[], Awaitable[Any]], record: Mapping[str, Any] | None, *, from_data: bool
    ) -> tuple[int, Mapping[str, Any] | None] | None:
        del produce, from_data
        self.asked += 1
        if self.free <= 0:
            return None
        self.free -= 1
        return self.asked, record

    def group_id(self, index: int) -> str:
        return f"g{index}"

    async def abort_generating(self) -> None:
        return None


class Chat:
    def messages(self, record: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": str(record.get("prompt"))}]


def replica_app(
    name: str, ordinal: int, url: str, peer_url: str, worker: Worker, timeout_s: float = 2.0
) -> http.GatewayApp:
    settings = service.GatewaySettings(
        public_url=url, model_name="m", max_model_len=64, max_tokens=8, replica=ordinal, peer_url=peer_url
    )
    bound = metrics.bind(metrics.Identity("forwarding", name, "rollout", str(ordinal)))
    parser = types.SimpleNamespace(tokenizer=None)
    engine = types.SimpleNamespace(version=0)
    gateway = service.Gateway(settings, engine, Chat(), parser, worker, bound)  # type: ignore[arg-type]
    return http.GatewayApp(gateway, KEY, 1 << 20, forward_timeout_s=timeout_s)


def forwarded(name: str, ordinal: int, outcome: str) -> float:
    labels = {"namespace": "forwarding", "job": name, "role": "rollout", "replica": str(ordinal),
              "outcome": outcome}  # fmt: skip
    return metrics.REGISTRY.get_sample_value(FORWARDED, labels) or 0.0


async def with_replicas(
    name: str,
    free: list[int | None],
    check: Callable[[list[str], list[Worker], httpx.AsyncClient], Awaitable[None]],
    timeout_s: float = 2.0,
) -> None:
    """Serve one replica per entry of ``free`` (its free admission slots; None: a black hole that accepts
    connections and never answers) with the list form of the peer URL, run ``check``, stop them."""
    socks = [http.listen(0, "127.0.0.1") for _ in free]
    urls = [f"http://127.0.0.1:{s.getsockname()[1]}" for s in socks]
    workers = [Worker(f or 0, len(free)) for f in free]
    stop = asyncio.Event()
    served = [
        asyncio.create_task(
            http.serve(
                replica_app(name, i, urls[i], ",".join(urls), workers[i], timeout_s),
                sock, stop, workers[i].abort_generating,
            )
        )
        for i, sock in enumerate(socks)
        if free[i] is not None
    ]  # fmt: skip
    try:
        async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
            for url, f in zip(urls, free, strict=True):
                if f is not None:
                    await wait_healthy(client, url)
            await check(urls, workers, client)
    finally:
        stop.set()
        await asyncio.gather(*served)
        for sock in socks:
            sock.close()


async def wait_healthy(client: httpx.AsyncClient, url: str) -> None:
    for _ in range(200):
        try:
            if (await client.get(f"{url}/health")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.02)
    raise AssertionError(f"{url} did not start")


def test_a_group_one_replica_cannot_admit_is_opened_on_a_peer_that_can() -> None:
    async def check(urls: list[str], workers: list[Worker], client: httpx.AsyncClient) -> None:
        answer = await client.post(
            f"{urls[0]}/rl/groups", json={"n": 2, "record": {"prompt": "p"}}, headers=AUTH
        )
        assert answer.status_code == 200
        group = answer.json()
        assert [s["base_url"].split("/sessions/")[0] for s in group["sessions"]] == [urls[2], urls[2]]
        assert group["messages"] == [{"role": "user", "content": "p"}]
        # replica 0 asked itself once (not again as a peer); replica 1 refused the forwarded request and
        # did not forward it on (replica 2 admitted exactly one group)
        assert [w.asked for w in workers] == [1, 1, 1]
        assert workers[2].free == 0
        assert forwarded("admit", 0, "refused") + forwarded("admit", 0, "admitted") == 2
        assert forwarded("admit", 1, "refused") == 0  # a forwarded request is never forwarded again

    asyncio.run(with_replicas("admit", [0, 0, 1], check))


def test_forwarding_starts_one_peer_further_each_time() -> None:
    async def check(urls: list[str], workers: list[Worker], client: httpx.AsyncClient) -> None:
        first = await client.post(f"{urls[0]}/rl/sessions", json={"record": None}, headers=AUTH)
        second = await client.post(f"{urls[0]}/rl/sessions", json={"record": None}, headers=AUTH)
        assert first.status_code == second.status_code == 200
        owners = {
            first.json()["base_url"].split("/sessions/")[0],
            second.json()["base_url"].split("/sessions/")[0],
        }
        assert owners == {urls[1], urls[2]}
        assert forwarded("rotate", 0, "admitted") == 2
        assert forwarded("rotate", 0, "refused") == 0

    asyncio.run(with_replicas("rotate", [0, 5, 5], check))


def test_a_peer_that_does_not_answer_in_time_falls_through_to_the_next() -> None:
    async def check(urls: list[str], workers: list[Worker], client: httpx.AsyncClient) -> None:
        for _ in range(2):  # the rotation starts at the black hole one of the two times
            answer = await client.post(f"{urls[0]}/rl/groups", json={"n": 1}, headers=AUTH)
            assert answer.status_code == 200
            assert answer.json()["sessions"][0]["base_url"].startswith(urls[2] + "/")
        assert forwarded("timeout", 0, "error") == 1
        assert forwarded("timeout", 0, "admitted") == 2

    asyncio.run(with_replicas("timeout", [0, None, 2], check, timeout_s=0.3))


def test_refused_everywhere_is_this_replicas_429_and_a_forwarded_request_is_not_sent_on() -> None:
    async def check(urls: list[str], workers: list[Worker], client: httpx.AsyncClient) -> None:
        answer = await client.post(f"{urls[0]}/rl/groups", json={"n": 1}, headers=AUTH)
        assert answer.status_code == 429
        assert answer.headers["Retry-After"] == str(service.RETRY_AFTER_S)
        assert answer.json()["error"]["code"] == "rate_limited"
        assert forwarded("refused", 0, "refused") == 2
        assert [w.asked for w in workers] == [1, 1, 1]
        direct = await client.post(
            f"{urls[1]}/rl/groups", json={"n": 1}, headers={**AUTH, http.FORWARDED_HEADER: "1"}
        )
        assert direct.status_code == 429
        assert [w.asked for w in workers] == [1, 2, 1]
        bad = await client.post(f"{urls[0]}/rl/groups", json={"n": 0}, headers=AUTH)
        assert bad.status_code == 400  # a bad request is answered here, never forwarded
        unauthorized = await client.post(f"{urls[0]}/rl/groups", json={"n": 1})
        assert unauthorized.status_code == 401
        assert [w.asked for w in workers] == [1, 2, 1]

    asyncio.run(with_replicas("refused", [0, 0, 0], check))


def test_peer_urls_from_a_template_or_a_list_by_ordinal() -> None:
    template = "http://job-rollout-{replica}.job-rollout.ns.svc:8000"
    assert service.peer_urls(template, [0, 2]) == [
        (0, "http://job-rollout-0.job-rollout.ns.svc:8000"),
        (2, "http://job-rollout-2.job-rollout.ns.svc:8000"),
    ]
    assert service.peer_urls("http://a:1, http://b:2/", [1, 2]) == [(1, "http://b:2")]
    assert service.peer_urls("", [1]) == []


def test_peers_follow_the_admissions_member_count_and_leave_this_replica_out() -> None:
    worker = Worker(0, 2)
    app = replica_app("members", 1, "http://r1", "http://r{replica}", worker)
    assert app.g.peers() == [(0, "http://r0")]
    worker.admission.members = 4  # a plan with more replicas: no new env needed
    assert [o for o, _ in app.g.peers()] == [2, 3, 0]
    assert [o for o, _ in app.g.peers()] == [3, 0, 2]
    worker.admission.members = 1  # a plan without this replica yet: replica 0 is the one peer
    assert app.g.peers() == [(0, "http://r0")]
    alone = replica_app("members", 0, "http://r0", "http://r{replica}", Worker(0, 1))
    assert alone.g.peers() == []  # one replica: nothing to forward to
    for each in (app, alone):
        asyncio.run(each.aclose())


def test_a_peer_that_fails_leaves_this_replicas_429() -> None:
    async def check(urls: list[str], workers: list[Worker], client: httpx.AsyncClient) -> None:
        answer = await client.post(f"{urls[0]}/rl/groups", json={"n": 1}, headers=AUTH)
        assert answer.status_code == 429
        assert answer.json()["error"]["code"] == "rate_limited"
        assert forwarded("failing", 0, "error") == 1

    asyncio.run(with_replicas("failing", [0, None], check, timeout_s=0.3))
