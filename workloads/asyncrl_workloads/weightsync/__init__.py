"""Weight sync: trainer rank 0 -> rollout engine workers over a dedicated group (see base.py)."""
