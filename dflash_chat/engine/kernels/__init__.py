"""Quantized matmul and dequantize: Triton kernels on CUDA, the torch reference path elsewhere.

Set DFLASH_CHAT_NO_TRITON=1 to force the torch path (for comparisons and debugging).
"""

from __future__ import annotations

import functools
import os
import warnings

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


_checked: dict[tuple, bool] = {}


def _triton_agrees(x: torch.Tensor, packed: torch.Tensor, fmt: Format) -> bool:
    """First use of a format on a device: the Triton kernel must match the torch path on real rows.

    A driver, GPU or Triton version the kernels were never run on then costs speed, not correctness.
    """
    key = (fmt.name, packed.device, x.dtype)
    if key not in _checked:
        from dflash_chat.engine.kernels import triton_quant

        rows = packed[:64]
        probe = x[:2].contiguous()
        try:
            got = triton_quant.matmul(probe, rows, fmt, rows.shape[0]).float()
            want = reference.matmul(probe, rows, fmt, rows.shape[0]).float()
            ok = bool(torch.allclose(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item() + 1e-3))
            k = rows.shape[-1] // fmt.type_size * fmt.block_size
            table = triton_quant.dequantize(rows.contiguous(), fmt, k, torch.float32)
            ok = ok and torch.equal(table, reference.dequantize_rows(rows, fmt, torch.float32))
            reason = "results differ from the torch path"
        except Exception as exc:  # noqa: BLE001 - any failure means: use the torch path
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        if not ok:
            warnings.warn(f"Triton {fmt.name} kernel disabled on {packed.device} ({reason}); using the slower torch path")
        _checked[key] = ok
    return _checked[key]


def matmul(x: torch.Tensor, packed: torch.Tensor, fmt: Format, out_features: int) -> torch.Tensor:
    """x [M, K] @ W.T for W [out_features, K] in packed rows -> [M, out_features] in x.dtype."""
    if not fmt.quantized:
        return x @ packed.to(x.dtype).T
    if use_triton(packed) and _triton_agrees(x, packed, fmt):
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
