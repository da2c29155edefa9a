"""The trainer's cheap read of a pulled message's delivery count and stream sequence (bus/jetstream.py)
against nats-py's own `msg.metadata` parse of the same JetStream ack subjects."""

from __future__ import annotations

import nats.aio.msg
import nats.errors
import pytest
from asyncrl_workloads.bus import jetstream


@pytest.mark.parametrize(
    "reply",
    [
        "$JS.ACK.ARL_ns_job.trainer.1.4001.3999.1764419999123456789.17",
        "$JS.ACK.ARL_ns_job.trainer.3.7.12.1764419999123456789.0",
        "$JS.ACK.hub.ACCHASH.ARL_ns_job.trainer.2.905.900.1764419999123456789.4.x8Yz",
        "$JS.ACK.hub.ACCHASH.ARL_ns_job.trainer.5.906.901.1764419999123456789.4",
    ],
)
def test_delivery_matches_nats_py_metadata(reply):
    meta = nats.aio.msg.Msg(None, subject="asyncrl.ns.job.traj", reply=reply).metadata  # type: ignore[arg-type]
    assert jetstream.delivery(reply) == (meta.num_delivered, meta.sequence.stream)


@pytest.mark.parametrize("reply", [None, "", "_INBOX.abc.1", "$JS.ACK.s.c.1.2.3.4.5.6"])
def test_a_subject_that_is_not_a_jetstream_ack_reads_as_a_first_delivery(reply):
    with pytest.raises(nats.errors.Error):
        _ = nats.aio.msg.Msg(None, reply=reply).metadata  # type: ignore[arg-type]  # nats-py refuses it
    assert jetstream.delivery(reply) == (1, 0)
