"""``asyncrl-operator``: run the kopf operator with a liveness endpoint and a Prometheus metrics port
that also answers the readiness probe (/readyz: the resync loop lists jobs, ``metrics.ready``).

The console script (pyproject) and the operator image's entry point. Parses flags, starts the metrics
server, imports the handlers and hands over to ``kopf.run`` (standalone: one replica, no peering).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys

import kopf

from asyncrl_operator import handlers, metrics


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asyncrl-operator", description="The AsyncRLJob operator.")
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable); default: the whole cluster",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=9090, help="/metrics and readiness /readyz port (0: off)"
    )
    parser.add_argument(
        "--liveness-port", type=int, default=8080, help="kopf liveness /healthz port (0: off)"
    )
    parser.add_argument(
        "--resync-seconds",
        type=float,
        default=30.0,
        help="reconcile every job this often (drift, TTL, Stalled)",
    )
    parser.add_argument("--workers", type=int, default=8, help="threads for sync handlers")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {importlib.metadata.version('asyncrl')}"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:  # kopf logs every handled event at INFO: costly at hundreds of events per second
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if args.metrics_port:
        # Ready while a resync listing succeeded within 4 ticks of the loop (one tick is a quarter of
        # --resync-seconds), and at least a minute: a slow API server is not yet a lost one.
        metrics.serve(args.metrics_port, ready_window=max(60.0, 4 * max(1.0, args.resync_seconds / 4)))
    liveness = f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None
    memo = kopf.Memo(resync_seconds=args.resync_seconds, namespaces=args.namespace, workers=args.workers)
    logging.getLogger(__name__).info("handlers registered from %s", handlers.__name__)
    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=list(args.namespace),
        liveness_endpoint=liveness,
        memo=memo,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
