"""Per-sequence model state: attention KV caches and Gated DeltaNet (recurrent + conv) state.

Everything is allocated once for the configured context; a forward writes in place.

Commit after a partial accept (DFlash verifies B tokens, keeps n <= B of them):
- Attention: the cache rows beyond the kept length are simply ignored (length is a number, or a device
  tensor in fixed-shape steps) and overwritten by the next forward.
- GDN: a recurrent state cannot be truncated, so a speculative forward leaves the state as it was and
  keeps its conv output and gate projections (no projections to redo) in preallocated buffers;
  the commit of n tokens re-runs the recurrence over them in place, n a host int or a device tensor
  (tokens past n masked to a no-op, so the shapes do not depend on n): one read and one write of the
  state, like a decode step (see gdn.py and kernels/gdn.py). The layer also keeps its conv window [conv
  state; the block's conv inputs]; the conv state after n tokens is rows n..n+kernel-2.
  Memory: the block's inputs and conv window (B rows) per GDN layer; no copy of the state.
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
    # what the last speculative forward left for its commit (room for `block` tokens, grown on demand in eager
    # steps): its conv output [B, conv_dim], its raw gate projections b and a [B, v_heads], and its conv window
    # [kernel-1+B, conv_dim], all in the model dtype
    spec_qkv: torch.Tensor
    spec_b: torch.Tensor
    spec_a: torch.Tensor
    spec_window: torch.Tensor
    window_rows: torch.Tensor  # arange(kernel-1) on the device: the conv rows a commit takes from the window
    pending: int = 0  # tokens of the last speculative forward (0: none)
    solved: object | None = None  # its one-chunk solve when the torch path kept it (kernels/gdn.py Chunks)


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
                layer.pending = 0
                layer.solved = None

    def gdn_layers(self) -> list[GDNCache]:
        return [c for c in self.layers if isinstance(c, GDNCache)]

    def row_caches(self) -> list[torch.Tensor]:
        """The attention layers' K and V, whose row j holds position j."""
        return [t for c in self.layers if isinstance(c, AttentionCache) for t in (c.k, c.v)]

    def save_recurrent(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of every GDN layer's recurrent and conv state (attention needs none: it truncates)."""
        return [(c.recurrent.clone(), c.conv.clone()) for c in self.gdn_layers()]

    def load_recurrent(self, saved: list[tuple[torch.Tensor, torch.Tensor]], length: int) -> None:
        """Back to a length whose recurrent state `save_recurrent` kept."""
        for cache, (rec, conv) in zip(self.gdn_layers(), saved, strict=True):
            cache.recurrent.copy_(rec)
            cache.conv.copy_(conv)
            cache.pending = 0
            cache.solved = None
        self.length = length
        self.pending = 0
