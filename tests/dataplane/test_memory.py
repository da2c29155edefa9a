"""spec.trainer.memory on the FSDP2 backend: activation checkpointing, chunked log-probs and packing change
memory, not results.

The worker (memory_worker.py) builds the backend under each setting, on one rank and on two (gloo, the
root unit's parameters - the language-model head among them - sharded across the ranks, so the chunked
head runs through the root's registered forward method: ``fsdp.token_logprobs``).
"""

from __future__ import annotations

import math
import pathlib
import socket
import subprocess
import sys

import pytest
import torch
from asyncrl_testing.ranks import env_for

pytestmark = pytest.mark.dataplane
HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]


def run_worker(model: pathlib.Path, out: pathlib.Path, world: int) -> dict:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "memory_worker.py"), str(model), str(out)],
            env=env_for(rank, world, port),
        )
        for rank in range(world)
    ]
    for p in procs:
        assert p.wait(timeout=300) == 0
    return torch.load(out)


@pytest.fixture(scope="module", params=[1, 2], ids=["1-rank", "2-ranks"])
def runs(request, tiny_model, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp(f"memory-{request.param}") / "out.pt"
    return run_worker(tiny_model, out, request.param)


def assert_same(a: dict, b: dict) -> None:
    torch.testing.assert_close(a["logprobs"], b["logprobs"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a["entropy"], b["entropy"], rtol=1e-5, atol=1e-6)
    assert a["grads"].keys() == b["grads"].keys()
    for name in a["grads"]:
        # float32 sums in another order (packed rows): measured <= 8e-6 on gradients up to 16
        torch.testing.assert_close(a["grads"][name], b["grads"][name], rtol=1e-4, atol=2e-5, msg=name)


@pytest.mark.parametrize("setting", ["checkpointed", "chunked", "both", "packed", "all"])
def test_each_memory_setting_gives_the_plain_paths_logprobs_entropy_and_gradients(runs, setting):
    assert_same(runs["plain"], runs[setting])
    assert any(g.abs().sum() > 0 for g in runs[setting]["grads"].values())


def test_checkpointing_recomputes_each_layer_in_backward(runs):
    # one forward + one backward: the layer runs once without checkpointing, twice with it
    assert runs["plain"]["counts"]["attention"] == 1
    assert runs["checkpointed"]["counts"]["attention"] == 2


def test_the_chunked_head_never_sees_more_than_a_chunk(runs):
    plain, chunked = runs["plain"]["counts"], runs["chunked"]["counts"]
    assert plain["head"] == 1 and plain["head_rows"] > 7  # the whole micro-batch at once
    assert chunked["head_rows"] == 7
    chunks = math.ceil(plain["head_rows"] / 7)
    assert chunked["head"] == 2 * chunks  # each chunk once in forward, once more in backward


def test_packing_runs_one_unpadded_row(runs):
    # the head sees every real token of the rank's rows once, and no padding
    assert runs["packed"]["counts"]["head"] == 1
    assert runs["packed"]["counts"]["head_rows"] < runs["plain"]["counts"]["head_rows"]


def test_a_packed_row_attends_one_sequence_at_a_time_without_a_mask(runs):
    # transformers' sdpa path would make one (row x row) block-diagonal mask per forward; packing.py
    # calls torch's attention once per sequence per layer, causally, with no mask at all
    counts, plain = runs["packed"]["counts"], runs["plain"]["counts"]
    layers = 2  # the tiny model's
    assert [q for q, _ in counts["sdpa"]] == counts["lengths"] * layers
    assert all(m is None for _, m in counts["sdpa"])
    assert any(m is not None for _, m in plain["sdpa"])  # the padded batch: sdpa's padding mask


@pytest.mark.parametrize("window", [3, 1000])
def test_packed_attention_keeps_a_sliding_window_inside_each_sequence(tmp_path, window):
    """gemma3's local layers on packed rows (packing.py) give the padded batch's hidden states: the
    window applies within each sequence, longer ones (9 tokens vs a window of 3) through a banded mask."""
    import transformers
    from asyncrl_workloads import tinymodel
    from asyncrl_workloads.trainer import packing

    path = tinymodel.create_tiny_model(tmp_path / "gemma3", architecture="gemma3", num_layers=3)
    config = transformers.AutoConfig.from_pretrained(path)
    config.sliding_window = window
    padded = transformers.AutoModelForCausalLM.from_pretrained(
        path, config=config, attn_implementation="sdpa"
    )
    packed = transformers.AutoModelForCausalLM.from_pretrained(
        path, config=config, attn_implementation=packing.implementation(torch.device("cpu"))
    )
    gen = torch.Generator().manual_seed(0)
    lengths = [9, 2, 6, 1]
    seqs = [torch.randint(4, 90, (n,), generator=gen) for n in lengths]
    ids = torch.zeros(len(seqs), max(lengths), dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)], attention[row, : len(seq)] = seq, 1
    want = padded.model(input_ids=ids, attention_mask=attention).last_hidden_state  # (B, L, H)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]  # (1, T)
    got = packed.model(
        input_ids=torch.cat(seqs)[None], position_ids=positions, **packing.row_kwargs(lengths, ids.device)
    ).last_hidden_state  # (1, T, H)
    start = 0
    for row, n in enumerate(lengths):
        torch.testing.assert_close(got[0, start : start + n], want[row, :n], rtol=1e-5, atol=1e-5)
        start += n
    # and the same without the lengths: the restarting position ids split the row
    bare = packed.model(input_ids=torch.cat(seqs)[None], position_ids=positions).last_hidden_state
    torch.testing.assert_close(bare, got, rtol=0, atol=0)


def test_a_whole_step_with_every_setting_on_equals_the_step_with_all_off(runs):
    off, on = runs["step_plain"], runs["step_all"]
    assert math.isclose(off["metrics"]["loss"], on["metrics"]["loss"], rel_tol=1e-5, abs_tol=1e-7)
    assert math.isclose(off["metrics"]["grad_norm"], on["metrics"]["grad_norm"], rel_tol=1e-5)
    # two AdamW updates at lr 1e-2 move weights by ~2e-2; Adam's g / sqrt(v) turns the float32 rounding
    # of near-zero gradients (packed rows sum in another order) into at most 8e-5 (measured)
    for name, tensor in off["weights"].items():
        torch.testing.assert_close(on["weights"][name], tensor, rtol=0, atol=2e-4, msg=name)
