"""Trainer progress reports: throttled, written atomically, and never fatal when the sink fails."""

from __future__ import annotations

import json

from asyncrl_workloads.trainer import progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Broken:
    def write(self, progress, extras):
        raise OSError("connection refused")


def test_reports_are_throttled_unless_forced(tmp_path):
    clock = Clock()
    path = tmp_path / "progress.json"
    reporter = progress.Reporter(progress.FileSink(path), interval_s=5, clock=clock)
    assert reporter.report({"step": 1}, {"reward": 0.1})
    assert not reporter.report({"step": 2}, {})
    clock.now += 5
    assert reporter.report({"step": 3}, {})
    assert reporter.report({"step": 4}, {}, force=True)
    assert json.loads(path.read_text()) == {"progress": {"step": 4}}
    assert [p.name for p in tmp_path.iterdir()] == ["progress.json"]  # no temp file left behind


def test_a_failing_sink_is_counted_not_raised():
    reporter = progress.Reporter(Broken(), interval_s=0, clock=Clock())
    assert not reporter.report({"step": 1}, {})
    assert not reporter.report({"step": 2}, {})
    assert reporter.failures == 2


def test_the_sink_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(progress.PROGRESS_FILE_ENV, str(tmp_path / "p.json"))
    assert isinstance(progress.sink_from_env("ns", "job"), progress.FileSink)
    monkeypatch.delenv(progress.PROGRESS_FILE_ENV)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert progress.sink_from_env("ns", "job") is None


def test_timestamps_are_rfc3339_utc():
    assert progress.rfc3339(0) == "1970-01-01T00:00:00Z"
