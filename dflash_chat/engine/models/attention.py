"""Attention helpers: grouped-query SDPA over explicit boolean masks."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """q: [Q, heads, d]; k, v: [K, kv_heads, d]; mask: [Q, K] bool (True = visible) or None (all visible).

    Returns [Q, heads * d].

    Grouped-query heads fold into the query length: the `rep` query heads sharing a KV head become
    rep * Q query rows against that head, so the cache is read as it is (never expanded to all heads)
    and any SDPA backend applies, with or without a mask. The leading batch dim of 1 is what lets
    SDPA pick its fused kernels (they take 4-D inputs only).
    """
    Q, heads, d = q.shape
    kv_heads = k.shape[1]
    rep = heads // kv_heads
    qf = q.reshape(Q, kv_heads, rep, d).permute(1, 2, 0, 3).reshape(1, kv_heads, rep * Q, d)
    m = None if mask is None else mask.repeat(rep, 1)
    out = F.scaled_dot_product_attention(
        qf, k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=m, scale=scale
    )
    return out.view(kv_heads, rep, Q, d).permute(2, 0, 1, 3).reshape(Q, heads * d)


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Query at position p sees keys at positions <= p (and > p - window when windowed)."""
    visible = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        visible &= (q_pos[:, None] - k_pos[None, :]) < window
    return visible
