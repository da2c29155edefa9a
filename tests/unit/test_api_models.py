"""The AsyncRLJob API models: defaults, camelCase round trips, derived values, examples, JobConfig."""

from __future__ import annotations

import json

import pydantic
import pytest
from asyncrl_api import config, models
from asyncrl_testing import jobs


def _spec(**patch: object) -> models.AsyncRLJobSpec:
    return models.AsyncRLJobSpec.model_validate(jobs.make_job(**patch)["spec"])


def test_defaults_are_explicit_and_serialised_in_camel_case() -> None:
    spec = _spec()
    data = spec.to_api()
    assert data["async"]["queue"] == {"maxSize": 512, "whenFull": "dropOldest"}
    assert data["weightSync"] == {"backend": "nccl", "port": 29600, "timeoutSeconds": 120, "bucketMB": 512}
    assert data["trainer"]["algorithm"]["clipHigh"] == 0.28
    assert data["rollout"]["engine"]["gpuMemoryUtilization"] == 0.85
    assert "maxStaleness" not in data["async"]  # derived from mode when unset


def test_round_trip_through_json_keeps_every_value() -> None:
    spec = _spec(
        mode="one-step-off", rollout={"engine": {"args": {"max_num_seqs": 8, "kv_cache_dtype": "fp8"}}}
    )
    again = models.AsyncRLJobSpec.model_validate_json(json.dumps(spec.to_api()))
    assert again == spec
    assert again.rollout.engine.args == {"max_num_seqs": 8, "kv_cache_dtype": "fp8"}


def test_snake_case_names_are_accepted_in_python() -> None:
    spec = models.AsyncRLJobSpec(
        model=models.ModelSpec(path="/m"),
        data=models.DataSpec(prompts="builtin:say_char"),
        weight_sync=models.WeightSyncSpec(bucket_mb=64, backend="gloo"),
        rollout=models.RolloutSpec(gpus_per_replica=0),
        trainer=models.TrainerSpec(gpus_per_replica=0),
    )
    assert spec.to_api()["weightSync"]["bucketMB"] == 64


@pytest.mark.parametrize(("mode", "expected"), [("async", 2), ("one-step-off", 1), ("sync", 0)])
def test_max_staleness_follows_the_mode_when_unset(mode: str, expected: int) -> None:
    assert _spec(mode=mode).max_staleness() == expected


def test_explicit_max_staleness_wins_in_async_mode() -> None:
    assert _spec(**{"async": {"maxStaleness": 5}}).max_staleness() == 5


def test_sync_mode_rejects_a_positive_staleness() -> None:
    with pytest.raises(pydantic.ValidationError, match="maxStaleness"):
        _spec(mode="sync", **{"async": {"maxStaleness": 1}})


def test_trainer_world_size_counts_processes() -> None:
    assert _spec(trainer={"replicas": 3, "gpusPerReplica": 8}).trainer.world_size() == 24
    cpu = _spec(
        trainer={"replicas": 2, "gpusPerReplica": 0},
        rollout={"gpusPerReplica": 0},
        weightSync={"backend": "gloo"},
    )
    assert cpu.trainer.world_size() == 2


@pytest.mark.parametrize("example", sorted(p.name for p in jobs.EXAMPLES.glob("*.yaml")))
def test_every_example_validates(example: str) -> None:
    job = models.AsyncRLJob.model_validate(jobs.load_example(example))
    assert len(job.metadata.name) <= models.MAX_NAME_LENGTH


def test_job_config_round_trips_through_the_configmap_text() -> None:
    cfg = config.JobConfig(
        name="demo",
        namespace="ns",
        spec=_spec(),
        endpoints=config.Endpoints(
            nats_url="nats://x:4222", trainer_host="t-0.t.ns.svc", weight_sync_port=29600
        ),
    )
    text = config.dumps(cfg)
    assert '"natsUrl": "nats://x:4222"' in text
    assert config.JobConfig.model_validate_json(text) == cfg


def test_status_model_accepts_a_progress_report_in_camel_case() -> None:
    st = models.AsyncRLJobStatus.model_validate(
        {
            "phase": "Running",
            "progress": {
                "step": 3,
                "paramVersion": 2,
                "staleness": {"p50": 0.5, "max": 1},
                "queueDepth": 7,
                "stepTime": "2026-01-01T00:00:00Z",
            },
        }
    )
    assert st.progress is not None and st.progress.param_version == 2 and st.progress.staleness.max == 1
