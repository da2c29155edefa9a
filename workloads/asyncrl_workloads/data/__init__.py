"""Data files the rollouts read (``spec.data``): readers chosen by path, and dotted record keys."""
