"""The AsyncRLJob API: pydantic models shared by the operator and every workload (no kopf/torch/vllm)."""
