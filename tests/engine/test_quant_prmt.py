"""The GPU build turns byte moves into PTX `prmt` (inline assembly the interpreter cannot run); the interpreter
runs shift-and-mask instead. A model of `prmt` (PTX ISA: bytes 0-3 from a, 4-7 from b; selector nibble i picks
result byte i, its bit 3 replicating the picked byte's sign) checks both compute the same words."""

from __future__ import annotations

import random
import re

import pytest

pytest.importorskip("triton")

from dflash_chat.engine.kernels import triton_quant  # noqa: E402


def prmt(a: int, b: int, selector: int) -> int:
    pool = (a | (b << 32)).to_bytes(8, "little")
    out = bytearray()
    for i in range(4):
        nibble = (selector >> (4 * i)) & 0xF
        byte = pool[nibble & 7]
        out.append((0xFF if byte & 0x80 else 0) if nibble & 8 else byte)
    return int.from_bytes(out, "little")


def _selector(asm) -> int:
    return int(re.fullmatch(r"prmt\.b32 \$0, \$1, \$2, (0x[0-9a-f]+);", str(asm.value)).group(1), 16)


def test_prmt_model_follows_the_ptx_manual_example():
    # PTX ISA, prmt default mode: selector 0x3210 returns a unchanged, 0x7654 returns b
    assert prmt(0x11223344, 0x55667788, 0x3210) == 0x11223344
    assert prmt(0x11223344, 0x55667788, 0x7654) == 0x55667788
    assert prmt(0x000000F0, 0, 0x4448) == 0xFF  # byte 0: sign of a.byte0 replicated; bytes 1-3: b.byte0


def test_float_levels_equal_shift_and_mask():
    """Bytes of a level word (each < 128) under 2.0's exponent: (word << 16, << 8, as is, >> 8) & 0xFF0000 | 2.0."""
    rng = random.Random(0)
    shifts = (16, 8, 0, -8)
    for _ in range(500):
        word = rng.getrandbits(32) & 0x7F7F7F7F
        for b, asm in enumerate(triton_quant.PRMT_FLOAT):
            moved = word << shifts[b] if shifts[b] >= 0 else word >> -shifts[b]
            assert prmt(word, 0x40000000, _selector(asm)) == (moved & 0x00FF0000) | 0x40000000


def test_half_levels_equal_shift_and_mask():
    """Q8_0's byte levels under fp16's exponent of 1024: the low half is (byte b) | 0x6400."""
    rng = random.Random(1)
    for _ in range(500):
        word = rng.getrandbits(32)
        for b, asm in enumerate(triton_quant.PRMT_HALF):
            assert prmt(word, 0x64646464, _selector(asm)) & 0xFFFF == ((word >> (8 * b)) & 0xFF) | 0x6400
