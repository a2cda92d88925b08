"""Attention helpers: grouped-query SDPA over explicit boolean masks."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """q: [Q, heads, d]; k, v: [K, kv_heads, d]; mask: [Q, K] bool (True = visible) or None (all visible).

    Returns [Q, heads * d].
    """
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads:
        rep = heads // kv_heads
        k = k[:, :, None, :].expand(-1, kv_heads, rep, -1).reshape(k.shape[0], heads, -1)
        v = v[:, :, None, :].expand(-1, kv_heads, rep, -1).reshape(v.shape[0], heads, -1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
    )
    return out.transpose(0, 1).reshape(q.shape[0], -1)


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Query at position p sees keys at positions <= p (and > p - window when windowed)."""
    visible = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        visible &= (q_pos[:, None] - k_pos[None, :]) < window
    return visible
