"""Running a job on one machine without a cluster: the embedded nats-server, local child processes,
and the `asyncrl run` runner that executes the operator's rendered pods as local processes."""
