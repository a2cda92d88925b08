"""The Triton kernel modules, each imported the first time one of its kernels is wanted: importing one imports
triton (seconds), and whether TRITON_INTERPRET is set at that moment decides how its kernels are built."""

from __future__ import annotations

import functools
from types import ModuleType


@functools.cache
def quant() -> ModuleType:
    from dflash_chat.engine.kernels import triton_quant

    return triton_quant


@functools.cache
def glue() -> ModuleType:
    from dflash_chat.engine.kernels import triton_glue

    return triton_glue


@functools.cache
def attention() -> ModuleType:
    from dflash_chat.engine.kernels import triton_attention

    return triton_attention


@functools.cache
def gdn() -> ModuleType:
    from dflash_chat.engine.kernels import triton_gdn

    return triton_gdn
