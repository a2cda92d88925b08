"""Memory in use where the model lives: VRAM on a GPU, this process's RAM on CPU.

torch is asked only when it is already imported (a model is loaded), so
calling this never pulls torch into the UI.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryUse:
    kind: str  # "VRAM" | "RAM"
    used_bytes: int
    total_bytes: int


def memory_use(device: str) -> MemoryUse | None:
    if device.startswith("cuda"):
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info(torch.device(device))
        return MemoryUse("VRAM", total - free, total)
    return _process_ram()


def _process_ram() -> MemoryUse | None:
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
        with open("/proc/self/statm") as handle:
            resident = int(handle.read().split()[1]) * page
    except (OSError, ValueError, AttributeError):
        return None
    return MemoryUse("RAM", resident, total)
