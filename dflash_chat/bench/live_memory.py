"""The peak working memory of a call: what it allocates on top of what was there before, at its highest.

On CUDA the caching allocator's own peak (`max_memory_allocated`) above what was allocated when the call began.
Elsewhere torch keeps no such count, so `LiveBytes` counts it op by op: the bytes of every tensor storage an op
made that is still alive (a storage is counted once, however many views share it; a view of a tensor that was
there before, such as a weight's transpose, not at all), and their peak.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """The bytes of every tensor storage an op made that is still alive, and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # an output on an input's storage (a view, or an op in place) allocated nothing: a weight's transpose is not
        # new memory
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or key in self.seen or key in inputs:
                continue
            self.seen.add(key)
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._freed, key, size)
        return out

    def _freed(self, key: int, size: int) -> None:
        self.seen.discard(key)
        self.live -= size


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """The most bytes fn() held at once beyond what was allocated before it (its result included)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    counter = LiveBytes()
    with counter:
        fn()
    return counter.peak


def peak_method(device: torch.device) -> str:
    """How `peak_bytes` measured on `device`, as a report says it."""
    if device.type == "cuda":
        return "the CUDA allocator's peak above what was allocated before"
    return "the peak of the tensors held live at once, counted op by op"
