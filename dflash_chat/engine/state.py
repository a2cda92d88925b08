"""Per-sequence model state: attention KV caches and Gated DeltaNet (recurrent + conv) state.

Everything is allocated once for the configured context; a forward writes in place.

Rollback after a partial accept (DFlash verifies B tokens, keeps n <= B of them):
- Attention: the cache rows beyond the kept length are simply ignored (length is a number).
- GDN: a recurrent state cannot be truncated. During a speculative forward each GDN layer copies its
  state before the block into a preallocated buffer and keeps what takes that state to the state after
  any prefix of the block (see gdn.py): for a block that fits one chunk (a verify block), the chunk's
  keys, cumulative decays and corrected values u from the triangular solve the forward did anyway, so
  `rollback(n)` is one batched matmul per layer: S0 * exp(G[n-1]) + (k[:n] * exp(G[n-1] - G[:n]))^T u[:n].
  Other blocks keep their recurrence inputs and re-run the first n tokens. The layer also keeps its conv
  window [conv state; the block's conv inputs]; the conv state after n tokens is rows n..n+kernel-2.
  Memory: one extra recurrent state per GDN layer, plus the block's k/u/decays and conv window (B rows).
  Compute: no projections, no second target forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionCache:
    k: torch.Tensor  # [max_len, kv_heads, head_dim]
    v: torch.Tensor


@dataclass
class GDNCache:
    recurrent: torch.Tensor  # [v_heads, k_dim, v_dim], float32
    conv: torch.Tensor  # [kernel-1, conv_dim]
    saved_recurrent: torch.Tensor  # the state before the last speculative forward
    # for rollback after the last speculative forward: (its ChunkUpdate or Replay, its conv window)
    record: tuple | None = None


@dataclass
class ModelState:
    layers: list  # AttentionCache | GDNCache per layer
    max_len: int
    length: int = 0  # committed positions
    pending: int = 0  # positions written by the last speculative forward, not yet committed

    def reset(self) -> None:
        self.length = 0
        self.pending = 0
        for layer in self.layers:
            if isinstance(layer, GDNCache):
                layer.recurrent.zero_()
                layer.conv.zero_()
                layer.record = None

    def gdn_layers(self) -> list[GDNCache]:
        return [c for c in self.layers if isinstance(c, GDNCache)]

    def save_recurrent(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of every GDN layer's recurrent and conv state (attention needs none: it truncates)."""
        return [(c.recurrent.clone(), c.conv.clone()) for c in self.gdn_layers()]

    def load_recurrent(self, saved: list[tuple[torch.Tensor, torch.Tensor]], length: int) -> None:
        """Back to a length whose recurrent state `save_recurrent` kept."""
        for cache, (rec, conv) in zip(self.gdn_layers(), saved):
            cache.recurrent.copy_(rec)
            cache.conv.copy_(conv)
        self.length = length
