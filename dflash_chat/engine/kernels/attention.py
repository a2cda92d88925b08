"""Attention of a few query rows over a KV cache whose used length lives on the device.

Decode (1 row), verify (B rows, causal, bottom-right aligned) and the drafter's block (B rows, causal
or not per layer, optionally windowed: a bidirectional window reaches both ways) all read the same
preallocated caches. The kernel splits the cache into fixed chunks (split-KV, "flash decoding"): the
grid is sized for the allocated length so a CUDA graph can replay it at any length, and a program whose
chunk lies past `end` (or outside every row's causal / window range) exits before reading anything, so
the time follows the used length.
Grouped-query heads are folded into the rows (each KV head is read once for its `rep` query heads).
A second kernel merges the chunks' partial softmaxes. A cache with fewer rows than positions (a
sliding-window layer's ring) holds position j in row j mod rows; the chunks then cover the positions
the ring still holds.

The torch reference is `models.attention.attend_cache`'s SDPA path; tests compare both under
TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch

from dflash_chat.engine.kernels import lazy
from dflash_chat.engine.kernels.switches import kernel_wanted

SPLIT = 512  # cache rows per program
BLOCK_N = 64  # keys per inner step


def available(q: torch.Tensor) -> bool:
    return kernel_wanted(q, "ATTENTION")


def attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pos: torch.Tensor,
    end: torch.Tensor | int,
    scale: float,
    causal: bool,
    window: int | None,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, heads, d]; caches [rows, kv_heads, d] (position j in row j mod rows); pos [T]; end: positions
    written so far (device 0-d tensor or int); gate [T, heads * d]: the output times sigmoid(gate).

    Returns [T, heads * d] in q's dtype. Sync-free: every size comes from shapes, `end` stays on the device.
    """
    T, heads, d = q.shape
    rows_alloc, kv_heads, _ = k_cache.shape
    rep = heads // kv_heads
    R = T * rep
    if not torch.is_tensor(end):  # an eager step: end = pos[-1] + 1, computed where it lives (no host copy)
        end = pos[-1:] + 1
    end = end.reshape(1).to(torch.int64)
    q = q.contiguous()
    block_r = max(16, min(64, 1 << (R - 1).bit_length()))
    splits = -(-rows_alloc // SPLIT)
    acc = torch.empty(splits, kv_heads, R, d, device=q.device, dtype=torch.float32)
    ml = torch.empty(splits, kv_heads, R, 2, device=q.device, dtype=torch.float32)
    out = torch.empty(T, heads, d, device=q.device, dtype=q.dtype)
    kernels = lazy.attention()
    grid = (kv_heads, -(-R // block_r), splits)
    kernels._launch(
        kernels.partial_kernel,
        grid,
        q,
        k_cache,
        v_cache,
        pos,
        end,
        acc,
        ml,
        T,
        rep,
        R,
        scale,
        window or 0,
        rows_alloc,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        D=d,
        BLOCK_R=block_r,
        BLOCK_N=BLOCK_N,
        SPLIT=SPLIT,
        CAUSAL=causal,
        WINDOWED=window is not None,
        IEEE=q.dtype == torch.float32,
        num_warps=4 if block_r <= 16 else 8,
    )
    kernels._launch(
        kernels.merge_kernel,
        (kv_heads, R),
        acc,
        ml,
        end,
        out,
        gate if gate is not None else out,
        rep,
        R,
        kv_heads,
        rows_alloc,
        out.stride(0),
        out.stride(1),
        D=d,
        SPLIT=SPLIT,
        GATED=gate is not None,
    )
    return out.reshape(T, heads * d)


def prepare(
    q_raw: torch.Tensor | None,
    k_raw: torch.Tensor,
    v_raw: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor,
    eps: float,
    zero_centred: bool,
    cos: torch.Tensor,
    sin: torch.Tensor,
    pos: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    heads: int,
    gated: bool,
):
    """One launch for what follows the q/k/v projections: q and k RMS-normed and rotated (RoPE on the first
    cos.shape[-1] channels), the output gate split off q (when `gated`), k and v written to the caches' rows
    pos mod rows. q_raw [T, heads * d (* 2 gated)] or None (context rows: keys and values only); k_raw, v_raw
    [T, kv_heads * d]; cos, sin [T, rotary_dim]. Returns (q [T, heads, d] or None, gate [T, heads * d] or None)."""
    T = k_raw.shape[0]
    rows, kv_heads, d = k_cache.shape
    has_q = q_raw is not None
    q = torch.empty(T, heads, d, dtype=k_raw.dtype, device=k_raw.device) if has_q else None
    gate = torch.empty(T, heads * d, dtype=k_raw.dtype, device=k_raw.device) if has_q and gated else None
    kernels = lazy.attention()
    dummy = k_raw
    kernels._launch(
        kernels.prepare_kernel,
        (T, (heads if has_q else 0) + kv_heads),
        q_raw if has_q else dummy,
        k_raw,
        v_raw,
        q_weight if has_q else k_weight,
        k_weight,
        cos,
        sin,
        pos,
        q if has_q else dummy,
        gate if gate is not None else dummy,
        k_cache,
        v_cache,
        heads if has_q else 0,
        q_raw.stride(0) if q_raw is not None else 0,
        k_raw.stride(0),
        v_raw.stride(0),
        cos.stride(0),
        rows,
        k_cache.stride(0),
        k_cache.stride(1),
        eps,
        D=d,
        RD=cos.shape[-1],
        GATED=gated,
        ZERO_CENTRED=zero_centred,
        HAS_Q=has_q,
    )
    return q, gate
