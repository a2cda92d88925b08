"""Quantized matmul and dequantize: Triton kernels on CUDA, the torch reference path elsewhere.

Set DFLASH_CHAT_NO_TRITON=1 to force the torch path (for comparisons and debugging).
"""

from __future__ import annotations

import functools
import os

import torch

from dflash_chat.engine.kernels import reference
from dflash_chat.engine.weights.formats import Format


@functools.cache
def triton_available() -> bool:
    if os.environ.get("DFLASH_CHAT_NO_TRITON"):
        return False
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def use_triton(t: torch.Tensor) -> bool:
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    return (t.is_cuda or interpret) and triton_available()


def matmul(x: torch.Tensor, packed: torch.Tensor, fmt: Format, out_features: int) -> torch.Tensor:
    """x [M, K] @ W.T for W [out_features, K] in packed rows -> [M, out_features] in x.dtype."""
    if not fmt.quantized:
        return x @ packed.to(x.dtype).T
    if use_triton(packed):
        from dflash_chat.engine.kernels import triton_quant

        return triton_quant.matmul(x, packed, fmt, out_features)
    return reference.matmul(x, packed, fmt, out_features)


def dequantize(packed: torch.Tensor, fmt: Format, dtype: torch.dtype) -> torch.Tensor:
    """Packed rows [..., row_bytes] -> [..., values] in dtype."""
    if not fmt.quantized:
        return packed.to(dtype)
    if use_triton(packed):
        from dflash_chat.engine.kernels import triton_quant

        k = packed.shape[-1] // fmt.type_size * fmt.block_size
        return triton_quant.dequantize(packed.contiguous(), fmt, k, dtype)
    return reference.dequantize_rows(packed, fmt, dtype)
