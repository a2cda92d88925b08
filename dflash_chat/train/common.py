"""Small helpers shared by the training steps."""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Iterator

import torch

Log = Callable[[str], None]


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed Python and torch for a deterministic block (model init)."""
    random.seed(seed)
    torch.manual_seed(seed)
    yield


def cosine_lr(step: int, total: int, peak: float, warmup: int, min_ratio: float) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def autocast_for(device: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA; plain fp32 elsewhere (CPU bf16 matmuls are slow and less exact)."""
    if str(device).startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
