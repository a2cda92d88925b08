"""Where a forward's new tokens go, as the attention layers and caches need it.

Eager steps know their positions on the host and read only the used cache rows. Fixed-shape steps
(the CUDA-graph path) keep the committed length on the device: their positions are a device tensor,
`end` is a device scalar, and they read up to the allocated length with a length mask (or a
length-aware kernel that stops at `end`), so one captured graph serves every position.

The rotary reads `rope`, where it is given: a token after an image rotates at its index plus the prompt's M-RoPE
offset (engine/models/image_prompt.py), while its cache row stays its index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Span:
    pos: torch.Tensor  # [T] int64 positions of the new tokens, on the model's device
    end: torch.Tensor | int  # cache rows that hold valid keys once the new ones are written (start + T)
    bound: int  # cache rows a reference path reads: `end` itself when eager, the allocated length when fixed
    rope: torch.Tensor | None = None  # [T] the positions the rotary reads, where they are not `pos`

    @classmethod
    def eager(cls, start: int, length: int, device: torch.device) -> Span:
        return cls(torch.arange(start, start + length, device=device), start + length, start + length)

    @classmethod
    def fixed(cls, start: torch.Tensor, offsets: torch.Tensor, bound: int, shift: torch.Tensor | None = None) -> Span:
        """T = len(offsets) tokens at device position `start` (a 0-d int64 tensor); no host value read. `shift` (a
        0-d int64 tensor): the rotary reads the positions moved by it."""
        rope = None if shift is None else (start + shift) + offsets
        return cls(start + offsets, start + offsets.shape[0], bound, rope)

    @property
    def rotated(self) -> torch.Tensor:
        """The positions the rotary reads."""
        return self.pos if self.rope is None else self.rope

    @property
    def length(self) -> int:
        return self.pos.shape[0]
