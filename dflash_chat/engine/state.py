"""Per-sequence model state: attention KV caches and Gated DeltaNet (recurrent + conv) state.

Everything is allocated once for the configured context; a forward writes in place.

Commit after a partial accept (DFlash verifies B tokens, keeps n <= B of them):
- Attention: the cache rows beyond the kept length are simply ignored (length is a number, or a device
  tensor in fixed-shape steps) and overwritten by the next forward.
- GDN: a recurrent state cannot be truncated, so a speculative forward leaves the state as it was and
  keeps what takes it to the state after any prefix of the block (see gdn.py): for a block that fits one
  chunk (every verify block), the chunk's keys, cumulative decays and corrected values u from the
  triangular solve the forward did anyway, in preallocated buffers, so the commit of n tokens is one
  batched matmul per layer, in place: S0 * exp(G[n-1]) + (k[:n] * exp(G[n-1] - G[:n]))^T u[:n], with n a
  host int or a device tensor (a masked matmul over all B rows). Longer blocks keep their recurrence
  inputs and re-run the first n tokens. The layer also keeps its conv window [conv state; the block's
  conv inputs]; the conv state after n tokens is rows n..n+kernel-2.
  Memory: the block's k/u/decays and conv window (B rows) per GDN layer; no copy of the state.
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
    # what the last speculative forward left for its commit (preallocated for `block` tokens, grown on demand
    # in eager steps): chunk keys [H, B, k_dim], cumulative decays [H, B], corrected values [H, B, v_dim], all
    # float32, and the conv window [kernel-1+B, conv_dim]
    spec_k: torch.Tensor
    spec_G: torch.Tensor
    spec_u: torch.Tensor
    spec_window: torch.Tensor
    pending: object | None = None  # a ChunkUpdate over the buffers, or a Replay (blocks longer than a chunk)


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
                layer.pending = None

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
