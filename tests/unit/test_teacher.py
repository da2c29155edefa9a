"""The trainer's teacher: the preflight exit with its termination line, failed calls reported per sample,
response positions picked out of prompt logprobs, the klCoef reaching the backend. Real sockets only (a
closed port is connection refused); a teacher served by vLLM: tests/e2e/test_teacher_distillation.py."""

from __future__ import annotations

import asyncio
import socket

import pytest
from asyncrl_api import config
from asyncrl_testing import jobs
from asyncrl_workloads import termination
from asyncrl_workloads.bus import trajectory
from asyncrl_workloads.endpoints import settings
from asyncrl_workloads.entrypoints import trainer as entry
from asyncrl_workloads.trainer import teacher


def write(tmp_path, nats_url="nats://127.0.0.1:4222", **spec_patch):
    spec = jobs.deep_merge(jobs.BASE_SPEC, {"model": {"path": str(tmp_path / "model")}, **spec_patch})
    endpoints = config.Endpoints(nats_url=nats_url, trainer_host="127.0.0.1", weight_sync_port=29600)
    path = tmp_path / "job.json"
    path.write_text(config.dumps(config.JobConfig(name="j", namespace="ns", spec=spec, endpoints=endpoints)))
    return path


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket closes


def make(tid: str, prompt=(1, 2), response=(7, 8, 9)) -> trajectory.Trajectory:  # P=2, R=3
    n = len(response)
    return trajectory.Trajectory(
        id=tid,
        job="j",
        replica=0,
        group_id="g0",
        group_size=2,
        sample_index=0,
        prompt_ids=list(prompt),
        response_ids=list(response),
        behaviour_logprobs=[-1.0] * n,
        versions=[0] * n,
        mask=[1] * n,
        reward=1.0,
        created_at=0.0,
    )


def teacher_spec(port: int, **endpoint) -> dict:
    return {
        "endpoint": {"baseURL": f"http://127.0.0.1:{port}/v1", "model": "teacher", **endpoint},
        "klCoef": 2.5,
    }


def test_the_response_positions_of_the_prompt_logprobs_line_up_with_the_response():
    # prompt (1, 2) + response (7, 8, 9): positions 2, 3, 4 score the response tokens
    assert teacher.response_logprobs(make("a"), [None, -0.1, -1.0, -2.0, -3.0]) == [-1.0, -2.0, -3.0]
    with pytest.raises(ValueError, match="no finite logprob"):
        teacher.response_logprobs(make("a"), [None, -0.1, -1.0, float("-inf"), -3.0])
    with pytest.raises(ValueError, match="no finite logprob"):
        teacher.response_logprobs(make("a"), [None, -0.1, None, -2.0, -3.0])


def test_a_teacher_on_a_closed_port_fails_the_preflight_with_its_termination_line(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv(termination.PATH_ENV, str(tmp_path / "termination-log"))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    port = closed_port()
    with socket.socket() as nats:  # something listens where NATS should: the trainer gets to the teacher
        nats.bind(("127.0.0.1", 0))
        nats.listen()
        path = write(
            tmp_path,
            nats_url=f"nats://127.0.0.1:{nats.getsockname()[1]}",
            trainer={"checkpoint": {"path": str(tmp_path / "ckpt")}},
            teacher=teacher_spec(port, maxRetries=0),
        )
        assert entry.main(["--config", str(path)]) == 3
    line = (tmp_path / "termination-log").read_text()
    assert line.startswith(f"Unreachable: teacher endpoint http://127.0.0.1:{port}/v1: ")
    assert line.endswith("\n") and line.count("\n") == 1
    assert capsys.readouterr().err.splitlines() == [f"asyncrl-trainer: {line.strip()}"]
    assert not (tmp_path / "ckpt").exists()  # nothing was loaded or written


def test_samples_whose_teacher_call_fails_are_reported_not_given_made_up_values():
    port = closed_port()
    endpoint = settings.Endpoint(
        name="teacher", base_url=f"http://127.0.0.1:{port}/v1", model="teacher", max_retries=0
    )
    t = teacher.Teacher(endpoint, None)
    t.start()
    try:
        fetched = asyncio.run(t.fetch([make("a"), make("b")]))
        assert fetched.logprobs == {}
        assert set(fetched.failed) == {"a", "b"}
        assert all(why.startswith("Unreachable: teacher endpoint ") for why in fetched.failed.values())
        assert t.gave_up() is None  # failing for less than giveUpAfterSeconds: the samples are dropped
    finally:
        t.close()


def test_the_teacher_klcoef_reaches_the_backend_settings(tmp_path):
    from asyncrl_workloads.trainer import main

    without = config.load(write(tmp_path))
    assert main.train_settings(without).teacher_kl_coef is None
    cfg = config.load(write(tmp_path, teacher=teacher_spec(8000)))
    assert main.train_settings(cfg).teacher_kl_coef == 2.5


def test_the_batch_that_runs_out_the_give_up_clock_is_dropped_and_acked_before_the_trainer_ends():
    """Found by the teacher e2e in CI: the give-up check ran before the failed samples were recorded, so
    the ledger of a trainer that ended on its first failed batch had no drops (and those samples stayed
    unacked). A teacher on a closed port with giveUpAfterSeconds 0 fails its first batch and gives up."""
    from asyncrl_workloads.trainer import inbox, loop

    class Intake:
        def __init__(self):
            self.dropped = []

        async def drop_reward_errors(self, received):
            self.dropped.extend(received)

    endpoint = settings.Endpoint(
        name="teacher", base_url=f"http://127.0.0.1:{closed_port()}/v1", model="teacher",
        max_retries=0, give_up_after=0.0,
    )  # fmt: skip
    t = teacher.Teacher(endpoint, None)
    t.start()
    leader = loop.Leader.__new__(loop.Leader)  # only what _ask_teacher touches: world, intake, teacher
    leader.world, leader.intake, leader.teacher = type("World", (), {"size": 1})(), Intake(), t
    taken = [inbox.Taken(make(tid), f"received-{tid}", 0) for tid in ("a", "b")]
    try:
        with pytest.raises(teacher.GaveUp, match="^Unreachable: teacher endpoint "):
            asyncio.run(leader._ask_teacher(t, taken))
    finally:
        t.close()
    assert leader.intake.dropped == ["received-a", "received-b"]
