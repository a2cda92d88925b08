"""The kernels the models run: Triton on CUDA, the torch reference path elsewhere (switches.py says which).

The face of the package: quantized matmul and dequantize (quant.py), routed experts (experts.py) and the fused
glue ops (glue.py). Attention and the GDN recurrence are their own modules (attention.py, gdn.py).
Set DFLASH_CHAT_NO_TRITON=1 to force the torch path (for comparisons and debugging).
"""

from __future__ import annotations

from dflash_chat.engine.kernels.experts import Routes, grouped_experts, moe_combine, moe_matmul, route, top_k_softmax
from dflash_chat.engine.kernels.glue import add_rms_norm, conv_block, conv_step, gated_rms_norm, rms_norm, silu_mul
from dflash_chat.engine.kernels.pairs import Pairs
from dflash_chat.engine.kernels.quant import dequantize, matmul
from dflash_chat.engine.kernels.switches import kernel_wanted, triton_available, use_triton

__all__ = [
    "matmul",
    "dequantize",
    "moe_matmul",
    "Pairs",
    "route",
    "Routes",
    "grouped_experts",
    "add_rms_norm",
    "rms_norm",
    "silu_mul",
    "gated_rms_norm",
    "conv_step",
    "conv_block",
    "use_triton",
    "kernel_wanted",
    "triton_available",
    "top_k_softmax",
    "moe_combine",
]
