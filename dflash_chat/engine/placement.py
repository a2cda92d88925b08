"""Checkpoint tensors onto their device, once each, with the bytes counted for a progress display.

A GGUF or safetensors tensor arrives as a view of the memory-mapped file. On CUDA it is copied
through two pinned staging buffers: while the GPU copies one buffer to the device (on a side stream),
the host fills the other from the file, so reading the disk and the transfer overlap and the file is
never copied whole into host memory. Elsewhere a tensor gets memory of its own (never a view of the
read-only mapping).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

STAGING_BYTES = 64 << 20  # per buffer; two buffers

Progress = Callable[[int, int], None]  # (bytes placed, bytes in all)


class Placement:
    def __init__(self, device: torch.device | str, total_bytes: int = 0, progress: Progress | None = None):
        self.device = torch.device(device)
        self.total = total_bytes
        self.progress = progress
        self.done = 0
        self.started = time.perf_counter()
        self._staging: list[tuple[torch.Tensor, torch.cuda.Event]] | None = None  # two pinned buffers
        self._stream: torch.cuda.Stream | None = None

    # -- moving -------------------------------------------------------------------------
    def place(self, t: torch.Tensor) -> torch.Tensor:
        """`t` on the device in memory of its own (a tensor already on an accelerator is kept)."""
        if t.device.type != "cpu" and t.device == self.device:
            return t
        if self.device.type != "cuda" or t.device.type != "cpu" or t.numel() == 0:
            moved = t.to(self.device)
            return moved.clone() if moved is t or moved.data_ptr() == t.data_ptr() else moved
        return self._staged(t)

    def _staged(self, t: torch.Tensor) -> torch.Tensor:
        stream, staging = self._staging_buffers()
        out = torch.empty(t.shape, dtype=t.dtype, device=self.device)
        src = t.contiguous().reshape(-1).view(torch.uint8)
        dst = out.reshape(-1).view(torch.uint8)
        for i, at in enumerate(range(0, src.numel(), STAGING_BYTES)):
            buf, copied = staging[i % 2]
            n = min(STAGING_BYTES, src.numel() - at)
            copied.synchronize()  # the device has finished reading this buffer
            buf[:n].copy_(src[at : at + n])
            with torch.cuda.stream(stream):
                dst[at : at + n].copy_(buf[:n], non_blocking=True)
                copied.record(stream)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        return out

    def _staging_buffers(self) -> tuple[torch.cuda.Stream, list[tuple[torch.Tensor, torch.cuda.Event]]]:
        """The copy stream and the two pinned buffers it copies from, made on first use."""
        if self._stream is None or self._staging is None:
            self._stream = torch.cuda.Stream(self.device)
            self._staging = [
                (torch.empty(STAGING_BYTES, dtype=torch.uint8, pin_memory=True), torch.cuda.Event()) for _ in range(2)
            ]
        return self._stream, self._staging

    # -- counting -----------------------------------------------------------------------
    def count(self, nbytes: int) -> None:
        self.done += nbytes
        if self.progress is not None:
            self.progress(self.done, max(self.total, self.done))

    def finish(self) -> None:
        """Wait for the last copies; report everything placed."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self.progress is not None:
            self.progress(max(self.total, self.done), max(self.total, self.done))

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started
