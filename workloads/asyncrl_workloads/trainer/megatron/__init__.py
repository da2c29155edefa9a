"""megatron-core for the trainer: a GPTModel built from a Hugging Face config (model.py), the HF <->
megatron weight conversion (convert.py), and the model-parallel state they run in (parallel.py).

backend.py: MegatronBackend, the trainer's backend for spec.trainer.backend megatron; admission still
refuses it (docs/megatron.md says what is left).
"""
