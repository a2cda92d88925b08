"""Triton kernel behind `kernels.gdn` (imported only when it runs): see that module."""

import triton
import triton.language as tl


def _launch(kernel, grid, *args, **kwargs) -> None:
    """Every launch goes through here (kernels/compile_check.py captures them to compile without a GPU)."""
    kernel[grid](*args, **kwargs)


@triton.jit
def recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, out_ptr, keep_ptr, T, rep,
                     stride_qt, stride_qh, stride_vt, stride_vh,
                     K: tl.constexpr, V: tl.constexpr, VB: tl.constexpr,
                     UPDATE: tl.constexpr, OUTPUTS: tl.constexpr, MASKED: tl.constexpr):
    h = tl.program_id(0)  # value head
    H = tl.num_programs(0)
    cols = tl.program_id(1) * VB + tl.arange(0, VB)
    rk = tl.arange(0, K)
    kh = h // rep  # its key head
    tile = state_ptr + h.to(tl.int64) * K * V + rk[:, None] * V + cols[None, :]
    s = tl.load(tile).to(tl.float32)
    n = T
    if MASKED:
        n = tl.load(keep_ptr).to(tl.int32)
    for t in range(0, n):
        qt = tl.load(q_ptr + t * stride_qt + kh * stride_qh + rk).to(tl.float32)
        kt = tl.load(k_ptr + t * stride_qt + kh * stride_qh + rk).to(tl.float32)
        vt = tl.load(v_ptr + t * stride_vt + h * stride_vh + cols).to(tl.float32)
        decay = tl.exp(tl.load(g_ptr + t * H + h))
        b = tl.load(beta_ptr + t * H + h)
        s = s * decay
        delta = (vt - tl.sum(s * kt[:, None], 0)) * b
        s = s + kt[:, None] * delta[None, :]
        if OUTPUTS:
            tl.store(out_ptr + (t * H + h).to(tl.int64) * V + cols, tl.sum(s * qt[:, None], 0))
    if UPDATE:
        tl.store(tile, s.to(state_ptr.dtype.element_ty))
