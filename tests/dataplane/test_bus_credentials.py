"""bus.nats.credentialsSecret against a real nats-server that requires credentials (operator mode, memory
resolver, keys and JWTs made by asyncrl_testing.natsauth): the right ``.creds`` file carries a trajectory
from the rollout's publisher to the trainer's consumer; a wrong one, or none, ends the first connect at
once with one classified line, which the trainer's command writes as its termination message.
"""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import Iterator

import pytest
from asyncrl_api import config
from asyncrl_testing import jobs, natsauth
from asyncrl_workloads import termination
from asyncrl_workloads.bus import access, jetstream, trajectory
from asyncrl_workloads.entrypoints import trainer as trainer_entry
from asyncrl_workloads.local import natsserver

pytestmark = pytest.mark.dataplane

SECRET = "nats-creds"
FIELD = "spec.bus.nats.credentialsSecret"
FAST_S = 2.0
"""A refusal ends the first connect without nats-py's retries (3 more, 1 s apart)."""


class AuthServer:
    def __init__(self, server: natsserver.NatsServer, good: pathlib.Path, wrong: pathlib.Path) -> None:
        self.server, self.good, self.wrong = server, good, wrong


@pytest.fixture(scope="module")
def auth_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    """A nats-server (JetStream on) that lets in only users of its one account; `good` is such a user's
    .creds file, `wrong` one of an account of another operator."""
    tmp = tmp_path_factory.mktemp("auth-nats")
    operator = natsauth.Operator.create()
    account = operator.account("asyncrl")
    (tmp / "server.conf").write_text(operator.server_config([account]))
    good = account.user("rollout").write_creds(tmp / "good.creds")
    wrong = natsauth.Operator.create().account("other").user("intruder").write_creds(tmp / "wrong.creds")
    server = natsserver.start(
        store_dir=tmp / "store", log_path=tmp / "nats-server.log", config_file=tmp / "server.conf"
    )
    try:
        yield AuthServer(server, good, wrong)
    finally:
        server.stop()


def job_config(url: str, secret: str | None = SECRET, **spec_patch: object) -> config.JobConfig:
    nats = {"managed": False, "url": url} | ({"credentialsSecret": secret} if secret else {})
    spec = jobs.deep_merge(jobs.BASE_SPEC, {"bus": {"nats": nats}, **spec_patch})
    endpoints = config.Endpoints(nats_url=url, trainer_host="127.0.0.1", weight_sync_port=29600)
    return config.JobConfig(name="creds", namespace="ns", spec=spec, endpoints=endpoints)


def make_trajectory() -> trajectory.Trajectory:
    return trajectory.Trajectory(
        id=trajectory.trajectory_id("creds", 0, "p", 0),
        job="creds",
        replica=0,
        group_id="creds:p",
        group_size=1,
        sample_index=0,
        prompt_ids=[1, 2],
        response_ids=[3, 4],
        behaviour_logprobs=[-0.5, -0.25],
        versions=[0, 0],
        mask=[1, 1],
        reward=1.0,
        created_at=time.time(),
    )


def test_the_right_credentials_carry_a_trajectory_from_publisher_to_consumer(auth_nats, monkeypatch):
    monkeypatch.setenv(config.NATS_CREDS_ENV, str(auth_nats.good))
    cfg = job_config(auth_nats.server.url)
    settings = jetstream.StreamSettings(cfg.namespace, cfg.name, max_size=10)
    sent = make_trajectory()

    async def scenario() -> list[jetstream.Received]:
        rollout_nc, trainer_nc = await access.connect(cfg), await access.connect(cfg)
        try:
            await jetstream.ensure_stream(rollout_nc.jetstream(), settings)
            assert await jetstream.Publisher(rollout_nc.jetstream(), settings).publish(sent)
            consumer = jetstream.Consumer(trainer_nc.jetstream(), settings)
            await consumer.open()
            got = await consumer.fetch(1, timeout_s=5)
            for received in got:
                await consumer.ack(received)
            await consumer.close()
            return got
        finally:
            await rollout_nc.close()
            await trainer_nc.close()

    (received,) = asyncio.run(scenario())
    assert received.error is None and received.trajectory == sent


def _refusal(cfg: config.JobConfig) -> tuple[str, float]:
    start = time.monotonic()
    with pytest.raises(access.Failed) as failed:
        asyncio.run(access.connect(cfg))
    return str(failed.value), time.monotonic() - start


def test_a_wrong_users_credentials_fail_the_first_connect_at_once_naming_the_secret(auth_nats, monkeypatch):
    monkeypatch.setenv(config.NATS_CREDS_ENV, str(auth_nats.wrong))
    url = auth_nats.server.url
    line, took = _refusal(job_config(url))
    where = f"Secret {SECRET} key creds ({auth_nats.wrong})"
    assert line == f"{FIELD}: NATS at {url} refused the credentials in {where}: Authorization Violation"
    assert took < FAST_S


def test_no_credentials_fail_the_first_connect_at_once_and_say_what_to_set(auth_nats, monkeypatch):
    monkeypatch.delenv(config.NATS_CREDS_ENV, raising=False)
    url = auth_nats.server.url
    line, took = _refusal(job_config(url, secret=None))
    assert line == (
        f"{FIELD}: NATS at {url} requires credentials (Authorization Violation); "
        "set it to a Secret with key creds (a NATS .creds file)"
    )
    assert took < FAST_S


def test_a_file_that_is_not_a_creds_file_is_refused_before_connecting(tmp_path, monkeypatch):
    (tmp_path / "creds").write_text("user: alice\npassword: secret\n")
    monkeypatch.setenv(config.NATS_CREDS_ENV, str(tmp_path / "creds"))
    line, _ = _refusal(job_config("nats://127.0.0.1:1"))  # nothing listens: it is never asked
    assert line.startswith(
        f"{FIELD}: Secret {SECRET} key creds ({tmp_path / 'creds'}) is not a NATS .creds file"
    )
    assert "secret" not in line.replace(SECRET, "").replace("credentialsSecret", "")  # no content


def test_the_trainer_command_exits_1_with_the_refusal_as_its_termination_message(
    auth_nats, tmp_path, capsys, monkeypatch
):
    """Rank 0 tries the credentials before loading torch: nothing is loaded or written."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv(config.NATS_CREDS_ENV, str(auth_nats.wrong))
    monkeypatch.setenv(termination.PATH_ENV, str(tmp_path / "termination-log"))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    cfg = job_config(
        auth_nats.server.url,
        model={"path": str(tmp_path / "model")},
        trainer={"checkpoint": {"path": str(tmp_path / "ckpt")}},
    )
    (tmp_path / "job.json").write_text(config.dumps(cfg))
    assert trainer_entry.main(["--config", str(tmp_path / "job.json")]) == 1
    line = (tmp_path / "termination-log").read_text()
    assert line.startswith(
        f"{FIELD}: NATS at {auth_nats.server.url} refused the credentials in Secret {SECRET}"
    )
    assert line.endswith(": Authorization Violation\n") and line.count("\n") == 1
    assert capsys.readouterr().err.splitlines() == [f"asyncrl-trainer: {line.strip()}"]
    assert not (tmp_path / "ckpt").exists()
