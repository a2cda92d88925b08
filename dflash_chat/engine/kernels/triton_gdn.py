"""Triton kernel behind `kernels.gdn` (imported only when it runs): see that module."""

import triton
import triton.language as tl


def _launch(kernel, grid, *args, **kwargs) -> None:
    """Every launch goes through here (bench/compile_check.py captures them to compile without a GPU)."""
    kernel[grid](*args, **kwargs)


@triton.jit
def recurrent_kernel(
    qkv_ptr,
    b_ptr,
    a_ptr,
    alog_ptr,
    dt_ptr,
    state_ptr,
    out_ptr,
    keep_ptr,
    T,
    rep,
    stride_t,
    key_total,
    stride_g,
    K: tl.constexpr,
    V: tl.constexpr,
    VB: tl.constexpr,
    UPDATE: tl.constexpr,
    OUTPUTS: tl.constexpr,
    MASKED: tl.constexpr,
):
    h = tl.program_id(0)  # value head
    H = tl.num_programs(0)
    cols = tl.program_id(1) * VB + tl.arange(0, VB)
    rk = tl.arange(0, K)
    kh = h // rep  # its key head
    q_at = kh * K + rk
    k_at = key_total + kh * K + rk
    v_at = 2 * key_total + h * V + cols
    neg_a = -tl.exp(tl.load(alog_ptr + h).to(tl.float32))
    dt = tl.load(dt_ptr + h).to(tl.float32)
    tile = state_ptr + h.to(tl.int64) * K * V + rk[:, None] * V + cols[None, :]
    s = tl.load(tile).to(tl.float32)
    n = T
    if MASKED:
        n = tl.load(keep_ptr).to(tl.int32)
    for t in range(0, n):
        row = qkv_ptr + t * stride_t
        qt = tl.load(row + q_at).to(tl.float32)
        kt = tl.load(row + k_at).to(tl.float32)
        vt = tl.load(row + v_at).to(tl.float32)
        qt = qt * (tl.rsqrt(tl.sum(qt * qt, 0) + 1e-6) * (1.0 / tl.sqrt(K * 1.0)))
        kt = kt * tl.rsqrt(tl.sum(kt * kt, 0) + 1e-6)
        x = tl.load(a_ptr + t * stride_g + h).to(tl.float32) + dt
        softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))  # torch's softplus, threshold 20
        decay = tl.exp(neg_a * softplus)
        beta = tl.sigmoid(tl.load(b_ptr + t * stride_g + h).to(tl.float32))
        s = s * decay
        delta = (vt - tl.sum(s * kt[:, None], 0)) * beta
        s = s + kt[:, None] * delta[None, :]
        if OUTPUTS:
            o = tl.sum(s * qt[:, None], 0)
            tl.store(out_ptr + (t * H + h).to(tl.int64) * V + cols, o.to(out_ptr.dtype.element_ty))
    if UPDATE:
        tl.store(tile, s.to(state_ptr.dtype.element_ty))


@triton.jit
def scan_kernel(
    q_ptr,
    k_ptr,
    w_ptr,
    u_ptr,
    attn_ptr,
    decay_ptr,
    state_ptr,
    out_ptr,
    N,
    C: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    VB: tl.constexpr,
):
    """Program (h, value block): the state tile carried through every chunk in registers (see gdn.Chunks).

    The products run on tensor cores in TF32 (10-bit mantissas, fp32 sums): with IEEE fp32 or 3xTF32 the
    tiles no longer fit in registers (ptxas spills), and TF32's error stays below the bf16 the outputs are
    rounded to."""
    h = tl.program_id(0)
    cols = tl.program_id(1) * VB + tl.arange(0, VB)
    rc = tl.arange(0, C)
    rk = tl.arange(0, K)
    tile = state_ptr + h.to(tl.int64) * K * V + rk[:, None] * V + cols[None, :]
    s = tl.load(tile)
    for n in range(0, N):
        chunk = h.to(tl.int64) * N + n
        w = tl.load(w_ptr + chunk * C * K + rc[:, None] * K + rk[None, :])
        u = tl.load(u_ptr + chunk * C * V + rc[:, None] * V + cols[None, :])
        fresh = u - tl.dot(w, s, input_precision="tf32")
        q = tl.load(q_ptr + chunk * C * K + rc[:, None] * K + rk[None, :])
        attn = tl.load(attn_ptr + chunk * C * C + rc[:, None] * C + rc[None, :])
        o = tl.dot(q, s, input_precision="tf32") + tl.dot(attn, fresh, input_precision="tf32")
        tl.store(out_ptr + chunk * C * V + rc[:, None] * V + cols[None, :], o)
        k = tl.load(k_ptr + chunk * C * K + rc[:, None] * K + rk[None, :])
        s = s * tl.load(decay_ptr + chunk) + tl.dot(tl.trans(k), fresh, input_precision="tf32")
    tl.store(tile, s)
