"""PPO with a critic: GAE over token rewards and the critic's values, and the clipped value loss.

Called by trainer/advantage.py (gae, once per step on the whole batch) and trainer/backend.py (value_loss,
per micro-batch of the critic's update). verl: compute_gae_advantage_return, compute_value_loss
(core_algos.py); AReaL: PPOActor._compute_advantages, ppo_critic_loss_fn.
"""

from __future__ import annotations

import torch

from asyncrl_workloads.trainer.algorithms import advantages


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv 1506.02438), as verl computes it:

        delta_t = r_t + gamma V_{t+1} - V_t,  A_t = delta_t + gamma lam A_{t+1}
        returns_t = A_t + V_t;  A whitened over the trained tokens of the batch

    where t+1 is the next *trained* token: tool output (mask 0) carries the next value and advantage
    through unchanged. token_rewards, values, mask (B, T) -> (advantages, returns) (B, T)
    """
    next_value = torch.zeros_like(values[:, 0])  # (B,)
    last = torch.zeros_like(values[:, 0])  # (B,)
    reversed_adv = []
    for t in reversed(range(token_rewards.shape[1])):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam * last
        next_value = values[:, t] * m + (1 - m) * next_value
        last = candidate * m + (1 - m) * last
        reversed_adv.append(last)
    adv = torch.stack(reversed_adv[::-1], dim=1)  # (B, T)
    returns = adv + values
    return advantages.masked_whiten(adv, mask), returns


def value_loss(
    predicted: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped value loss (verl compute_value_loss before its aggregation; PPO2's vf clipping):

        L_t = 1/2 max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)

    predicted (requires grad), returns, old_values (B, T) -> (per-token loss, where the clipped term won)
    """
    clipped = torch.maximum(torch.minimum(predicted, old_values + clip), old_values - clip)
    unclipped_loss = (predicted - returns) ** 2
    clipped_loss = (clipped - returns) ** 2
    return 0.5 * torch.maximum(unclipped_loss, clipped_loss), (clipped_loss > unclipped_loss).float()
