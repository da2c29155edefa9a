"""Synthetic tasks and the prompt source (``spec.data.prompts``: a JSONL path or ``builtin:<task>``)."""
