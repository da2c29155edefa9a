"""The learning core's math: pure functions of tensors, registered by name, chosen from config.

No model, optimizer or I/O in here; trainer/loss.py composes them into one micro-batch's objective and
trainer/backend.py feeds that from its forwards. Each module matches the anchors' own code, and
tests/unit/test_algorithms_golden.py compares every function with verl 0.9.1's core_algos and AReaL
1.0.4's functional implementations on the same tensors:

  advantages.py    estimators (grpo/Dr.GRPO, rloo, reinforce++, reinforce++-baseline, ppo) and AReaL's
                   batch-level advantage normalisation
  shaping.py       what happens to rewards before the estimator: DAPO's overlong penalty, KL in the
                   reward (token rewards) and the adaptive KL controller
  policy_loss.py   per-token policy losses: PPO-clip with dual-clip, GSPO, CISPO, SAPO
  aggregation.py   per-token losses -> the mini-batch loss (verl's four loss_agg_mode), across ranks
  regularizers.py  KL estimators (k1, k2, k3/low_var_kl, abs) and the entropy of logits
  correction.py    the training-inference mismatch filter (AReaL rejection_sampling: token or
                   sequence, mask or clamp, ratio or k1/k2/k3, bounds)

Shapes: (B, T) is a micro-batch of B responses padded to T tokens; mask (B, T) is 1.0 on trained tokens.
"""
