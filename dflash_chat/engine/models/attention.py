"""Attention shared by targets and drafters: projections, grouped-query SDPA over the caches, boolean masks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dflash_chat.engine.models.layers import RMSNorm, apply_rotary
from dflash_chat.engine.models.span import Span


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
    out = F.scaled_dot_product_attention(qf, k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=m, scale=scale)
    return out.view(kv_heads, rep, Q, d).permute(2, 0, 1, 3).reshape(Q, heads * d)


def causal_mask(
    q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None, causal: bool = True
) -> torch.Tensor:
    """Visibility [Q, K]: a query at position p sees keys at positions <= p when causal, and, when windowed,
    only keys less than `window` positions before it (and, when not causal, after it: the drafters'
    bidirectional sliding layers, z-lab/dflash 07ebd93 `_attention_mask`)."""
    rel = q_pos[:, None] - k_pos[None, :]
    visible = rel >= 0 if causal else torch.ones_like(rel, dtype=torch.bool)
    if window is not None:
        visible &= rel.abs() < window
    return visible


def attend_cache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    span: Span,
    scale: float,
    *,
    causal: bool = True,
    window: int | None = None,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, heads, d] at `span.pos` against the cached positions [0, span.end) -> [T, heads * d].

    Position j lives in row j mod rows: the identity for a cache as long as the context, a ring for a
    sliding-window layer that keeps only its window.

    A query at position p sees key position j when j < end, and j <= p if causal, and |p - j| < window if
    windowed. On CUDA a length-aware kernel reads only the rows below `end`; elsewhere SDPA reads
    `span.bound` rows with a mask (all of them in fixed-shape steps, the used ones in eager steps).
    gate [T, heads * d] (Qwen3.5/3.6's output gate): the output times sigmoid(gate), in the kernel on CUDA.
    """
    from dflash_chat.engine.kernels import attention as kernel

    if kernel.available(q):
        return kernel.attend(q, k_cache, v_cache, span.pos, span.end, scale, causal, window, gate)
    out = _attend_rows(q, k_cache, v_cache, span, scale, causal, window)
    return out if gate is None else out * torch.sigmoid(gate)


def _attend_rows(q, k_cache, v_cache, span: Span, scale: float, causal: bool, window: int | None) -> torch.Tensor:
    rows = k_cache.shape[0]
    if span.bound <= rows:
        k, v = k_cache[: span.bound], v_cache[: span.bound]
        return attend(q, k, v, cache_mask(span, causal, window), scale)
    # a ring (a sliding-window layer's cache): row r holds the newest position below end that is r mod rows
    last = span.end - 1
    held = last - torch.remainder(last - torch.arange(rows, device=q.device), rows)
    visible = causal_mask(span.pos, held, window, causal) & (held >= 0)[None, :]
    return attend(q, k_cache, v_cache, visible, scale)


def cache_mask(span: Span, causal: bool, window: int | None) -> torch.Tensor | None:
    """Visibility [T, bound] of the cache rows for `attend_cache`'s reference path (None: all visible)."""
    eager = isinstance(span.end, int)
    if eager and window is None and (not causal or span.length == 1):
        return None  # every row up to end is visible
    keys = torch.arange(span.bound, device=span.pos.device)
    visible = causal_mask(span.pos, keys, window, causal)
    if not eager:
        visible &= keys[None, :] < span.end
    return visible


def write_rows(
    cache_k: torch.Tensor, cache_v: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """K/V of `positions` into their rows (j mod rows); of a run longer than a ring, only the newest rows."""
    rows = cache_k.shape[0]
    if positions.shape[0] > rows:
        positions, k, v = positions[-rows:], k[-rows:], v[-rows:]
    at = torch.remainder(positions, rows)
    cache_k.index_copy_(0, at, k)
    cache_v.index_copy_(0, at, v)


class Projections(nn.Module):
    """The q/k/v/o projections of a Qwen3-style attention layer, per-head q/k RMSNorm and RoPE.

    `gated` (Qwen3.5/3.6 targets): q_proj also yields a per-head output gate, packed as q then gate
    for each head. Parameter names are the checkpoints' (q_proj, k_proj, v_proj, o_proj, q_norm, k_norm).
    """

    def __init__(
        self,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        eps: float,
        zero_centred: bool = False,
        gated: bool = False,
    ):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.gated = gated
        self.q_proj = nn.Linear(hidden, heads * head_dim * (2 if gated else 1), bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps, zero_centred)
        self.k_norm = RMSNorm(head_dim, eps, zero_centred)
        self.scale = head_dim**-0.5
        self.shared = None  # q/k/v in one matmul per weight format, once fused (models/fused.py)

    def shared_input_parts(self) -> list[nn.Module]:
        return [self.q_proj, self.k_proj, self.v_proj]

    def into_cache(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        queries: bool = True,
    ):
        """(q, output gate) of x, its keys and values written to the caches' rows positions mod rows; on CUDA
        the norms, RoPE, gate split and cache writes are one kernel after the projections."""
        from dflash_chat.engine.kernels import attention as kernel

        if not kernel.available(x) or torch.is_grad_enabled():
            if queries:
                q, gate, k, v = self.project(x, cos, sin)
            else:
                (k, v), q, gate = self.keys_values(x, cos, sin), None, None
            write_rows(k_cache, v_cache, positions, k, v)
            return q, gate
        if not queries:
            if positions.shape[0] > k_cache.shape[0]:  # a long run into a ring: only its newest rows stay
                n = k_cache.shape[0]
                x, cos, sin, positions = x[-n:], cos[-n:], sin[-n:], positions[-n:]
            q_raw, (k_raw, v_raw) = None, (self.k_proj(x), self.v_proj(x))
        elif self.shared is not None:
            q_raw, k_raw, v_raw = self.shared(x)
        else:
            q_raw, k_raw, v_raw = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return kernel.prepare(
            q_raw,
            k_raw,
            v_raw,
            self.q_norm.weight,
            self.k_norm.weight,
            self.k_norm.eps,
            self.k_norm.zero_centred,
            cos,
            sin,
            positions,
            k_cache,
            v_cache,
            self.num_heads,
            self.gated,
        )

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """(q, output gate, k, v) as `queries` and `keys_values` give them, from one fused matmul when there is one."""
        if self.shared is None:
            return (*self.queries(x, cos, sin), *self.keys_values(x, cos, sin))
        q, k, v = self.shared(x)
        return (*self._queries(q, cos, sin), *self._keys_values(k, v, cos, sin))

    def queries(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(q [T, heads, d] normed and rotated, output gate [T, heads * d] or None)."""
        return self._queries(self.q_proj(x), cos, sin)

    def _queries(self, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        T = q.shape[0]
        gate = None
        if self.gated:
            q, gate = q.view(T, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
            gate = gate.reshape(T, -1)
        q = self.q_norm(q.reshape(T, self.num_heads, self.head_dim))
        return apply_rotary(q, cos, sin), gate

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) [T, kv_heads, d]; k normed and rotated."""
        return self._keys_values(self.k_proj(x), self.v_proj(x), cos, sin)

    def _keys_values(self, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        T = k.shape[0]
        k = self.k_norm(k.view(T, self.num_kv_heads, self.head_dim))
        v = v.view(T, self.num_kv_heads, self.head_dim)
        return apply_rotary(k, cos, sin), v
