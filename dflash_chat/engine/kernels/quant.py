"""Quantized matmul and dequantize: the Triton kernels (triton_quant.py) on CUDA, the torch reference elsewhere.

After the first-use check (first_use.py), nothing here reads back to the host: shapes depend only on the
inputs' shapes.
"""

from __future__ import annotations

import torch

from dflash_chat.engine.ggml.formats import Format
from dflash_chat.engine.kernels import first_use, lazy, reference
from dflash_chat.engine.kernels.configs import kernel_supports
from dflash_chat.engine.kernels.switches import use_triton


def _probe_matmul(packed: torch.Tensor, fmt: Format, dtype: torch.dtype) -> bool:
    """The FMA kernel (M=1) and the tensor-core kernel (M=16) on the first 64 rows, split-K included when K is long."""
    rows = packed[:64]
    n, k = rows.shape[0], rows.shape[-1] // fmt.type_size * fmt.block_size
    x = first_use.probe_input(16, k, dtype, packed.device)
    tq = lazy.quant()
    return all(first_use.close(tq.matmul(x[:m], rows, fmt, n), reference.matmul(x[:m], rows, fmt, n)) for m in (1, 16))


def _probe_dequantize(packed: torch.Tensor, fmt: Format, dtype: torch.dtype) -> bool:
    rows = packed.reshape(-1, packed.shape[-1])[:64].contiguous()
    k = rows.shape[-1] // fmt.type_size * fmt.block_size
    return torch.equal(
        lazy.quant().dequantize(rows, fmt, k, torch.float32), reference.dequantize_rows(rows, fmt, torch.float32)
    )


def _kernel_ok(packed: torch.Tensor, fmt: Format, k: int) -> bool:
    return fmt.quantized and use_triton(packed) and kernel_supports(fmt.name, k, packed.shape[-1])


def matmul(x: torch.Tensor, packed: torch.Tensor, fmt: Format, out_features: int) -> torch.Tensor:
    """x [M, K] @ W.T for W [out_features, K] in packed rows -> [M, out_features] in x.dtype."""
    if not fmt.quantized:
        return x @ packed.to(x.dtype).T
    if _kernel_ok(packed, fmt, x.shape[-1]) and first_use.agrees("matmul", _probe_matmul, packed, fmt, x.dtype):
        return lazy.quant().matmul(x, packed, fmt, out_features)
    return reference.matmul(x, packed, fmt, out_features)


def dequantize(packed: torch.Tensor, fmt: Format, dtype: torch.dtype) -> torch.Tensor:
    """Packed rows [..., row_bytes] -> [..., values] in dtype."""
    k = packed.shape[-1] // fmt.type_size * fmt.block_size
    if _kernel_ok(packed, fmt, k) and first_use.agrees("dequantize", _probe_dequantize, packed, fmt, torch.float32):
        return lazy.quant().dequantize(packed.contiguous(), fmt, k, dtype)
    return reference.dequantize_rows(packed, fmt, dtype)
