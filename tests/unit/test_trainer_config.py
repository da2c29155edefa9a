"""The trainer's command refuses bad configs in one line, before loading torch; config -> settings mapping."""

from __future__ import annotations

import json
import socket

import pytest
from asyncrl_api import config, roles
from asyncrl_testing import jobs
from asyncrl_workloads.entrypoints import trainer as entry


def write(tmp_path, model_path, nats_url="nats://127.0.0.1:4222", **spec_patch):
    spec = jobs.deep_merge(jobs.BASE_SPEC, {"model": {"path": str(model_path)}, **spec_patch})
    cfg = config.JobConfig(
        name="j",
        namespace="ns",
        spec=spec,
        endpoints=config.Endpoints(nats_url=nats_url, trainer_host="127.0.0.1", weight_sync_port=29600),
    )
    path = tmp_path / "job.json"
    path.write_text(config.dumps(cfg))
    return path


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket closes


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_missing_config_file(tmp_path, capsys):
    assert entry.main(["--config", str(tmp_path / "nope.json")]) == 2
    assert one_line(capsys).startswith(f"asyncrl-trainer: --config: cannot read {tmp_path / 'nope.json'}")


def test_an_invalid_field_is_named(tmp_path, capsys):
    path = write(tmp_path, tmp_path)
    body = json.loads(path.read_text())
    body["spec"]["async"]["maxStaleness"] = -1
    path.write_text(json.dumps(body))
    assert entry.main(["--config", str(path)]) == 2
    assert "spec.async.maxStaleness" in one_line(capsys)


def test_a_missing_model(tmp_path, capsys):
    assert entry.main(["--config", str(write(tmp_path, tmp_path / "no-model"))]) == 2
    assert (
        one_line(capsys)
        == f"asyncrl-trainer: spec.model.path: no model at {tmp_path / 'no-model'} (config.json missing)"
    )


def test_unreachable_nats_fails_before_anything_is_written(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    url = f"nats://127.0.0.1:{closed_port()}"
    path = write(
        tmp_path, tmp_path / "model", nats_url=url, trainer={"checkpoint": {"path": str(tmp_path / "ckpt")}}
    )
    assert entry.main(["--config", str(path)]) == 1
    assert one_line(capsys).startswith(f"asyncrl-trainer: endpoints.natsUrl: cannot reach NATS at {url}: ")
    assert not (tmp_path / "ckpt").exists()


def test_settings_follow_the_spec(tmp_path):
    from asyncrl_workloads.trainer import main
    from asyncrl_workloads.trainer.algorithms import correction

    cfg = config.load(
        write(
            tmp_path,
            tmp_path,
            trainer={
                "algorithm": {
                    "name": "ppo",
                    "correction": "tis",
                    "clipLow": 0.1,
                    "clipHigh": 0.3,
                    "isCap": 3.0,
                },
                "batch": {"prompts": 8, "miniBatches": 4},
            },
            **{"async": {"requireBatches": 2}},
        )
    )
    s = main.train_settings(cfg)
    assert s.advantage.estimator == "ppo"
    assert (s.objective.correction, s.objective.loss.clip_low, s.objective.loss.clip_high) == (
        "tis",
        0.1,
        0.3,
    )
    assert s.objective.rejection == correction.Rejection(
        level="token", action="clamp", metric="ratio", upper=3.0
    )
    assert (s.kl, s.objective.kl_in_loss, s.advantage.kl_in_reward) == (0.0, 0.0, False)
    assert s.updates_per_step == 8


def test_kl_placement_and_estimator_defaults_follow_verl(tmp_path):
    """klEstimator unset: k3 (verl's low_var_kl) in the loss, k1 in the reward; the adaptive target only
    with the reward; a spec rejection replaces the isCap mask; seq-mean-token-sum-norm's divisor is
    rollout.sampling.maxTokens unless lossScaleFactor says otherwise."""
    from asyncrl_workloads.trainer import main
    from asyncrl_workloads.trainer.algorithms import correction

    algo = {
        "name": "rloo",
        "kl": 0.1,
        "entropyCoef": 0.01,
        "lossAggregation": "seq-mean-token-sum-norm",
        "rejection": {"level": "sequence", "metric": "k3", "upper": 0.5, "lower": 0.0},
    }
    cfg = config.load(write(tmp_path, tmp_path, trainer={"algorithm": algo}))
    s = main.train_settings(cfg)
    assert (s.kl, s.objective.kl_in_loss, s.objective.kl_estimator, s.advantage.kl_in_reward) == (
        0.1,
        0.1,
        "k3",
        False,
    )
    assert s.objective.rejection == correction.Rejection("sequence", "mask", "k3", "mean", 0.5, 0.0)
    assert s.objective.entropy_coef == 0.01
    assert s.loss_scale_factor == cfg.spec.rollout.sampling.max_tokens
    algo.update(klPlacement="reward", klTarget=0.02, lossScaleFactor=512)
    del algo["rejection"]
    cfg = config.load(write(tmp_path, tmp_path, trainer={"algorithm": algo}))
    s = main.train_settings(cfg)
    assert (s.objective.kl_in_loss, s.advantage.kl_in_reward, s.advantage.kl_estimator) == (0.0, True, "k1")
    assert (s.kl_target, s.loss_scale_factor) == (0.02, 512.0)
    assert s.objective.rejection == correction.Rejection(action="mask", upper=2.0)


def test_backend_megatron_builds_the_megatron_core_backend():
    import torch
    from asyncrl_workloads.trainer import backend, fsdp

    assert set(backend.BACKENDS) == {"fsdp2", "megatron"}
    world = fsdp.World(rank=0, size=2, local_rank=0, device=torch.device("cpu"))
    with pytest.raises(backend.Unsupported, match="^spec.trainer.parallelism.tp: 3 does not divide the 2 "):
        backend.BACKENDS["megatron"](backend.TrainSettings(model_path="/nowhere", tp=3), world)


@pytest.mark.parametrize(
    ("config", "tp", "expected"),
    [
        ({"model_type": "gpt2"}, 1, "^spec.model.path: .*model_type 'gpt2': the megatron backend builds"),
        ({"model_type": "llama", "hidden_act": "gelu"}, 1, "^spec.model.path: .*hidden_act 'gelu'"),
        (
            {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64},
            4,
            "^spec.trainer.parallelism.tp: num_key_value_heads 2 is not divisible by tensor parallel size 4",
        ),
    ],
)
def test_megatron_refuses_what_it_cannot_build_in_one_line_naming_the_field(tmp_path, config, tp, expected):
    """Before any collective or weight read: the trainer turns it into its one-line termination message
    (trainer/main.py: backend.Unsupported -> StartupError), which `kubectl describe arj` shows."""
    import torch
    from asyncrl_workloads.trainer import backend, fsdp

    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"")  # never read: the config is refused first
    world = fsdp.World(rank=0, size=4, local_rank=0, device=torch.device("cpu"))
    with pytest.raises(backend.Unsupported, match=expected):
        backend.BACKENDS["megatron"](backend.TrainSettings(model_path=str(tmp_path), tp=tp), world)


