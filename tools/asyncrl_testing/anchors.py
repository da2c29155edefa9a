"""The anchors' own math for the golden tests (tests/unit/test_algorithms_golden.py): verl 0.9.1's
core_algos and torch_functional, AReaL 1.0.4's functional, data (Normalization, KLEstimator) and cli_args
(NormConfig, RejectionSamplingConfig).

Both wheels are installed with `pip install --no-deps` (tools/setup.sh): their math is plain torch and
numpy, but the modules that hold it import their distributed runtimes at module level. `load()` imports
them once per process with these stand-ins in sys.modules; none of them is used by the math compared:

  verl
    verl (its package __init__)    not run: it calls logging.basicConfig on the root logger, sets a RAY_*
                                   environment variable and loads verl.plugins entry points
    ray                            verl.protocol (DataProto), verl.single_controller (workers)
    tensordict                     verl.protocol, verl.utils.tensordict_utils, torch_functional's
                                   TensorDict helpers
    tensordict.tensorclass         verl.utils.transferqueue_utils, verl.utils.model (NonTensorData)
    omegaconf                      DictConfig in type hints, MISSING as dataclass defaults (ActorConfig)
    codetiming                     Timer, in verl.utils.profiler.performance
  AReaL
    areal, areal.infra (their package __init__s)
                                   not run: they import AReaL's controllers, schedulers and workflows
                                   (ray, aiofiles, ...)
    areal.utils.logging            stdlib logging.getLogger in its place: AReaL's replaces the process's
                                   root logger and manager on every getLogger (dictConfig with
                                   disable_existing_loggers), which would break pytest's log capture
    areal.utils.name_resolve       its Ray-backed name service, imported by cli_args
    hydra, hydra.core, hydra.core.global_hydra, omegaconf
                                   cli_args's YAML/CLI config loading
    torchdata, torchdata.stateful_dataloader
                                   areal.utils.data's dataloader helpers

A stand-in answers every attribute with an inert placeholder class (omegaconf.MISSING is its "???");
a library that is installed after all is used as it is.
After the import, sys.modules is restored: the stand-ins and the verl/areal entries leave it (the
modules live on in the returned Anchors), so no later import sees a fake ray or omegaconf. Other
libraries the anchors imported for real (numba, einops, transformers) stay loaded. One import-time
effect is undone: areal.api.cli_args calls uvloop.install(), and the asyncio event loop policy it
replaced is put back (with uvloop's, the asyncio tests' timeouts behave differently).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import importlib.machinery
import importlib.util
import logging
import pathlib
import sys
import types

VERL = "verl==0.9.1"
AREAL = "areal==1.0.4"

_THIRD_PARTY = (
    "ray",
    "tensordict",
    "tensordict.tensorclass",
    "omegaconf",
    "codetiming",
    "hydra",
    "hydra.core",
    "hydra.core.global_hydra",
    "torchdata",
    "torchdata.stateful_dataloader",
)
_SHELLS = ("verl", "areal", "areal.infra")
"""Packages whose __init__ is not run: their submodules load from the installed files."""


class _StandIn(types.ModuleType):
    """A module whose every public attribute is an inert placeholder class."""

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        placeholder = type(name, (), {"__module__": self.__name__})
        setattr(self, name, placeholder)
        return placeholder


def _package(name: str, path: pathlib.Path | None) -> types.ModuleType:
    module = _StandIn(name) if path is None else types.ModuleType(name)
    locations = [str(path)] if path is not None else []
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = locations
    module.__spec__ = spec
    module.__path__ = locations
    return module


def _get_logger(name: str | None = None, *args: object, **kwargs: object) -> logging.Logger:
    return logging.getLogger(name)


@dataclasses.dataclass(frozen=True)
class Anchors:
    core_algos: types.ModuleType
    """verl.trainer.ppo.core_algos"""
    verl_functional: types.ModuleType
    """verl.utils.torch_functional"""
    verl_actor_config: type
    """verl.workers.config.ActorConfig"""
    areal_functional: types.ModuleType
    """areal.utils.functional.functional"""
    areal_data: types.ModuleType
    """areal.utils.data"""
    areal_cli_args: types.ModuleType
    """areal.api.cli_args"""


def missing() -> str | None:
    """Why the anchors cannot load (a wheel is not installed), or None."""
    absent = [pin for pin in (VERL, AREAL) if importlib.util.find_spec(pin.split("==")[0]) is None]
    return f"not installed: {', '.join(absent)} (tools/setup.sh installs them)" if absent else None


def _install_stand_ins() -> None:
    absent = [name for name in _THIRD_PARTY if importlib.util.find_spec(name.split(".")[0]) is None]
    for name in absent:  # an installed one is used as it is
        sys.modules[name] = _package(name, None)
    omegaconf = sys.modules.get("omegaconf")
    if isinstance(omegaconf, _StandIn):
        setattr(omegaconf, "MISSING", "???")  # noqa: B010 (omegaconf's own value)
    for name in _SHELLS:
        root = importlib.util.find_spec(name.split(".")[0])
        assert root is not None and root.submodule_search_locations is not None, name
        base = pathlib.Path(next(iter(root.submodule_search_locations)))
        sys.modules[name] = _package(name, base.joinpath(*name.split(".")[1:]))
    areal_logging = types.ModuleType("areal.utils.logging")
    setattr(areal_logging, "getLogger", _get_logger)  # noqa: B010
    sys.modules["areal.utils.logging"] = areal_logging
    sys.modules["areal.utils.name_resolve"] = types.ModuleType("areal.utils.name_resolve")


@functools.cache
def load() -> Anchors:
    """Import the anchors' math, once per process: a few seconds, mostly transformers' auto classes (which
    verl's worker configs import) and numba (AReaL's sequence packing)."""
    reason = missing()
    if reason is not None:
        raise ModuleNotFoundError(reason)
    saved = dict(sys.modules)
    policy = asyncio.get_event_loop_policy()
    try:
        _install_stand_ins()
        core_algos = importlib.import_module("verl.trainer.ppo.core_algos")
        anchors = Anchors(
            core_algos=core_algos,
            verl_functional=importlib.import_module("verl.utils.torch_functional"),
            verl_actor_config=importlib.import_module("verl.workers.config").ActorConfig,
            areal_functional=importlib.import_module("areal.utils.functional.functional"),
            areal_data=importlib.import_module("areal.utils.data"),
            areal_cli_args=importlib.import_module("areal.api.cli_args"),
        )
    finally:
        asyncio.set_event_loop_policy(policy)
        for name in list(sys.modules):
            if name in saved:
                sys.modules[name] = saved[name]
            elif isinstance(sys.modules[name], _StandIn) or name.split(".")[0] in ("verl", "areal"):
                del sys.modules[name]
    return anchors
