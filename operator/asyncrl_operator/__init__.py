"""asyncrl control plane: resolve, render, status, apply and the thin kopf handlers."""
