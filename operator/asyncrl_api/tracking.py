"""Experiment tracking: ``spec.tracking`` (MLflow, Weights & Biases, TensorBoard).

Imported by ``asyncrl_api.models`` (``AsyncRLJobSpec.tracking``), the operator's ``render.secrets`` (each
credential becomes a ``secretKeyRef`` env var of the trainer under the library's own variable name) and
the trainer's ``asyncrl_workloads.tracking`` room, which trainer rank 0 feeds from its step log and
validation results. Any of the three may be set; each is its own run, resumed after a restart.
"""

from __future__ import annotations

from typing import Literal

import pydantic

from asyncrl_api import base, task

MLFLOW_TOKEN_ENV = "MLFLOW_TRACKING_TOKEN"
MLFLOW_USERNAME_ENV = "MLFLOW_TRACKING_USERNAME"
MLFLOW_PASSWORD_ENV = "MLFLOW_TRACKING_PASSWORD"
WANDB_API_KEY_ENV = "WANDB_API_KEY"


class MlflowSpec(base.APIModel):
    """An MLflow tracking server: one run per job, in ``experiment``."""

    tracking_uri: str = pydantic.Field(alias="trackingURI", min_length=1, max_length=2048)
    """The tracking server, e.g. http://mlflow.mlops.svc:5000."""
    experiment: str = pydantic.Field(min_length=1, max_length=500)
    """Experiment name (created when missing)."""
    run_name: str | None = pydantic.Field(default=None, min_length=1, max_length=250)
    """Run name; unset = the job's name."""
    token_secret: task.SecretKeyRef | None = None
    """Secret key holding a bearer token (MLFLOW_TRACKING_TOKEN)."""
    username_secret: task.SecretKeyRef | None = None
    """Secret key holding the basic-auth user (MLFLOW_TRACKING_USERNAME)."""
    password_secret: task.SecretKeyRef | None = None
    """Secret key holding the basic-auth password (MLFLOW_TRACKING_PASSWORD)."""


class WandbSpec(base.APIModel):
    """Weights & Biases: one run per job."""

    project: str = pydantic.Field(min_length=1, max_length=128)
    """Project name."""
    entity: str | None = pydantic.Field(default=None, min_length=1, max_length=128)
    """Team or user; unset = the API key's default entity."""
    mode: Literal["online", "offline"] = "online"
    """online: sent as it is logged; offline: written under the trainer's checkpoint path (wandb/), to be
    uploaded later with ``wandb sync``."""
    base_url: str | None = pydantic.Field(
        default=None, alias="baseURL", max_length=2048, pattern=r"^https?://"
    )
    """A self-hosted W&B server; unset = api.wandb.ai."""
    api_key_secret: task.SecretKeyRef | None = None
    """Secret key holding the API key (WANDB_API_KEY); not needed offline."""


class TensorBoardSpec(base.APIModel):
    """TensorBoard event files."""

    log_dir: str = pydantic.Field(min_length=2, max_length=4096, pattern=r"^/")
    """Absolute directory on a mounted volume (spec.volumes); the run's events go to <logDir>/<job>."""


class TrackingSpec(base.APIModel):
    """Where trainer rank 0 logs the run: per step the step log's metrics, per validation run the reward
    and a table of generations, once the spec, image tags and asyncrl version. A tracker that fails never
    stops training: it is retried with back-off and counted (asyncrl_tracking_errors_total)."""

    mlflow: MlflowSpec | None = None
    """An MLflow tracking server."""
    wandb: WandbSpec | None = None
    """Weights & Biases."""
    tensorboard: TensorBoardSpec | None = None
    """TensorBoard event files."""
