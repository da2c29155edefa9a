"""A rollout replica's weight-sync side without vLLM: the same ReplicaLink and GlooWeightReceiver
the rollout uses (real TCPStore, real gloo group), run as a separate process by
tests/dataplane/test_weightsync.py so tests can SIGKILL / SIGSTOP it.

    python weightsync_peer.py HOST PORT REPLICA

Prints one JSON line per event to stdout: {"event": "hello"|"loaded"|"failed", ...}.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    from asyncrl_workloads.weightsync import checksum, replica
    from asyncrl_workloads.weightsync import receiver as receiver_mod

    host, port, replica_index = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    link = replica.ReplicaLink(host, port, replica_index, connect_timeout=30)
    receiver = None
    print(json.dumps({"event": "hello", "incarnation": link.incarnation}), flush=True)
    while True:
        try:
            plan = link.poll()
        except replica.TrainerUnreachable:
            time.sleep(0.2)
            continue
        if receiver is None:
            receiver = receiver_mod.connect(host, port, replica_index, link.incarnation, 30)
        if plan is None or not plan.includes(link.replica, link.incarnation):
            time.sleep(0.01)
            continue
        link.ready(plan)
        roster = link.roster(plan)
        if roster.member(link.replica, link.incarnation) is None:
            link.rejoin()
            continue
        try:
            tensors = receiver.receive(plan, roster, 0)
        except Exception as exc:  # deadline or broken group: keep the old weights, ask to rejoin
            print(
                json.dumps({"event": "failed", "version": plan.version, "error": str(exc)[:200]}), flush=True
            )
            link.rejoin()
            continue
        digest = checksum.of(tensors)
        link.ack(plan, digest, 0.0)
        print(json.dumps({"event": "loaded", "version": plan.version, "generation": roster.generation,
                          "checksum": digest}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
