"""Triton kernels behind `kernels.attention` (imported only when a kernel runs): see that module."""

import triton
import triton.language as tl


def _launch(kernel, grid, *args, **kwargs) -> None:
    """Every launch goes through here (bench/compile_check.py captures them to compile without a GPU)."""
    kernel[grid](*args, **kwargs)


@triton.jit
def partial_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    end_ptr,
    acc_ptr,
    ml_ptr,
    T,
    rep,
    R,
    scale,
    window,
    cache_rows,
    stride_qt,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOWED: tl.constexpr,
    IEEE: tl.constexpr,
):
    g = tl.program_id(0)  # KV head
    rb = tl.program_id(1)  # block of query rows
    s = tl.program_id(2)  # cache chunk
    KVH = tl.num_programs(0)
    end = tl.load(end_ptr)
    first = tl.maximum(end - cache_rows, 0)  # the oldest position a ring cache still holds (0 otherwise)
    lo_chunk = first + s * SPLIT
    if lo_chunk >= end:
        return  # never read by the merge
    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    live = rows < R
    t = rows // rep
    head = g * rep + rows % rep
    p = tl.load(pos_ptr + t, mask=live, other=0)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + t[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :], mask=live[:, None], other=0.0)
    hi = tl.minimum(end, lo_chunk + SPLIT)
    if CAUSAL:
        hi = tl.minimum(hi, tl.max(tl.where(live, p, 0)) + 1)
    lo = lo_chunk
    if WINDOWED:
        lo = tl.maximum(lo, tl.min(tl.where(live, p, 2**62)) - window + 1)
        if not CAUSAL:  # a bidirectional window reaches as far past the query as before it
            hi = tl.minimum(hi, tl.max(tl.where(live, p, 0)) + window)
    m = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_R,), tl.float32)
    acc = tl.zeros((BLOCK_R, D), tl.float32)
    start = lo_chunk + tl.maximum(lo - lo_chunk, 0) // BLOCK_N * BLOCK_N
    for j0 in range(start, hi, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        inside = j < hi
        row = (j % cache_rows).to(tl.int64)  # position j lives in row j mod rows
        k = tl.load(k_ptr + row[:, None] * stride_kn + g * stride_kh + d[None, :], mask=inside[:, None], other=0.0)
        v = tl.load(v_ptr + row[:, None] * stride_vn + g * stride_vh + d[None, :], mask=inside[:, None], other=0.0)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        else:
            scores = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
        ok = inside[None, :] & live[:, None]
        if CAUSAL:
            ok &= j[None, :] <= p[:, None]
        if WINDOWED:
            ok &= p[:, None] - j[None, :] < window
            if not CAUSAL:
                ok &= j[None, :] - p[:, None] < window
        scores = tl.where(ok, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        w = tl.exp(scores - m_safe[:, None])
        l = l * alpha + tl.sum(w, 1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(w, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(w.to(v.dtype), v).to(tl.float32)
        m = m_new
    base = (s * KVH + g) * R + rows
    tl.store(acc_ptr + base[:, None] * D + d[None, :], acc, mask=live[:, None])
    tl.store(ml_ptr + 2 * base, m, mask=live)
    tl.store(ml_ptr + 2 * base + 1, l, mask=live)


@triton.jit
def merge_kernel(
    acc_ptr,
    ml_ptr,
    end_ptr,
    out_ptr,
    gate_ptr,
    rep,
    R,
    KVH,
    cache_rows,
    stride_ot,
    stride_oh,
    D: tl.constexpr,
    SPLIT: tl.constexpr,
    GATED: tl.constexpr,
):
    g = tl.program_id(0)
    row = tl.program_id(1)
    end = tl.load(end_ptr)
    used = (end - tl.maximum(end - cache_rows, 0) + SPLIT - 1) // SPLIT
    d = tl.arange(0, D)
    m_all = float("-inf")
    for s in range(0, used):
        m_all = tl.maximum(m_all, tl.load(ml_ptr + 2 * ((s * KVH + g) * R + row)))
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    total = 0.0
    acc = tl.zeros((D,), tl.float32)
    for s in range(0, used):
        base = (s * KVH + g) * R + row
        w = tl.exp(tl.load(ml_ptr + 2 * base) - m_safe)
        total += w * tl.load(ml_ptr + 2 * base + 1)
        acc += w * tl.load(acc_ptr + base * D + d)
    out = (acc / tl.where(total > 0, total, 1.0)).to(out_ptr.dtype.element_ty)
    t = row // rep
    head = g * rep + row % rep
    if GATED:  # the output gate, rounded where the torch path rounds: o * sigmoid(gate)
        gate = tl.load(gate_ptr + t * stride_ot + head * stride_oh + d).to(tl.float32)
        out = out.to(tl.float32) * tl.sigmoid(gate).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + t * stride_ot + head * stride_oh + d, out.to(out_ptr.dtype.element_ty))


@triton.jit
def _norm_rope(base, w_ptr, c, sn, d, partner, eps, D: tl.constexpr, RD: tl.constexpr, ZERO_CENTRED: tl.constexpr):
    """The head at `base`: RMS-normed (weights at w_ptr) then RoPE on the first RD channels, rounded to the
    input's dtype where the torch path rounds."""
    x = tl.load(base + d)
    xp = tl.load(base + partner)
    xf, xpf = x.to(tl.float32), xp.to(tl.float32)
    w, wp = tl.load(w_ptr + d).to(tl.float32), tl.load(w_ptr + partner).to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, 0) / D + eps)
    if ZERO_CENTRED:
        y = (xf * inv * (1.0 + w)).to(x.dtype).to(tl.float32)
        yp = (xpf * inv * (1.0 + wp)).to(x.dtype).to(tl.float32)
    else:
        y = ((xf * inv).to(x.dtype).to(tl.float32) * w).to(x.dtype).to(tl.float32)
        yp = ((xpf * inv).to(x.dtype).to(tl.float32) * wp).to(x.dtype).to(tl.float32)
    rotated = tl.where(d < RD // 2, -yp, yp)
    roped = (y * c).to(x.dtype).to(tl.float32) + (rotated * sn).to(x.dtype).to(tl.float32)
    return tl.where(d < RD, roped, y).to(x.dtype)


@triton.jit
def prepare_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    qw_ptr,
    kw_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    qo_ptr,
    gate_ptr,
    kc_ptr,
    vc_ptr,
    heads,
    stride_qt,
    stride_kt,
    stride_vt,
    stride_ct,
    cache_rows,
    stride_cr,
    stride_ch,
    eps,
    D: tl.constexpr,
    RD: tl.constexpr,
    GATED: tl.constexpr,
    ZERO_CENTRED: tl.constexpr,
    HAS_Q: tl.constexpr,
):
    """Program (t, j): query head j (normed, rotated, its output gate split off), or, for j >= heads, KV
    head j - heads: key normed and rotated, key and value written to the caches' row pos[t] mod rows."""
    t = tl.program_id(0)
    j = tl.program_id(1)
    d = tl.arange(0, D)
    half = RD // 2
    partner = tl.where(d < half, d + half, d - half)
    partner = tl.where(d < RD, partner, d)
    c = tl.load(cos_ptr + t * stride_ct + d, mask=d < RD, other=1.0).to(tl.float32)
    sn = tl.load(sin_ptr + t * stride_ct + d, mask=d < RD, other=0.0).to(tl.float32)
    if HAS_Q and j < heads:
        base = q_ptr + t * stride_qt + j * (2 * D if GATED else D)
        y = _norm_rope(base, qw_ptr, c, sn, d, partner, eps, D, RD, ZERO_CENTRED)
        tl.store(qo_ptr + (t * heads + j) * D + d, y)
        if GATED:
            tl.store(gate_ptr + (t * heads + j) * D + d, tl.load(base + D + d))
    else:
        h = j - heads
        y = _norm_rope(k_ptr + t * stride_kt + h * D, kw_ptr, c, sn, d, partner, eps, D, RD, ZERO_CENTRED)
        row = (tl.load(pos_ptr + t) % cache_rows).to(tl.int64)
        tl.store(kc_ptr + row * stride_cr + h * stride_ch + d, y)
        tl.store(vc_ptr + row * stride_cr + h * stride_ch + d, tl.load(v_ptr + t * stride_vt + h * D + d))