def test_a_blocking_queue_smaller_than_one_step_is_refused(tmp_path):
    from asyncrl_workloads.trainer import main

    cfg = config.load(
        write(
            tmp_path,
            tmp_path,
            trainer={"batch": {"prompts": 8, "miniBatches": 1}},
            rollout={"sampling": {"n": 4}},
            **{"async": {"queue": {"maxSize": 32, "whenFull": "block"}}},
        )
    )
    assert main.stream_settings(cfg).max_size == 32
    cfg.spec.async_.queue.max_size = 31  # admission refuses it (malformed.yaml); the trainer checks again
    with pytest.raises(
        main.StartupError, match=r"^spec.async.queue.maxSize: 31 is below one step's samples \(32"
    ):
        main.stream_settings(cfg)


def test_a_taken_weight_sync_port_is_one_clear_error(tmp_path):
    from asyncrl_workloads.trainer import main

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = config.load(
            write(
                tmp_path,
                tmp_path,
                weightSync={"backend": "gloo", "timeoutSeconds": 2},
                rollout={"gpusPerReplica": 0},
                trainer={"gpusPerReplica": 0},
            )
        )
        cfg.endpoints.weight_sync_port = port
        with pytest.raises(main.StartupError, match=f"^endpoints.weightSyncPort: cannot host .* on {port}: "):
            main.make_sender(cfg)


def test_a_hub_id_as_model_path_says_how_to_save_it(tmp_path, capsys, monkeypatch):
    """spec.model.path Qwen/Qwen3-8B (a Hub id, as verl and AReaL configs give it): nothing is downloaded
    at run time, so the pod's one line (its termination message, in kubectl describe arj) says how to
    save it on a volume instead of only that config.json is missing."""
    monkeypatch.chdir(tmp_path)
    assert entry.main(["--config", str(write(tmp_path, "Qwen/Qwen3-8B"))]) == 2
    line = one_line(capsys)
    assert line.startswith(
        "asyncrl-trainer: spec.model.path: no model at Qwen/Qwen3-8B (config.json missing)"
    )
    assert "huggingface-cli download Qwen/Qwen3-8B --local-dir /models/Qwen3-8B" in line


def test_unset_log_prob_chunks_are_sized_for_the_vocabulary():
    """spec.trainer.memory.logprobChunkTokens unset: one chunk's float32 logits within 512 MiB, whatever
    the vocabulary; a set value (0 included: all at once) is taken as it is."""
    from asyncrl_workloads.trainer import chunked

    assert chunked.chunk_tokens(None, 32_000) == 4194  # llama-2's vocabulary
    assert chunked.chunk_tokens(None, 151_936) == 883  # qwen's
    for vocab in (32_000, 151_936, 262_144):
        assert chunked.chunk_tokens(None, vocab) * vocab * 4 <= chunked.AUTO_CHUNK_BYTES
    assert chunked.chunk_tokens(None, 10**9) == 64  # never fewer than 64 tokens a chunk
    assert chunked.chunk_tokens(4096, 151_936) == 4096 and chunked.chunk_tokens(0, 151_936) == 0
    spec = roles.MemorySpec()
    assert spec.logprob_chunk_tokens is None
