"""Trajectory bus: NATS JetStream transport shared by the rollout (publisher) and the trainer (consumer)."""
