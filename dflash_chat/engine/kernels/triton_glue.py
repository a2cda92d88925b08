"""Fused glue between the projections: one launch where the eager model runs three to six.

Each kernel rounds where the model code (engine/models/layers.py, gdn.py) rounds, so it agrees with the torch
reference path in `reference.py` to float32 rounding of the reductions; none reads anything back to the host.

- `add_rms_norm`: r = residual + x, then RMSNorm(r) (zero-centred x*(1+w) in float32, or plain w*norm(x)).
- `silu_mul`: silu(gate) * up, gate and up being any two row-strided views (the halves of a fused gate_up).
- `gated_rms_norm`: GDN's output norm, w * norm(x) * silu(z), over the last dim.
- `conv_step`: one decode token through GDN's depthwise causal conv with SiLU; the conv state is shifted in place.
- `top_k_softmax`, `route`, `moe_combine`: a routed layer's router top-k, its (token, expert) pairs sorted by
  expert, and the weighted sum of the experts' outputs with the gated shared expert (each one launch).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _launch(kernel, grid, *args, **kwargs) -> None:
    """Every launch goes through here (bench/compile_check.py captures them to compile without a GPU)."""
    kernel[grid](*args, **kwargs)


@triton.jit
def _silu(x):
    return x / (1.0 + tl.exp(tl.minimum(-x, 88.0)))  # (no inf: the interpreter treats overflow as an error)


@triton.jit
def _norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    r_out_ptr,
    out_ptr,
    H,
    eps,
    HAS_RES: tl.constexpr,
    ZERO_CENTRED: tl.constexpr,
    BLOCK: tl.constexpr,
):
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


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    r, out = torch.empty_like(x), torch.empty_like(x)
    _launch_norm(x, weight, out, eps, zero_centred, residual=residual, r_out=r)
    return r, out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool) -> torch.Tensor:
    out = torch.empty_like(x)
    _launch_norm(x, weight, out, eps, zero_centred)
    return out


def _launch_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    eps: float,
    zero_centred: bool,
    residual: torch.Tensor | None = None,
    r_out: torch.Tensor | None = None,
) -> None:
    """out = RMSNorm(x); given a residual (and r_out), r_out = residual + x first and out = RMSNorm(r_out)."""
    h = x.shape[-1]
    _launch(
        _norm_kernel,
        (_rows(x),),
        x,
        residual if residual is not None else x,  # (unread without a residual, as is r_out)
        weight,
        r_out if r_out is not None else x,
        out,
        h,
        eps,
        HAS_RES=residual is not None,
        ZERO_CENTRED=zero_centred,
        BLOCK=triton.next_power_of_2(h),
        num_warps=4,
    )


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
def _gated_norm_kernel(
    x_ptr, g_ptr, w_ptr, out_ptr, rows, D, heads, stride_gt, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr
):
    """Rows r = t * heads + h of x [T, heads, D] (contiguous); the gate may be a view with rows t strided
    (z, a slice of the fused projection's output): its row r sits at t * stride_gt + h * D."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    live = (r < rows) & (cols < D)
    at = r.to(tl.int64) * D + cols
    x = tl.load(x_ptr + at, mask=live, other=0.0)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / D + eps)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0)
    normed = ((xf * inv[:, None]).to(x.dtype).to(tl.float32) * w.to(tl.float32)).to(x.dtype)
    g_at = (r // heads).to(tl.int64) * stride_gt + (r % heads) * D + cols
    g = tl.load(g_ptr + g_at, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + at, (normed.to(tl.float32) * _silu(g)).to(x.dtype), mask=live)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x contiguous [..., heads, D]; gate of x's shape, contiguous within each leading row ([T, heads, D])."""
    d = x.shape[-1]
    rows = _rows(x)
    heads = x.shape[-2] if x.dim() >= 2 else 1
    stride_gt = gate.stride(0) if gate.dim() == 3 else heads * d  # (any other gate is contiguous)
    out = torch.empty_like(x)
    per = 16
    _launch(
        _gated_norm_kernel,
        (triton.cdiv(rows, per),),
        x,
        gate,
        weight,
        out,
        rows,
        d,
        heads,
        stride_gt,
        eps,
        ROWS=per,
        BLOCK=triton.next_power_of_2(d),
    )
    return out


@triton.jit
def _conv_step_kernel(
    x_ptr,
    state_ptr,
    w_ptr,
    out_ptr,
    C,
    stride_st,
    stride_sc,
    stride_wc,
    stride_wk,
    KERNEL: tl.constexpr,
    BLOCK: tl.constexpr,
):
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
    _launch(
        _conv_step_kernel,
        (triton.cdiv(c, block),),
        x,
        state,
        weight,
        out,
        c,
        state.stride(0),
        state.stride(1),
        weight.stride(0),
        weight.stride(1),
        KERNEL=kernel,
        BLOCK=block,
    )
    return out


# --- the routed layer's glue: top-k of the router's softmax, the pairs sorted by expert, the weighted sum ----


@triton.jit
def _top_k_softmax_kernel(
    logits_ptr, idx_ptr, w_ptr, E, stride_l, K: tl.constexpr, KB: tl.constexpr, BLOCK: tl.constexpr
):
    """One token per program: softmax over the E logits (fp32), the K largest (ties: the lower expert),
    their weights renormalised to sum to 1."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    live = cols < E
    x = tl.load(logits_ptr + t * stride_l + cols, mask=live, other=float("-inf")).to(tl.float32)
    e = tl.where(live, tl.exp(x - tl.max(x, 0)), 0.0)
    p = e / tl.sum(e, 0)
    left = tl.where(live, p, -1.0)  # probabilities not taken yet
    slots = tl.arange(0, KB)
    top_w = tl.zeros([KB], dtype=tl.float32)
    top_i = tl.zeros([KB], dtype=tl.int32)
    for j in tl.static_range(K):
        best = tl.max(left, 0)
        i = tl.min(tl.where(left == best, cols, BLOCK), 0)
        top_w = tl.where(slots == j, best, top_w)
        top_i = tl.where(slots == j, i, top_i)
        left = tl.where(cols == i, -1.0, left)
    top_w = top_w / tl.sum(top_w, 0)
    tl.store(idx_ptr + t * K + slots, top_i.to(idx_ptr.dtype.element_ty), mask=slots < K)
    tl.store(w_ptr + t * K + slots, top_w.to(w_ptr.dtype.element_ty), mask=slots < K)


def top_k_softmax(logits: torch.Tensor, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    t, e = logits.shape
    idx = torch.empty(t, k, device=logits.device, dtype=torch.long)
    w = torch.empty(t, k, device=logits.device, dtype=dtype)
    _launch(
        _top_k_softmax_kernel,
        (t,),
        logits,
        idx,
        w,
        e,
        logits.stride(0),
        K=k,
        KB=triton.next_power_of_2(k),
        BLOCK=triton.next_power_of_2(e),
    )
    return idx, w


ROUTE_PAIRS = 256  # pairs one program sorts (32 tokens of top-8): decode and verify; prefill sorts with torch


@triton.jit
def _route_kernel(
    idx_ptr, order_ptr, token_ptr, expert_ptr, offsets_ptr, P, E, K: tl.constexpr, PB: tl.constexpr, EB: tl.constexpr
):
    """All pairs in one program: pair p's place in (expert, pair) order is the number of pairs before it,
    counted by comparing every pair with every other; offsets[f] = pairs of experts below f (a histogram)."""
    p = tl.arange(0, PB)
    live = p < P
    e = tl.load(idx_ptr + p, mask=live, other=E).to(tl.int32)  # padding sorts after every real pair
    q = tl.arange(0, PB)
    e_q = tl.load(idx_ptr + q, mask=q < P, other=E).to(tl.int32)
    before = (e_q[None, :] < e[:, None]) | ((e_q[None, :] == e[:, None]) & (q[None, :] < p[:, None]))
    place = tl.sum(before.to(tl.int32), 1)
    tl.store(order_ptr + place, p, mask=live)
    tl.store(token_ptr + place, p // K, mask=live)
    tl.store(expert_ptr + place, e, mask=live)
    counts = tl.histogram(e, EB)  # padding lands in bin E, past every real expert
    f = tl.arange(0, EB)
    tl.store(offsets_ptr + f, tl.cumsum(counts, 0) - counts, mask=f <= E)


def route(top_k_index: torch.Tensor, num_experts: int):
    """(order, token_of, offsets, expert_of) as kernels.route defines them, int32, for at most ROUTE_PAIRS pairs."""
    pairs = top_k_index.numel()
    device = top_k_index.device
    order, token_of, expert_of = (torch.empty(pairs, device=device, dtype=torch.int32) for _ in range(3))
    offsets = torch.empty(num_experts + 1, device=device, dtype=torch.int32)
    _launch(
        _route_kernel,
        (1,),
        top_k_index,
        order,
        token_of,
        expert_of,
        offsets,
        pairs,
        num_experts,
        K=top_k_index.shape[-1],
        PB=max(16, triton.next_power_of_2(pairs)),
        EB=triton.next_power_of_2(num_experts + 1),
        num_warps=8 if pairs > 64 else 4,
    )
    return order, token_of, offsets, expert_of


@triton.jit
def _moe_combine_kernel(
    y_ptr, w_ptr, shared_ptr, gate_ptr, out_ptr, H, stride_g, K: tl.constexpr, SHARED: tl.constexpr, BLOCK: tl.constexpr
):
    """out[t] = sum_j w[t, j] * y[t*K + j] (products rounded to y's dtype, summed in fp32), then, with a shared
    expert, + sigmoid(gate[t]) * shared[t]: rounded where the model code rounds."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = cols < H
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(K):
        w = tl.load(w_ptr + t * K + j).to(tl.float32)
        y = tl.load(y_ptr + (t * K + j) * H + cols, mask=live, other=0.0)
        acc += (y.to(tl.float32) * w).to(y.dtype).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    out = acc.to(dtype)
    if SHARED:
        g = tl.sigmoid(tl.load(gate_ptr + t * stride_g).to(tl.float32)).to(dtype).to(tl.float32)
        s = tl.load(shared_ptr + t * H + cols, mask=live, other=0.0).to(tl.float32)
        out = (out.to(tl.float32) + (g * s).to(dtype).to(tl.float32)).to(dtype)
    tl.store(out_ptr + t * H + cols, out, mask=live)


def moe_combine(y: torch.Tensor, top_k_weights: torch.Tensor, shared, dtype: torch.dtype) -> torch.Tensor:
    t, k = top_k_weights.shape
    h = y.shape[-1]
    out = torch.empty(t, h, device=y.device, dtype=dtype)
    shared_out, gate = (shared[0].contiguous(), shared[1]) if shared is not None else (out, out)
    block = min(1024, triton.next_power_of_2(h))
    _launch(
        _moe_combine_kernel,
        (t, triton.cdiv(h, block)),
        y,
        top_k_weights,
        shared_out,
        gate,
        out,
        h,
        gate.stride(0),
        K=k,
        SHARED=shared is not None,
        BLOCK=block,
    )
    return out


@triton.jit
def _conv_block_kernel(
    x_ptr,
    state_ptr,
    w_ptr,
    window_ptr,
    out_ptr,
    T,
    C,
    stride_x,
    stride_st,
    stride_sc,
    stride_wc,
    stride_wk,
    KERNEL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """A block of T tokens through GDN's conv: window = [state; x] is written out (what a commit takes its conv
    state from), then out[t] = silu(sum_j w[j] * window[t + j]); the state itself is left as it was."""
    c = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = c < C
    for j in tl.static_range(KERNEL - 1):
        s = tl.load(state_ptr + j * stride_st + c * stride_sc, mask=live, other=0.0)
        tl.store(window_ptr + j * C + c, s.to(window_ptr.dtype.element_ty), mask=live)
    for t in range(0, T):
        x = tl.load(x_ptr + t * stride_x + c, mask=live, other=0.0)
        tl.store(window_ptr + (KERNEL - 1 + t) * C + c, x.to(window_ptr.dtype.element_ty), mask=live)
    tl.debug_barrier()
    for t in range(0, T):
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for j in tl.static_range(KERNEL):
            v = tl.load(window_ptr + (t + j) * C + c, mask=live, other=0.0)
            w = tl.load(w_ptr + c * stride_wc + j * stride_wk, mask=live, other=0.0).to(v.dtype)
            acc += v.to(tl.float32) * w.to(tl.float32)
        conv = acc.to(out_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_ptr + t * C + c, _silu(conv).to(out_ptr.dtype.element_ty), mask=live)


def conv_block(
    x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, window: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    t, c = x.shape
    block = 512
    _launch(
        _conv_block_kernel,
        (triton.cdiv(c, block),),
        x,
        state,
        weight,
        window,
        out,
        t,
        c,
        x.stride(0),
        state.stride(0),
        state.stride(1),
        weight.stride(0),
        weight.stride(1),
        KERNEL=weight.shape[-1],
        BLOCK=block,
    )
    return out[:t]
