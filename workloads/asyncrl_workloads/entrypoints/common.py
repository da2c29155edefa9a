"""What every pod entry point does before importing heavy code: read the rendered job config and
check that the model it names is there. Called by entrypoints/rollout.py and entrypoints/trainer.py.

Failures are `Refused(code, message)`: the entry point prints one line (also its termination message)
and exits with `code` (2 for bad configuration, 1 for a startup failure, 3 for an endpoint).
"""

from __future__ import annotations

import importlib.metadata
import logging
import pathlib
import re
import sys

import pydantic
from asyncrl_api import config as config_mod

from asyncrl_workloads import termination


class Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def version(prog: str) -> str:
    """`PROG VERSION`, the installed asyncrl distribution's version (what `--version` prints)."""
    return f"{prog} {importlib.metadata.version('asyncrl')}"


def fail(prog: str, code: int, message: str) -> int:
    """Print the one line and make it the container's termination message, which the operator shows in
    the job's status (the Degraded condition; an endpoint's classified line in EndpointsReady)."""
    print(f"{prog}: {message}", file=sys.stderr)
    termination.write(message)
    return code


def load_config(path: str) -> config_mod.JobConfig:
    """The rendered job config, with a model present or to be created (else Refused, exit 2)."""
    try:
        cfg = config_mod.load(path)
    except OSError as exc:
        raise Refused(2, f"--config: cannot read {path}: {exc.strerror}") from None
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        raise Refused(2, f"{path}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    model = pathlib.Path(cfg.spec.model.path)
    if not (model / "config.json").is_file() and cfg.spec.model.create is None:
        raise Refused(2, f"spec.model.path: no model at {model} (config.json missing){hub_hint(model)}")
    return cfg


HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
"""A Hugging Face Hub id (owner/name): a relative path of two parts."""


def hub_hint(model: pathlib.Path) -> str:
    """What to do when spec.model.path looks like a Hub id: nothing is downloaded at run time."""
    if model.is_absolute() or not HUB_ID.fullmatch(str(model)):
        return ""
    return (
        f"; {model} looks like a Hugging Face Hub id: nothing is downloaded at run time, save it on a volume"
        f" first (huggingface-cli download {model} --local-dir /models/{model.name}) and set that path"
    )


QUIET_LOGGERS = ("httpx", "httpx2", "openai")
"""HTTP clients that log every request at INFO: the judge and teacher send thousands (the endpoint
metrics count them instead); their warnings and errors still show."""


def setup_logging(fmt: str) -> None:
    """INFO logging to stderr in the pod's format, the HTTP clients' per-request lines left out."""
    logging.basicConfig(level=logging.INFO, format=fmt)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
