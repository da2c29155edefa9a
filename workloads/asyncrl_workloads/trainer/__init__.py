"""Trainer role: pull trajectories, filter stale ones, batch, take PPO-family steps, sync weights."""
