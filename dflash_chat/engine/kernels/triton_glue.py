"""Fused glue between the projections: one launch where the eager model runs three to six.

Each kernel rounds where the model code (engine/models/layers.py, gdn.py) rounds, so it agrees with the torch
reference path in `reference.py` to float32 rounding of the reductions; none reads anything back to the host.

- `add_rms_norm`: r = residual + x, then RMSNorm(r) (zero-centred x*(1+w) in float32, or plain w*norm(x)).
- `silu_mul`: silu(gate) * up, gate and up being any two row-strided views (the halves of a fused gate_up).
- `gated_rms_norm`: GDN's output norm, w * norm(x) * silu(z), over the last dim.
- `conv_step`: one decode token through GDN's depthwise causal conv with SiLU; the conv state is shifted in place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _launch(kernel, grid, *args, **kwargs) -> None:
    """Every launch goes through here (kernels/compile_check.py captures them to compile without a GPU)."""
    kernel[grid](*args, **kwargs)


@triton.jit
def _silu(x):
    return x / (1.0 + tl.exp(tl.minimum(-x, 88.0)))  # (no inf: the interpreter treats overflow as an error)


@triton.jit
def _norm_kernel(x_ptr, res_ptr, w_ptr, r_out_ptr, out_ptr, H, eps, HAS_RES: tl.constexpr,
                 ZERO_CENTRED: tl.constexpr, BLOCK: tl.constexpr):
    """One row per program: [r = res + x (stored)], out = RMSNorm(r)."""
    row = tl.program_id(0).to(tl.int64) * H
    cols = tl.arange(0, BLOCK)
    live = cols < H
    x = tl.load(x_ptr + row + cols, mask=live, other=0.0)
    if HAS_RES:
        x = (tl.load(res_ptr + row + cols, mask=live, other=0.0).to(tl.float32) + x.to(tl.float32)).to(x.dtype)
        tl.store(r_out_ptr + row + cols, x, mask=live)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / H + eps)
    w = tl.load(w_ptr + cols, mask=live, other=0.0).to(tl.float32)
    if ZERO_CENTRED:
        y = xf * inv * (1.0 + w)
    else:
        y = (xf * inv).to(x.dtype).to(tl.float32) * w
    tl.store(out_ptr + row + cols, y.to(out_ptr.dtype.element_ty), mask=live)


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 zero_centred: bool) -> tuple[torch.Tensor, torch.Tensor]:
    h = x.shape[-1]
    r, out = torch.empty_like(x), torch.empty_like(x)
    _launch(_norm_kernel, (_rows(x),), x, residual, weight, r, out, h, eps, HAS_RES=True, ZERO_CENTRED=zero_centred,
                              BLOCK=triton.next_power_of_2(h), num_warps=4)
    return r, out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool) -> torch.Tensor:
    h = x.shape[-1]
    out = torch.empty_like(x)
    _launch(_norm_kernel, (_rows(x),), x, x, weight, x, out, h, eps, HAS_RES=False, ZERO_CENTRED=zero_centred,
                              BLOCK=triton.next_power_of_2(h), num_warps=4)
    return out


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, out_ptr, n, stride_g, stride_u, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = cols < n
    g = tl.load(g_ptr + row * stride_g + cols, mask=live, other=0.0)
    u = tl.load(u_ptr + row * stride_u + cols, mask=live, other=0.0)
    s = _silu(g.to(tl.float32)).to(g.dtype)
    tl.store(out_ptr + row * n + cols, (s.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=live)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    n = gate.shape[-1]
    g, u = gate.reshape(-1, n), up.reshape(-1, n)  # views: the halves of a fused projection keep their row stride
    out = torch.empty(g.shape, device=gate.device, dtype=gate.dtype)
    block = min(1024, triton.next_power_of_2(n))
    _launch(_silu_mul_kernel, (g.shape[0], triton.cdiv(n, block)), g, u, out, n, g.stride(0), u.stride(0), BLOCK=block)
    return out.reshape(gate.shape)


@triton.jit
def _gated_norm_kernel(x_ptr, g_ptr, w_ptr, out_ptr, rows, D, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    live = (r < rows) & (cols < D)
    at = r.to(tl.int64) * D + cols
    x = tl.load(x_ptr + at, mask=live, other=0.0)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / D + eps)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0)
    normed = ((xf * inv[:, None]).to(x.dtype).to(tl.float32) * w.to(tl.float32)).to(x.dtype)
    g = tl.load(g_ptr + at, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + at, (normed.to(tl.float32) * _silu(g)).to(x.dtype), mask=live)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    d = x.shape[-1]
    rows = _rows(x)
    out = torch.empty_like(x)
    per = 16
    _launch(_gated_norm_kernel, (triton.cdiv(rows, per),), x, gate, weight, out, rows, d, eps, ROWS=per,
                                                  BLOCK=triton.next_power_of_2(d))
    return out


@triton.jit
def _conv_step_kernel(x_ptr, state_ptr, w_ptr, out_ptr, C, stride_st, stride_sc, stride_wc, stride_wk,
                      KERNEL: tl.constexpr, BLOCK: tl.constexpr):
    c = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = c < C
    x = tl.load(x_ptr + c, mask=live, other=0.0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(KERNEL - 1):
        s = tl.load(state_ptr + j * stride_st + c * stride_sc, mask=live, other=0.0).to(x.dtype)
        w = tl.load(w_ptr + c * stride_wc + j * stride_wk, mask=live, other=0.0).to(x.dtype)
        acc += s.to(tl.float32) * w.to(tl.float32)
        if j > 0:  # shift the window: row j-1 takes row j (each program owns its channels)
            tl.store(state_ptr + (j - 1) * stride_st + c * stride_sc, s.to(state_ptr.dtype.element_ty), mask=live)
    w = tl.load(w_ptr + c * stride_wc + (KERNEL - 1) * stride_wk, mask=live, other=0.0).to(x.dtype)
    acc += x.to(tl.float32) * w.to(tl.float32)
    tl.store(state_ptr + (KERNEL - 2) * stride_st + c * stride_sc, x.to(state_ptr.dtype.element_ty), mask=live)
    conv = acc.to(x.dtype).to(tl.float32)
    tl.store(out_ptr + c, _silu(conv).to(x.dtype), mask=live)


def conv_step(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    c = x.shape[-1]
    kernel = weight.shape[-1]
    out = torch.empty_like(x)
    block = 1024
    _launch(_conv_step_kernel, (triton.cdiv(c, block),), x, state, weight, out, c, state.stride(0), state.stride(1),
                                                weight.stride(0), weight.stride(1), KERNEL=kernel, BLOCK=block)
    return out
