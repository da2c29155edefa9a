"""`asyncrl-rollout --config /etc/asyncrl/job.json`: the rollout pod's command.

Parses and checks the rendered config (model path, reward function, prompt source) before
importing vLLM, so a bad config fails in a second with one line on stderr and exit code 2; a
startup failure (NATS unreachable, engine failed) exits 1 with one line; a judge endpoint that fails its
preflight, or keeps failing for giveUpAfterSeconds, exits 3 with its classified line. The line is also the
container's termination message, which the operator shows in the job's conditions. Identity comes from the
environment: ASYNCRL_REPLICA (pod ordinal), ASYNCRL_METRICS_PORT (local runner override).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from asyncrl_api import config as config_mod
from asyncrl_api import infra

from asyncrl_workloads.entrypoints import common


def _fail(code: int, message: str) -> int:
    return common.fail("asyncrl-rollout", code, message)


def code_hint(message: str, code: infra.CodeSpec | None) -> str:
    """A failed import of a job with spec.code, said with what its directory holds (or that it is not
    there), so a missing or misnamed file is one line naming both fields."""
    if code is None or "cannot import module" not in message:
        return message
    where = code.directory()
    field = "spec.code.path" if code.path else "spec.code.configMap"
    try:
        files = sorted(p.name for p in pathlib.Path(where).iterdir() if not p.name.startswith("."))
    except OSError:
        local = " (a ConfigMap is a cluster object: asyncrl run takes code.path)" if code.config_map else ""
        return f"{message}; {field}: {where} is not there{local}"
    return f"{message}; {field} puts {where} on PYTHONPATH, holding {', '.join(files) or 'no files'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asyncrl-rollout")
    parser.add_argument("--config", default=config_mod.MOUNT_PATH, help="rendered job config (job.json)")
    parser.add_argument("--version", action="version", version=common.version(parser.prog))
    args = parser.parse_args(argv)
    try:
        cfg = common.load_config(args.config)
    except common.Refused as exc:
        return _fail(exc.code, str(exc))
    try:
        replica = int(os.environ.get("ASYNCRL_REPLICA", "0"))
    except ValueError:
        return _fail(2, f"ASYNCRL_REPLICA: not an integer: {os.environ['ASYNCRL_REPLICA']!r}")
    from asyncrl_workloads.episode import tools as tools_mod  # light: stdlib + the job's tool modules
    from asyncrl_workloads.rewards import loader, scorer
    from asyncrl_workloads.tasks import source

    spec = cfg.spec
    try:
        reward_fn = scorer.resolve_function(spec.reward, spec.data.prompts)
        needs = scorer.record_fields(spec.reward, reward_fn)  # e.g. a verl function's ground truth
        chat = spec.data.format == "chat"
        records = source.load_prompts(spec.data.prompts, spec.data.prompt_key, chat=chat, required=needs)
        tools = tools_mod.load_tools(spec.agent.tools) if spec.agent is not None else {}
        validation: Sequence[Mapping[str, Any]] = ()  # replica 0 runs it (rollout/validation.py)
        if spec.data.validation is not None and replica == 0:
            validation = source.load_prompts(
                spec.data.validation, spec.data.prompt_key, "spec.data.validation", chat, needs
            )
        if spec.agent is not None:
            tools_mod.check_record_tools(records, tools)
            tools_mod.check_record_tools(validation, tools, "spec.data.validation")
    except (loader.RewardLoadError, source.PromptSourceError, tools_mod.ToolLoadError) as exc:
        return _fail(2, code_hint(str(exc), spec.code))
    common.setup_logging(f"%(asctime)s rollout-{replica} %(levelname)s %(name)s: %(message)s")
    from asyncrl_workloads.endpoints import errors
    from asyncrl_workloads.rollout import main as rollout_main  # heavy: vLLM, torch

    try:
        rollout_main.run(cfg, replica, reward_fn, records, tools, validation)
    except rollout_main.StartupError as exc:
        return _fail(exc.code, str(exc))
    except errors.EndpointError as exc:  # the judge failed for giveUpAfterSeconds
        return _fail(3, exc.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
