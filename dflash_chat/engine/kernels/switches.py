"""Which kernels run: the Triton ones on CUDA (and under Triton's interpreter when a test asks), else the torch
reference. DFLASH_CHAT_NO_TRITON=1 forces the torch path everywhere; DFLASH_CHAT_NO_TRITON_<NAME> for one kernel."""

from __future__ import annotations

import functools
import os

import torch


@functools.cache
def triton_available() -> bool:
    if os.environ.get("DFLASH_CHAT_NO_TRITON"):
        return False
    try:
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure to import triton means: the torch path
        return False
    return True


def use_triton(t: torch.Tensor) -> bool:
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    return (t.is_cuda or interpret) and triton_available()


def kernel_wanted(t: torch.Tensor, name: str) -> bool:
    """Whether the Triton kernel `name` (ATTENTION, GDN) runs on `t`: on CUDA unless DFLASH_CHAT_NO_TRITON_<name>
    is set; under TRITON_INTERPRET=1 (tests on the CPU) only when DFLASH_CHAT_TRITON_<name>=1."""
    if os.environ.get(f"DFLASH_CHAT_NO_TRITON_{name}"):
        return False
    interpret = os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get(f"DFLASH_CHAT_TRITON_{name}") == "1"
    return (t.is_cuda or interpret) and triton_available()
