"""The routed pairs a grouped expert matmul reads: one value for the kernel path and the torch path alike."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Pairs:
    """(row, expert) pairs sorted by expert: the pair at sorted position i reads row `src[i]` of the input and
    writes row `dst[i]` of the output (dst: a permutation, so every output row is written once); expert e's
    pairs sit at positions offsets[e] .. offsets[e + 1]; `expert_of[i]` is the expert of position i (None:
    found from the offsets)."""

    src: torch.Tensor
    dst: torch.Tensor
    offsets: torch.Tensor
    expert_of: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.src.numel()
