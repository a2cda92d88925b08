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


@functools.cache
def _triton_quant():
    from dflash_chat.engine.kernels import triton_quant  # imports triton: only once a kernel is wanted

    return triton_quant


def _agrees(kind: str, probe, x: torch.Tensor, packed: torch.Tensor, fmt: Format) -> bool:
    """First use of a kernel per format, device and dtype: `probe` must say it matches the torch path on real rows.

    A driver, GPU or Triton version the kernels were never run on then costs speed, not correctness.
    """
    key = (kind, fmt.name, packed.device, x.dtype)
    ok = _checked.get(key)
    if ok is None:
        try:
            ok = probe(_triton_quant(), x, packed, fmt)
            reason = "results differ from the torch path"
        except Exception as exc:  # noqa: BLE001 - any failure means: use the torch path
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        if not ok:
            warnings.warn(f"Triton {kind} {fmt.name} kernel disabled on {packed.device} ({reason}); "
                          "using the slower torch path")
        _checked[key] = ok
    return ok


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    got, want = got.float(), want.float()
    return bool(torch.allclose(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item() + 1e-3))


def _probe_matmul(tq, x: torch.Tensor, packed: torch.Tensor, fmt: Format) -> bool:
    rows, sample = packed[:64], x[:2].contiguous()
    return _close(tq.matmul(sample, rows, fmt, rows.shape[0]), reference.matmul(sample, rows, fmt, rows.shape[0]))


def _probe_dequantize(tq, x: torch.Tensor, packed: torch.Tensor, fmt: Format) -> bool:
    rows = packed.reshape(-1, packed.shape[-1])[:64].contiguous()
    k = rows.shape[-1] // fmt.type_size * fmt.block_size
    return torch.equal(tq.dequantize(rows, fmt, k, torch.float32), reference.dequantize_rows(rows, fmt, torch.float32))


def _probe_experts(tq, x: torch.Tensor, packed: torch.Tensor, fmt: Format) -> bool:
    experts, sample = packed[:2, :64].contiguous(), x[:2].contiguous()
    # rows 0 and 1 to expert 0, row 0 to expert 1 (when there is one)
    src = torch.tensor([0, 1, 0], dtype=torch.int32, device=x.device)[: 2 + (experts.shape[0] > 1)]
    dst = torch.arange(src.numel(), dtype=torch.int32, device=x.device)
    offsets = torch.tensor([0, 2, src.numel()], dtype=torch.int32, device=x.device)[: experts.shape[0] + 1]
    args = (sample, experts, fmt, experts.shape[1], src, dst, offsets)
    return _close(tq.moe_matmul(*args), reference.moe_matmul(*args))


def matmul(x: torch.Tensor, packed: torch.Tensor, fmt: Format, out_features: int) -> torch.Tensor:
    """x [M, K] @ W.T for W [out_features, K] in packed rows -> [M, out_features] in x.dtype."""
    if not fmt.quantized:
        return x @ packed.to(x.dtype).T
    if use_triton(packed) and _agrees("matmul", _probe_matmul, x, packed, fmt):
        return _triton_quant().matmul(x, packed, fmt, out_features)
    return reference.matmul(x, packed, fmt, out_features)


def dequantize(packed: torch.Tensor, fmt: Format, dtype: torch.dtype) -> torch.Tensor:
    """Packed rows [..., row_bytes] -> [..., values] in dtype."""
    if fmt.quantized and use_triton(packed) and _agrees("dequantize", _probe_dequantize, packed, packed, fmt):
        k = packed.shape[-1] // fmt.type_size * fmt.block_size
        return _triton_quant().dequantize(packed.contiguous(), fmt, k, dtype)
    return reference.dequantize_rows(packed, fmt, dtype)


def moe_matmul(x: torch.Tensor, packed: torch.Tensor, fmt: Format, n: int, src: torch.Tensor, dst: torch.Tensor,
               offsets: torch.Tensor) -> torch.Tensor:
    """Routed experts in one call: y [P, n], y[dst[i]] = x[src[i]] @ W[e].T for the sorted positions i of
    expert e (offsets[e] <= i < offsets[e + 1]); packed [E, N, row_bytes]; P = len(src), dst a permutation."""
    if fmt.quantized and use_triton(packed) and _agrees("experts", _probe_experts, x, packed, fmt):
        return _triton_quant().moe_matmul(x, packed, fmt, n, src, dst, offsets)
    return reference.moe_matmul(x, packed, fmt, n, src, dst, offsets)
