"""Which kernels run: the Triton ones on CUDA (and under Triton's interpreter when a test asks), else the torch
reference.

DFLASH_CHAT_NO_TRITON=1 forces the torch path everywhere; DFLASH_CHAT_NO_TRITON_<NAME> turns off one kernel
(ATTENTION, GDN). TRITON_INTERPRET=1 (tests on the CPU) takes the Triton paths on CPU tensors: the quant and glue
kernels always, ATTENTION and GDN only with DFLASH_CHAT_TRITON_<NAME>=1.

The environment is read once, at import: the checks below run on every operation. Code that changes these
variables afterwards (a test, the launch count) calls `reload()`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Switches:
    no_triton: bool  # DFLASH_CHAT_NO_TRITON
    interpret: bool  # TRITON_INTERPRET=1
    off: frozenset[str]  # the NAMEs of DFLASH_CHAT_NO_TRITON_<NAME>
    interpreted: frozenset[str]  # the NAMEs of DFLASH_CHAT_TRITON_<NAME>=1


def read(env: Mapping[str, str]) -> Switches:
    return Switches(
        no_triton=bool(env.get("DFLASH_CHAT_NO_TRITON")),
        interpret=env.get("TRITON_INTERPRET") == "1",
        off=_names(env, "DFLASH_CHAT_NO_TRITON_", bool),
        interpreted=_names(env, "DFLASH_CHAT_TRITON_", lambda value: value == "1"),
    )


def _names(env: Mapping[str, str], prefix: str, on) -> frozenset[str]:
    return frozenset(key[len(prefix) :] for key, value in env.items() if key.startswith(prefix) and on(value))


_now = read(os.environ)


def reload() -> None:
    """Read the environment again (after a test or the launch count changed it)."""
    global _now
    _now = read(os.environ)


@functools.cache
def _triton_imports() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure to import triton means: the torch path
        return False
    return True


def triton_available() -> bool:
    return not _now.no_triton and _triton_imports()


def use_triton(t: torch.Tensor) -> bool:
    return (t.is_cuda or _now.interpret) and triton_available()


def kernel_wanted(t: torch.Tensor, name: str) -> bool:
    """Whether the Triton kernel `name` (ATTENTION, GDN) runs on `t`: on CUDA unless DFLASH_CHAT_NO_TRITON_<name>
    is set; under TRITON_INTERPRET=1 (tests on the CPU) only when DFLASH_CHAT_TRITON_<name>=1."""
    if name in _now.off:
        return False
    return (t.is_cuda or (_now.interpret and name in _now.interpreted)) and triton_available()
