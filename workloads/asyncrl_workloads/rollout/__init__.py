"""The rollout role: vLLM generation, per-token policy versions, rewards, publishing to the bus."""
