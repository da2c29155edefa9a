"""A rollout replica's weight-sync side without vLLM: the same ReplicaLink and GlooWeightReceiver
the rollout uses (real TCPStore, real gloo group), run as a separate process by
tests/dataplane/test_weightsync.py so tests can SIGKILL / SIGSTOP it.

    python weightsync_peer.py HOST PORT REPLICA

Prints one JSON line per event to stdout: {"event": "hello"|"loaded"|"failed"|"left", ...}. SIGTERM
makes it say bye (``ReplicaLink.leave``, as a stopping rollout does) and exit.

The other side, for tests/dataplane/test_weightsync_gpu.py: trainer rank 0 in a process of its own (so it
can have a GPU of its own through CUDA_VISIBLE_DEVICES), the job's real sender (``nccl.NcclWeightSender``
for weightSync.backend nccl) sending the tiny model's weights perturbed by a seed:

    python weightsync_peer.py sender JOB_JSON MODEL_DIR

Reads one JSON order a line on stdin, {"version": V, "seed": S, "dtype": "bfloat16"}, waits for a replica to
say hello, syncs and prints {"event": "synced", "version", "members", "dropped", "generation", "checksum",
"nbytes", "transfer_s", "total_s"} (``checksum.of`` what it sent; the SyncReport's bytes, broadcast time
and whole round, for tools/asyncrl_testing/bench_weightsync.py --backend nccl); "listening" once its
store is up. Lines that are not JSON (vLLM logs to stdout) are the reader's to skip.
"""

from __future__ import annotations

import json
import signal
import sys
import time


def main() -> None:
    from asyncrl_workloads.weightsync import checksum, replica
    from asyncrl_workloads.weightsync import receiver as receiver_mod

    host, port, replica_index = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    link = replica.ReplicaLink(host, port, replica_index, connect_timeout=30)
    receiver = None
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda sig, frame: stopping.append(sig))  # as the rollout: bye, then exit
    print(json.dumps({"event": "hello", "incarnation": link.incarnation}), flush=True)
    while not stopping:
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
    link.leave()
    print(json.dumps({"event": "left"}), flush=True)


def sender_main(job_json: str, model_dir: str) -> None:
    import pathlib

    import torch
    from asyncrl_api import config as config_mod
    from asyncrl_testing import vllm_round
    from asyncrl_workloads.weightsync import base, checksum, nccl

    torch.cuda.set_device(0)
    cfg = config_mod.JobConfig.model_validate_json(pathlib.Path(job_json).read_text())
    trainer = nccl.NcclWeightSender(cfg)
    print(json.dumps({"event": "listening"}), flush=True)
    for line in sys.stdin:
        order = json.loads(line)
        deadline = time.monotonic() + 300
        while not trainer.members():
            if time.monotonic() > deadline:
                raise SystemExit("no rollout replica said hello within 300 s")
            time.sleep(0.05)
        dtype = getattr(torch, order["dtype"])
        named = vllm_round.perturbed(pathlib.Path(model_dir), order["seed"], dtype, device="cuda")
        # as the FSDP2 trainer sends: the plan first, the tensors taken while vLLM packs them
        plan = [base.TensorMeta.of(n, t.dtype, t.shape) for n, t in named]
        stream = base.Stream(plan, iter(named))
        report = trainer.sync(order["version"], stream)
        stream.drain()
        print(json.dumps({"event": "synced", "version": report.version, "members": report.members,
                          "dropped": report.dropped, "generation": report.generation,
                          "checksum": checksum.of(named), "nbytes": report.nbytes,
                          "transfer_s": report.transfer_seconds, "total_s": report.total_seconds}),
              flush=True)  # fmt: skip
    trainer.close()


if __name__ == "__main__":
    if sys.argv[1] == "sender":
        sender_main(sys.argv[2], sys.argv[3])
    else:
        main()
