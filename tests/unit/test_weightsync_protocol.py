"""The weight-sync wire protocol and bucket packing (weightsync/base.py, rendezvous.py): pure, no peers."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from asyncrl_workloads.weightsync import base, checksum, rendezvous, tied


def make_plan() -> base.Plan:
    metas = (base.TensorMeta("a", "float32", (2, 3)), base.TensorMeta("b", "bfloat16", (4,)))
    return base.Plan(
        seq=3, version=7, candidates=(base.Member(0, "inc0", 1), base.Member(2, "inc2", 2)), tensors=metas,
        buckets=((0, 1), (1, 2)), timeout_seconds=5.0, trainer="t", bucket_bytes=1 << 20, registered=3,
    )  # fmt: skip


def test_messages_round_trip() -> None:
    plan = make_plan()
    assert base.decode(base.encode(plan), base.Plan) == plan
    roster = base.Roster(
        seq=3, generation=2, world_size=4, members=(base.Member(2, "inc2", 2, rank_offset=1),)
    )
    assert base.decode(base.encode(roster), base.Roster) == roster
    assert roster.member(2, "inc2") == roster.members[0] and roster.member(2, "other") is None
    assert plan.includes(2, "inc2") and not plan.includes(2, "restarted") and not plan.includes(1, "inc0")


def test_a_lora_plan_carries_its_payload_kind_and_a_full_plan_none() -> None:
    """One protocol, two payload kinds: the adapter (rank, alpha, targets) survives the wire; a plan
    without it (every full-weights plan, and any written before the field existed) decodes to None."""
    lora = dataclasses.replace(make_plan(), adapter=base.Adapter(16, 32.0, ("q_proj", "v_proj")))
    assert base.decode(base.encode(lora), base.Plan) == lora
    assert base.decode(base.encode(make_plan()), base.Plan).adapter is None
    body = json.loads(base.encode(make_plan()))
    del body["adapter"]
    assert base.decode(json.dumps(body).encode(), base.Plan) == make_plan()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not json", "not JSON"),
        (b'{"protocol": 99, "kind": "Plan"}', "protocol: expected 1, got 99"),
        (b'{"protocol": 1, "kind": "Ack"}', "kind: expected Plan"),
        (b'{"protocol": 1, "kind": "Plan", "seq": 1}', "Plan: malformed"),
    ],
)
def test_bad_messages_are_rejected_with_the_field(data: bytes, message: str) -> None:
    with pytest.raises(base.ProtocolError, match=message):
        base.decode(data, base.Plan)


def test_tensor_meta_counts_bytes_by_dtype() -> None:
    assert base.TensorMeta("x", "float32", (3, 5)).nbytes == 60
    assert base.TensorMeta("x", "bfloat16", (3, 5)).nbytes == 30


def test_pack_unpack_restores_mixed_dtypes_bit_exactly() -> None:
    tensors = [
        ("w", torch.randn(3, 4)),
        ("n", torch.randn(5).to(torch.bfloat16)),
        ("i", torch.arange(6).view(2, 3)),
    ]
    metas = [base.TensorMeta.of(n, t.dtype, t.shape) for n, t in tensors]
    buffer = rendezvous.pack([t for _, t in tensors])
    assert buffer.dtype == torch.uint8 and buffer.numel() == rendezvous.bucket_nbytes(metas)
    out = rendezvous.unpack(buffer, metas)
    assert [n for n, _ in out] == ["w", "n", "i"]
    for (_, a), (_, b) in zip(tensors, out, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert checksum.of(out) == checksum.of(tensors)
    with pytest.raises(ValueError, match="bucket holds"):
        rendezvous.unpack(buffer[:-1], metas)


def test_checksum_sees_names_values_and_dtypes_but_not_order() -> None:
    a, b = torch.ones(3), torch.zeros(2)
    assert checksum.of([("a", a), ("b", b)]) == checksum.of([("b", b), ("a", a)])
    assert checksum.of([("a", a)]) != checksum.of([("a2", a)])
    assert checksum.of([("a", a)]) != checksum.of([("a", a.double())])
    assert checksum.of([("a", a)]) != checksum.of([("a", a + 1e-7)])


def test_peek_int_reads_a_counter_in_one_call_and_sees_decimal_sets() -> None:
    """The rollout polls the plan counter with ``peek_int``; the trainer writes it with ``set``."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # as the trainer hosts it
    assert rendezvous.peek_int(store, rendezvous.PLAN_SEQ) == 0  # not written yet
    store.set(rendezvous.PLAN_SEQ, "7")
    assert rendezvous.peek_int(store, rendezvous.PLAN_SEQ) == 7
    assert rendezvous.peek_int(store, rendezvous.PLAN_SEQ) == 7  # peeking does not count up
    store.add(rendezvous.HELLO_SEQ, 2)
    assert rendezvous.peek_int(store, rendezvous.HELLO_SEQ) == 2


def test_a_tied_head_gets_the_embeddings_tensor_and_an_untied_one_nothing() -> None:
    """weightsync/tied.py: a round that carried a tied matrix once (as the embedding) reloads it under
    both names; a round that carried the head, or a model whose head has its own storage, is left as is."""

    class Model(torch.nn.Module):
        def __init__(self, tie: bool) -> None:
            super().__init__()
            self.model = torch.nn.Module()
            self.model.embed_tokens = torch.nn.Embedding(8, 4)
            self.lm_head = torch.nn.Linear(4, 8, bias=False)
            if tie:
                self.lm_head.weight = self.model.embed_tokens.weight

    embedding, layer = torch.ones(8, 4), torch.zeros(4, 4)
    sent = [("model.embed_tokens.weight", embedding), ("model.layers.0.w", layer)]
    named = tied.with_head(Model(tie=True), sent)
    assert [n for n, _ in named] == ["model.embed_tokens.weight", "model.layers.0.w", "lm_head.weight"]
    assert named[-1][1] is embedding and len(sent) == 2  # the received buffer itself; `sent` unchanged
    assert tied.with_head(Model(tie=False), sent) == sent
    both = [*sent, ("lm_head.weight", torch.ones(8, 4))]
    assert tied.with_head(Model(tie=True), both) == both
