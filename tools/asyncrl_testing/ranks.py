"""The environment of one torch.distributed rank a test starts as a subprocess (as torchrun would set it),
and a free port for its rendezvous: shared by the dataplane tests that run trainer workers."""

from __future__ import annotations

import os
import pathlib

from asyncrl_workloads.local.process import free_port

REPO = pathlib.Path(__file__).resolve().parents[2]

__all__ = ["env_for", "free_port"]


def env_for(rank: int, world: int, port: int) -> dict[str, str]:
    """This process's environment plus rank ``rank`` of ``world`` (one local rank each, gloo on 127.0.0.1
    at ``port``), one OpenMP thread, and the repository's packages on PYTHONPATH."""
    return {
        **os.environ,
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO / "workloads"), str(REPO / "tools")]),
    }
