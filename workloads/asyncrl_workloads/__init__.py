"""asyncrl data plane: rollout (vLLM), trainer (torch), trajectory bus (NATS), weight sync, rewards."""
