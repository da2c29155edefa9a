"""`asyncrl-trainer --config /etc/asyncrl/job.json`: the trainer pod's command (torchrun-compatible).

Parses and checks the rendered config before importing torch, so a bad config fails in a second with one
line on stderr and exit code 2; a startup failure (NATS unreachable or refusing the job's credentials,
...) exits 1 with one line. A job with
spec.teacher: rank 0 checks the teacher first (prompt logprobs, trainer/teacher.py); a failed check, or a
teacher that fails for giveUpAfterSeconds while training, exits 3 with the classified line on stderr and
in the termination message (the operator's EndpointsReady condition).
Identity comes from the environment: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (torchrun
or the operator's StatefulSet), ASYNCRL_METRICS_PORT, ASYNCRL_PROGRESS_FILE, ASYNCRL_STEP_LOG (local).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import urllib.parse

from asyncrl_api import config as config_mod

from asyncrl_workloads.endpoints import settings
from asyncrl_workloads.entrypoints import common

ENDPOINT_EXIT_CODE = 3
"""A teacher that failed its check or gave up (rollouts use the same code for the judge)."""


def _fail(code: int, message: str) -> int:
    return common.fail("asyncrl-trainer", code, message)


def _reachable(url: str, timeout_s: float = 5.0) -> str | None:
    """None if a TCP connection to the NATS URL's host:port succeeds, else why not."""
    parsed = urllib.parse.urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "", parsed.port or 4222), timeout=timeout_s):
            return None
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asyncrl-trainer")
    parser.add_argument("--config", default=config_mod.MOUNT_PATH, help="rendered job config (job.json)")
    parser.add_argument("--version", action="version", version=common.version(parser.prog))
    args = parser.parse_args(argv)
    try:
        cfg = common.load_config(args.config)
    except common.Refused as exc:
        return _fail(exc.code, str(exc))
    if os.environ.get("RANK", "0") == "0":  # only rank 0 talks to NATS; fail before loading torch
        why = _reachable(cfg.endpoints.nats_url)
        if why is not None:
            return _fail(1, f"endpoints.natsUrl: cannot reach NATS at {cfg.endpoints.nats_url}: {why}")
        refused = _check_teacher(cfg)
        if refused is None:
            refused = _check_bus(cfg)
        if refused is not None:
            return refused
    common.setup_logging("%(asctime)s trainer %(levelname)s %(name)s: %(message)s")
    from asyncrl_workloads.trainer import main as trainer_main  # heavy: torch, transformers
    from asyncrl_workloads.trainer import teacher

    try:
        trainer_main.run(cfg)
    except trainer_main.StartupError as exc:
        return _fail(1, str(exc))
    except teacher.GaveUp as exc:
        return _fail(ENDPOINT_EXIT_CODE, str(exc))
    return 0


def _check_bus(cfg: config_mod.JobConfig) -> int | None:
    """Rank 0 connects once with the job's NATS credentials (bus/access.py) before torch loads, so a
    refused or unreadable ``.creds`` file fails in a second; the exit code when it does."""
    from asyncrl_workloads.bus import access  # nats-py only

    async def probe() -> None:
        nc = await access.connect(cfg)
        await nc.close()

    try:
        asyncio.run(probe())
    except access.Failed as exc:
        return _fail(1, str(exc))
    return None


def _check_teacher(cfg: config_mod.JobConfig) -> int | None:
    """A teacher job's prompt-logprobs check (trainer/teacher.py); the exit code when it fails."""
    if cfg.spec.teacher is None:
        return None
    from asyncrl_workloads.trainer import teacher  # the openai SDK: loaded only for a teacher job here

    try:
        teacher.preflight(settings.teacher(cfg.spec))
    except teacher.GaveUp as exc:
        return _fail(ENDPOINT_EXIT_CODE, str(exc))
    return None


if __name__ == "__main__":
    sys.exit(main())
