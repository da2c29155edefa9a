"""The tracking backends: one run each, opened (or resumed by id) by ``start``.

Each method may raise anything its library raises; ``tracker.Tracker`` retries, classifies and counts.
The libraries are imported when a sink starts, so a trainer without spec.tracking never loads them.
"""

from __future__ import annotations

import abc
import json
import os
import pathlib
from typing import Any

COLUMNS = ("prompt", "response", "reward")
"""The validation table's columns."""


MLFLOW_HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}
"""MLflow client settings (its own env vars) set unless the environment has them: see MlflowSink."""
STEP_KEY = "trainer/step"
"""MLflow and TensorBoard: logged with every step (its value the step), so a resumed run knows its last
logged step (``Sink.logged``)."""
VALIDATION_STEP_KEY = "validation/step"


class Sink(abc.ABC):
    backend: str
    """mlflow, wandb or tensorboard: the counter's label and the state file's key."""

    @abc.abstractmethod
    def start(self, run_id: str | None, name: str, tags: dict[str, str]) -> tuple[str, bool]:
        """Open the run ``run_id`` (resume) or a new one; its id, and whether it is new."""

    @abc.abstractmethod
    def log_params(self, params: dict[str, str]) -> None:
        """Once, for a new run: the flattened spec, image tags, asyncrl version."""

    @abc.abstractmethod
    def log_step(self, step: int, metrics: dict[str, float]) -> None: ...

    @abc.abstractmethod
    def log_validation(self, step: int, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        """A validation run's result and its generations (prompt, response, reward)."""

    def logged(self) -> dict[str, int]:
        """After resuming a run: the last step (``last_step``) and validation step (``last_validation``)
        the backend itself holds, where it can say. A trainer killed after a call reached the backend
        but before tracking.json was written would otherwise log that step again."""
        return {}

    def url(self) -> str | None:
        """The run's page, when the backend has one."""
        return None

    def close(self) -> None:
        return None


class MlflowSink(Sink):
    backend = "mlflow"

    def __init__(self, tracking_uri: str, experiment: str) -> None:
        self.tracking_uri, self.experiment = tracking_uri, experiment
        # MLflow's client retries each request itself 7 times with back-off doubling from 2 s (minutes
        # before a call to a server that is down returns): the channel retries, counts and reports, so
        # one call fails in seconds and TrackingReady says Unreachable. An env var the user set wins.
        for name, value in MLFLOW_HTTP_DEFAULTS.items():
            os.environ.setdefault(name, value)
        self.run_id = ""
        self.experiment_id = ""

    def _client(self) -> Any:
        import mlflow.tracking  # noqa: PLC0415 - only with spec.tracking.mlflow

        return mlflow.tracking.MlflowClient(tracking_uri=self.tracking_uri)

    def start(self, run_id: str | None, name: str, tags: dict[str, str]) -> tuple[str, bool]:
        client = self._client()
        if run_id:
            run = client.get_run(run_id)
            self.run_id, self.experiment_id = run.info.run_id, run.info.experiment_id
            return self.run_id, False
        exp = client.get_experiment_by_name(self.experiment)
        self.experiment_id = (
            exp.experiment_id if exp is not None else client.create_experiment(self.experiment)
        )
        run = client.create_run(self.experiment_id, run_name=name, tags=tags)
        self.run_id = run.info.run_id
        return self.run_id, True

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param  # noqa: PLC0415

        items = [Param(k, v[:6000]) for k, v in params.items()]
        client = self._client()
        for i in range(0, len(items), 100):  # log_batch takes at most 100 params
            client.log_batch(self.run_id, params=items[i : i + 100])

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self._log_metrics(step, {**metrics, STEP_KEY: step})

    def log_validation(self, step: int, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        # the table first: the step key marks the validation logged (see logged)
        self._client().log_text(self.run_id, json.dumps(rows, indent=1), f"validation/step_{step:08d}.json")
        self._log_metrics(step, {**metrics, VALIDATION_STEP_KEY: step})

    def _log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        import time  # noqa: PLC0415

        from mlflow.entities import Metric  # noqa: PLC0415

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        client = self._client()
        for i in range(0, len(items), 1000):
            client.log_batch(self.run_id, metrics=items[i : i + 1000])

    def logged(self) -> dict[str, int]:
        """The latest values of the step keys (MLflow's latest value of a metric is the one of its
        highest step), read once when a run is resumed."""
        latest = self._client().get_run(self.run_id).data.metrics
        names = {"last_step": STEP_KEY, "last_validation": VALIDATION_STEP_KEY}
        return {field: int(latest[key]) for field, key in names.items() if key in latest}

    def url(self) -> str | None:
        if not self.run_id or not self.tracking_uri.startswith("http"):
            return None
        return f"{self.tracking_uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}"


class WandbSink(Sink):
    backend = "wandb"

    def __init__(
        self, project: str, entity: str | None, mode: str, base_url: str | None, directory: pathlib.Path
    ) -> None:
        self.project, self.entity, self.mode, self.base_url = project, entity, mode, base_url
        self.directory = directory
        self.run: Any = None
        self.last_step = 0

    def start(self, run_id: str | None, name: str, tags: dict[str, str]) -> tuple[str, bool]:
        import wandb  # noqa: PLC0415 - only with spec.tracking.wandb

        self.directory.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(base_url=self.base_url) if self.base_url else None
        self.run = wandb.init(
            project=self.project, entity=self.entity, mode=self.mode, dir=str(self.directory),  # type: ignore[arg-type]
            id=run_id, resume="allow" if run_id else None, name=name,
            tags=[f"{k}={v}" for k, v in tags.items()], settings=settings, reinit="create_new",
        )  # fmt: skip
        self.last_step = int(getattr(self.run, "step", 0) or 0)
        return self.run.id, run_id is None

    def log_params(self, params: dict[str, str]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)
        self.last_step = step

    def log_validation(self, step: int, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        """At the last logged step when the run's result comes after it (W&B drops a step lower than the
        run's), with validation/step saying which step's weights it scored."""
        import wandb  # noqa: PLC0415

        table = wandb.Table(columns=list(COLUMNS), data=[[str(r.get(c)) for c in COLUMNS] for r in rows])
        at = max(step, self.last_step)
        self.run.log({**metrics, "validation/step": step, "validation/generations": table}, step=at)
        self.last_step = at

    def url(self) -> str | None:
        return getattr(self.run, "url", None) if self.mode == "online" else None

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()


class TensorBoardSink(Sink):
    backend = "tensorboard"

    def __init__(self, log_dir: pathlib.Path) -> None:
        self.log_dir = log_dir
        self.writer: Any = None

    def start(self, run_id: str | None, name: str, tags: dict[str, str]) -> tuple[str, bool]:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - only with spec.tracking.tensorboard

        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        if run_id is None:
            self.writer.add_text("tags", json.dumps(tags, sort_keys=True), 0)
        return run_id or name, run_id is None

    def log_params(self, params: dict[str, str]) -> None:
        text = "\n".join(f"    {k} = {v}" for k, v in sorted(params.items()))
        self.writer.add_text("params", text, 0)
        self.writer.flush()

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in {**metrics, STEP_KEY: step}.items():  # the step key last: it marks the step logged
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_validation(self, step: int, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        lines = ["| prompt | response | reward |", "|---|---|---|"]
        for r in rows:
            cells = [
                str(r.get(c, "")).replace("|", "\\|").replace("\n", " ")
                for c in ("prompt", "response", "reward")
            ]
            lines.append("| " + " | ".join(cells) + " |")
        self.writer.add_text("validation/generations", "\n".join(lines), step)
        self.writer.add_scalar(VALIDATION_STEP_KEY, step, step)  # last, as for a step
        self.writer.flush()

    def logged(self) -> dict[str, int]:
        """The highest step of each step key in the event files already in the run's directory (every
        process writes a file of its own there). A trainer killed after a step's events were flushed but
        before tracking.json said so would otherwise log that step again, and TensorBoard's reader shows
        both values (its purge applies only to a writer opened with ``purge_step``, which would hide the
        steps, not keep the first)."""
        from tensorboard.backend.event_processing import event_file_loader  # noqa: PLC0415

        names = {STEP_KEY: "last_step", VALIDATION_STEP_KEY: "last_validation"}
        out: dict[str, int] = {}
        for path in sorted(self.log_dir.glob("events.out.tfevents.*")):
            for event in event_file_loader.EventFileLoader(str(path)).Load():  # a torn last record ends it
                for value in event.summary.value:
                    if value.tag in names:
                        field = names[value.tag]
                        out[field] = max(out.get(field, -1), int(event.step))
        return out

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
