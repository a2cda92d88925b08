"""How fast the disk reads a model file, to set a load rate beside it."""

from __future__ import annotations

import os
import time
from pathlib import Path

CHUNK = 16 << 20


def read_rate(path: str | Path, limit: int = 1 << 30) -> tuple[float, bool]:
    """(bytes per second reading up to `limit` bytes of `path`, whether the page cache was dropped first).

    The file's cached pages are dropped (posix_fadvise DONTNEED, Linux) so the figure is the disk's, not
    memory's; where that is not possible the second value is False and the figure may be memory's.
    """
    path = Path(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        dropped = hasattr(os, "posix_fadvise")
        if dropped:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        done = 0
        start = time.perf_counter()
        while done < limit:
            data = os.read(fd, min(CHUNK, limit - done))
            if not data:
                break
            done += len(data)
        seconds = time.perf_counter() - start
    finally:
        os.close(fd)
    return done / max(seconds, 1e-9), dropped


def largest_file(path: str | Path) -> Path:
    """The biggest weight file of a model (a GGUF file itself, or a folder's largest .safetensors)."""
    path = Path(path)
    if path.is_file():
        return path
    return max(path.glob("*.safetensors"), key=lambda p: p.stat().st_size)
