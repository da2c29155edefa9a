"""`asyncrl`: the command for humans.

  asyncrl run examples/tiny-cpu.yaml [--run-dir DIR] [--max-steps N] [--rollout-replicas N] [--timeout S]
              [--containers]
  asyncrl render JOB.yaml [--namespace NS]
  asyncrl agent [--n N] [--concurrency C] [--timeout S] [--groups G] -- CMD ARGS...
  asyncrl import verl|areal CONFIG.yaml [KEY=VALUE ...] [--out JOB.yaml] [--name N] [--tool REF ...]
                 [--reward REF]
  asyncrl plot RUN_DIR [--out DIR]
  asyncrl export CHECKPOINT OUT [--model DIR] [--dtype auto|bfloat16|float16|float32] [--adapter DIR]

The console script named in pyproject.toml. `run` executes a job locally through `local.runner` (the
operator's rendered pods as local processes); `plot` renders a run's curves through `local.plot`;
`export` writes a trainer checkpoint as a Hugging Face model directory through `trainer.export`; `render`
prints every object the operator would create for a job file, after the operator's own admission
(`asyncrl_operator.admission`, whose messages are the ones `kubectl describe arj` would show); `import`
translates a verl or AReaL config through `importer.translate` (pure) and checks the job with the same
admission. Errors
a user can fix (a bad job file, a missing model, a port or binary problem) end with one line and a
non-zero exit code, not a stack trace.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import yaml

from asyncrl_workloads import agentdriver


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncrl", description="Fully asynchronous RL for LLMs.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run an AsyncRLJob on this machine (no cluster)")
    run.add_argument("job", type=pathlib.Path, help="AsyncRLJob YAML, e.g. examples/tiny-cpu.yaml")
    run.add_argument(
        "--run-dir",
        type=pathlib.Path,
        help="where logs, metrics and checkpoints go "
        "(default runs/<job>-<time>; an existing run dir resumes from its checkpoint)",
    )
    run.add_argument("--max-steps", type=int, help="override spec.maxSteps")
    run.add_argument("--rollout-replicas", type=int, help="override spec.rollout.replicas")
    run.add_argument("--timeout", type=float, help="stop after this many seconds")
    run.add_argument("--poll", type=float, default=2.0, help="progress poll interval in seconds")
    run.add_argument(
        "--keep-checkpoint-path",
        action="store_true",
        help="use spec.trainer.checkpoint.path as written instead of <run-dir>/checkpoints",
    )
    run.add_argument(
        "--containers",
        action="store_true",
        help="run each pod in its image with podman or docker (ASYNCRL_CONTAINER_ENGINE overrides): "
        "the rendered image, command, env and user, host network",
    )
    run.add_argument(
        "--mlflow",
        metavar="URI",
        help="log the run to this MLflow tracking server (spec.tracking.mlflow.trackingURI), e.g. "
        "http://127.0.0.1:5000",
    )
    render = commands.add_parser(
        "render", help="print every object the operator would create for a job (like helm template)"
    )
    render.add_argument("job", type=pathlib.Path, help="AsyncRLJob YAML (other documents are skipped)")
    render.add_argument(
        "--namespace", "-n", help="the namespace to render for (default: the file's, else default)"
    )
    imp = commands.add_parser(
        "import", help="write an AsyncRLJob from a verl or AReaL config, with the table of what maps where"
    )
    imp.add_argument("kind", choices=["verl", "areal"], help="whose config it is")
    imp.add_argument("config", type=pathlib.Path, help="the YAML config (verl: the resolved one it prints)")
    imp.add_argument("overrides", nargs="*", help="Hydra-style key=value overrides, as on their command line")
    imp.add_argument("--out", "-o", type=pathlib.Path, help="write the job here (default: stdout)")
    imp.add_argument("--name", help="metadata.name (default: from the experiment name)")
    imp.add_argument("--tool", action="append", default=[], help="an agent tool as pkg.mod:fn (repeatable)")
    imp.add_argument("--reward", help="reward.function as pkg.mod:fn when the config names none")
    agent = commands.add_parser(
        "agent", help="run a command-line agent once per gateway session (Claude Code, any CLI)"
    )
    agentdriver.add_arguments(agent)
    plot = commands.add_parser("plot", help="render PNG curves of a run's reward, staleness, throughput")
    plot.add_argument("run_dir", type=pathlib.Path)
    plot.add_argument("--out", type=pathlib.Path, help="output directory (default: the run dir)")
    export = commands.add_parser(
        "export", help="write a trainer checkpoint as a Hugging Face model (vLLM serves it)"
    )
    export.add_argument(
        "checkpoint",
        type=pathlib.Path,
        help="a step-NNNNNNNN directory, or the checkpoint path (newest step)",
    )
    export.add_argument("out", type=pathlib.Path, help="output directory (absent or empty)")
    export.add_argument(
        "--model", type=pathlib.Path, help="the job's spec.model.path (default: from the checkpoint)"
    )
    export.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto",
                        help="weights' dtype (auto: the base model's torch_dtype)")  # fmt: skip
    export.add_argument(
        "--adapter", type=pathlib.Path, help="a LoRA job's checkpoint: also write its peft adapter here"
    )
    return parser


def _export(args: argparse.Namespace) -> int:
    from asyncrl_workloads.trainer import export

    try:
        step = export.export(args.checkpoint, args.out, args.model, args.dtype, args.adapter)
    except export.ExportError as exc:
        print(f"asyncrl export: {exc}", file=sys.stderr)
        return 2
    print(f"exported {step} to {args.out}")
    return 0


def _render(args: argparse.Namespace) -> int:
    """The operator's render() of each AsyncRLJob in the file, as YAML; exit 2 with the admission message
    (file, document, field) when a job would be refused. The ownerReferences' uid stays empty: the
    apiserver assigns it when the job is applied."""
    from asyncrl_api import models
    from asyncrl_operator import admission, render

    def fail(why: str) -> int:
        print(f"asyncrl render: {args.job}: {why}", file=sys.stderr)
        return 2

    try:
        documents = [d for d in yaml.safe_load_all(args.job.read_text()) if d is not None]
    except OSError as exc:
        return fail(f"cannot read ({exc.strerror})")
    except yaml.YAMLError as exc:
        return fail(f"not valid YAML ({exc})")
    out: list[dict[str, object]] = []
    for index, body in enumerate(documents):
        if isinstance(body, dict) and body.get("kind") != models.KIND:
            print(f"asyncrl render: skipped document {index} (kind {body.get('kind')!r})", file=sys.stderr)
            continue
        where = f"document {index}: " if len(documents) > 1 else ""
        if (problem := admission.check_kind(body)) is not None:
            return fail(where + problem)
        meta = body.setdefault("metadata", {})
        if args.namespace and meta.get("namespace") not in (None, args.namespace):
            said = f"metadata.namespace {meta['namespace']!r} does not match --namespace {args.namespace!r}"
            return fail(where + said)
        meta["namespace"] = args.namespace or meta.get("namespace") or "default"
        job, why = admission.parse(body)
        if job is None:
            return fail(where + (why or "invalid spec"))
        out += render.render(job)
    if not out:
        return fail(f"no {models.KIND} in the file")
    sys.stdout.write(yaml.dump_all(out, Dumper=_BlockDumper, sort_keys=False))
    return 0


def _import(args: argparse.Namespace) -> int:
    """The job on stdout (or --out) and the mapping table on stderr (stdout with --out); exit 2 when the
    config cannot be read or the job would not pass admission (the file is still written, to edit)."""
    import os

    from asyncrl_operator import admission

    from asyncrl_workloads.importer import hydra, report, translate

    def fail(why: str) -> int:
        print(f"asyncrl import: {args.config}: {why}", file=sys.stderr)
        return 2

    try:
        config = yaml.safe_load(args.config.read_text())
    except OSError as exc:
        return fail(f"cannot read ({exc.strerror})")
    except yaml.YAMLError as exc:
        return fail(f"not valid YAML ({exc})")
    if not isinstance(config, dict):
        return fail("expected a mapping (a Hydra/OmegaConf config)")
    try:
        result = translate.translate(
            args.kind, config, overrides=args.overrides, env=os.environ, name=args.name,
            tools=args.tool, reward=args.reward,
        )  # fmt: skip
    except hydra.OverrideError as exc:
        return fail(str(exc))
    text = yaml.dump(result.job, Dumper=_BlockDumper, sort_keys=False)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    print(report.table(result), end="", file=sys.stdout if args.out else sys.stderr)
    body = {**result.job, "metadata": {**result.job["metadata"], "namespace": "default"}}
    _, why = admission.parse(body)
    if why is not None:
        return fail(f"the job does not pass admission yet: {why}")
    return 0


def _block_strings(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    """Multi-line strings (the ConfigMap's job.json) as literal blocks, as helm template prints them."""
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


class _BlockDumper(yaml.SafeDumper):
    pass


_BlockDumper.add_representer(str, _block_strings)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not (args.command == "import" and all("=" in e or e.startswith("~") for e in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:  # import's key=value overrides after its options
        args.overrides += extra
    if args.command == "export":
        return _export(args)
    if args.command == "render":
        return _render(args)
    if args.command == "agent":
        return agentdriver.main(args)
    if args.command == "import":
        return _import(args)
    if args.command == "plot":
        from asyncrl_workloads.local import plot

        try:
            for path in plot.plot(args.run_dir, args.out):
                print(path)
        except plot.PlotError as exc:
            print(f"asyncrl plot: {exc}", file=sys.stderr)
            return 2
        return 0

    from asyncrl_workloads import tinymodel
    from asyncrl_workloads.local import containers, natsserver, pods, runner

    options = runner.Options(
        job_file=args.job,
        run_dir=args.run_dir,
        max_steps=args.max_steps,
        rollout_replicas=args.rollout_replicas,
        timeout_s=args.timeout,
        poll_interval_s=args.poll,
        keep_checkpoint_path=args.keep_checkpoint_path,
        containers=args.containers,
        mlflow=args.mlflow,
    )
    try:
        return runner.run(options)
    except (runner.JobFileError, tinymodel.TinyModelError, pods.RenderedJobError) as exc:
        print(f"asyncrl run: {exc}", file=sys.stderr)
        return 2
    except containers.EngineError as exc:
        print(f"asyncrl run: {exc}", file=sys.stderr)
        return 1
    except natsserver.NatsServerError as exc:
        print(f"asyncrl run: embedded NATS: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
