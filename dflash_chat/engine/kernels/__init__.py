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


# Rows up to which the small-M kernels run (decode, the 16-token verify); prefill dequantizes and calls cuBLAS.
SMALL_M = 32

_checked: dict[tuple, bool] = {}


def _first_use_agrees(key: tuple, device: torch.device, probe) -> bool:
    """First use of a kernel on a device: `probe()` must say it matches the torch path on real rows.

    A driver, GPU or Triton version the kernels were never run on then costs speed, not correctness.
    """
    if key not in _checked:
        try:
            ok = probe()
            reason = "results differ from the torch path"
        except Exception as exc:  # noqa: BLE001 - any failure means: use the torch path
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        if not ok:
            warnings.warn(f"Triton {key[0]} {key[1]} kernel disabled on {device} ({reason}); using the slower torch path")
        _checked[key] = ok
    return _checked[key]


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    got, want = got.float(), want.float()
    return bool(torch.allclose(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item() + 1e-3))


def _matmul_agrees(x: torch.Tensor, packed: torch.Tensor, fmt: Format) -> bool:
    def probe() -> bool:
        from dflash_chat.engine.kernels import triton_quant

        rows = packed[:64]
        sample = x[:2].contiguous()
        ok = _close(triton_quant.matmul(sample, rows, fmt, rows.shape[0]),
                    reference.matmul(sample, rows, fmt, rows.shape[0]))
        k = rows.shape[-1] // fmt.type_size * fmt.block_size
        table = triton_quant.dequantize(rows.contiguous(), fmt, k, torch.float32)
        return ok and torch.equal(table, reference.dequantize_rows(rows, fmt, torch.float32))

    return _first_use_agrees(("matmul", fmt.name, packed.device, x.dtype), packed.device, probe)


def _moe_agrees(x: torch.Tensor, packed: torch.Tensor, fmt: Format) -> bool:
    def probe() -> bool:
        from dflash_chat.engine.kernels import triton_quant

        experts = packed[:2, :64].contiguous()
        sample = x[:2].contiguous()
        # rows 0 and 1 to expert 0, row 0 to expert 1 (when there is one)
        src = torch.tensor([0, 1, 0], dtype=torch.int32, device=x.device)[: 2 + (experts.shape[0] > 1)]
        dst = torch.arange(src.numel(), dtype=torch.int32, device=x.device)
        offsets = torch.tensor([0, 2, src.numel()], dtype=torch.int32, device=x.device)[: experts.shape[0] + 1]
        args = (sample, experts, fmt, experts.shape[1], src, dst, offsets)
        return _close(triton_quant.moe_matmul(*args), reference.moe_matmul(*args))

    return _first_use_agrees(("experts", fmt.name, packed.device, x.dtype), packed.device, probe)


def matmul(x: torch.Tensor, packed: torch.Tensor, fmt: Format, out_features: int) -> torch.Tensor:
    """x [M, K] @ W.T for W [out_features, K] in packed rows -> [M, out_features] in x.dtype."""
    if not fmt.quantized:
        return x @ packed.to(x.dtype).T
    if use_triton(packed) and _matmul_agrees(x, packed, fmt):
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


def moe_matmul(x: torch.Tensor, packed: torch.Tensor, fmt: Format, n: int, src: torch.Tensor, dst: torch.Tensor,
               offsets: torch.Tensor) -> torch.Tensor:
    """Routed experts in one call: y [P, n], y[dst[i]] = x[src[i]] @ W[e].T for the sorted positions i of
    expert e (offsets[e] <= i < offsets[e + 1]); packed [E, N, row_bytes]; P = len(src), dst a permutation."""
    if fmt.quantized and use_triton(packed) and _moe_agrees(x, packed, fmt):
        from dflash_chat.engine.kernels import triton_quant

        return triton_quant.moe_matmul(x, packed, fmt, n, src, dst, offsets)
    return reference.moe_matmul(x, packed, fmt, n, src, dst, offsets)
