"""Triton kernels that read GGML blocks as int32 words straight from the packed rows.
One file past 500 lines: the GEMV, GEMM, expert and dequantize kernels inline one set of per-format decoders.

- `gemv`: y = x @ W.T for one row of x (decode). FMA, no tensor cores: a program owns BLOCK_N weight rows
  and a range of 256-value units of K; per unit it loads the packed words (128-bit loads where the format's
  fields are 16-byte aligned), decodes scales and mins once per group and turns every byte-wide level into
  a float with one integer op (the level placed in the mantissa of 2.0: 2 + u/64), so the dot product is
  one FMA per value; the constant part is taken out per group with the activations' group sums, which are
  computed once per program and shared by all its rows.
- `gemm`: the same decode for 2 <= M <= 32 (the 16-token verify); the unit's weights go to the tensor
  cores (tl.dot) against a BLOCK_M x 256 tile of x.
- split-K in one launch, deterministic: with too few row blocks to fill the GPU, the programs of a tile
  write fp32 partial sums to [split, M, N] and count their arrival on the tile's counter; the last to
  arrive adds the partials in split order (the sum never depends on which one that is) and re-arms the
  counter. The counters are one persistent zeroed buffer per device (kernels on one stream never
  overlap), so a step stays capturable and needs no second kernel.
- `experts_gemv` / `experts_gemm`: routed experts in one launch, one program per (sorted routed pair,
  row block); the pair's expert, source and destination rows come from device tensors (no host sync).
  Float experts (F32/F16/BF16) go through the same kernels.
- `dequantize`: packed rows -> a float matrix, bit-exact with `ggml/formats.py` (prefill then uses cuBLAS).

Every format's decode follows `ggml/formats.py` value for value; the tests compare both under
TRITON_INTERPRET=1. All loads in a loop body have the same tile shape (per-row and per-group fields are
read through broadcast pointers), so Triton gives them one register layout and never stages the tile
through shared memory (checked by `bench/compile_check.py`).

The per-format block decoders are @triton.jit helpers: kept beside every kernel that reads them, each format's
decode is written once, and a change to one is checked against all of them by the same tests.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from dflash_chat.engine.ggml.formats import IQ4_LEVELS, Format
from dflash_chat.engine.kernels import configs
from dflash_chat.engine.kernels.pairs import Pairs

FMT_IDS = {
    "Q8_0": 0,
    "Q4_0": 1,
    "Q5_0": 2,
    "Q5_1": 3,
    "Q4_K": 4,
    "Q5_K": 5,
    "Q6_K": 6,
    "Q2_K": 7,
    "Q3_K": 8,
    "IQ4_NL": 9,
    "IQ4_XS": 10,
    "F32": 100,
    "F16": 101,
    "BF16": 102,
}
_X_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# Compiled for a GPU, byte moves are one PRMT (inline PTX); the interpreter runs the same function as shift-and-mask
# (tests/engine/test_quant_prmt.py checks the selectors against it with a model of PRMT).
_PRMT = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")
# (word, 0x40000000) -> bytes (0, 0, byte b of word, 0x40): the float 2 + byte/64
PRMT_FLOAT = tuple(tl.constexpr(f"prmt.b32 $0, $1, $2, 0x7{b}44;") for b in range(4))
_PRMT_F0, _PRMT_F1, _PRMT_F2, _PRMT_F3 = PRMT_FLOAT
# (word, 0x64646464) -> low half (byte b of word, 0x64): the fp16 1024 + byte
PRMT_HALF = tuple(tl.constexpr(f"prmt.b32 $0, $1, $2, 0x444{b};") for b in range(4))
_PRMT_H0, _PRMT_H1, _PRMT_H2, _PRMT_H3 = PRMT_HALF


# --- reading the packed words ---------------------------------------------------------------------------


@triton.jit
def _word(rows_ptr, byte_off, t, ALIGNED: tl.constexpr):
    """Word t (int32) of the field at byte_off (even; a multiple of 4 when ALIGNED) of each row.

    rows_ptr: int32 pointers to the rows' starts (rows are whole words), byte_off: int32 offsets within a row,
    the same for every row (so the offset arithmetic is shared by all of a thread's rows).
    """
    at = (byte_off >> 2) + t
    if ALIGNED:
        return tl.load(rows_ptr + at)
    straddles = (byte_off & 2) != 0
    lo = tl.load(rows_ptr + at)
    hi = tl.load(rows_ptr + at + 1, mask=straddles, other=0)  # read only when the field straddles two words
    both = (hi.to(tl.int64) << 32) | (lo.to(tl.int64) & 0xFFFFFFFF)
    return (both >> ((byte_off & 2) * 8)).to(tl.int32)


@triton.jit
def _byte(rows_ptr, byte_off, zt, ALIGNED: tl.constexpr):
    """The byte at byte_off (a tensor of offsets within the row), zero-extended."""
    word = _word(rows_ptr, byte_off - (byte_off & 3), zt, ALIGNED)
    return (word >> ((byte_off & 3) * 8)) & 0xFF


@triton.jit
def _f16_at(rows_ptr, byte_off, zt):
    """The fp16 at byte_off (even) as fp32: one word holds it, so no second load (a block's last two bytes must
    not reach past the row: the next word may be past the tensor)."""
    word = tl.load(rows_ptr + (byte_off >> 2) + zt)
    return _f16lo(word >> ((byte_off & 2) * 8))


@triton.jit
def _f16lo(w):
    return (w & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _f16hi(w):
    return (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _spread4(bits):
    """4 bits (0..15) -> bit 4 of each byte of a word, bit i to byte i (one multiply: the copies never overlap)."""
    return (bits * 0x02040810) & 0x10101010


@triton.jit
def _k_scale_min(rows_ptr, base, j, zt):
    """Q4_K/Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes at offset 4."""
    s0 = _word(rows_ptr, base + 4, zt, True)
    s1 = _word(rows_ptr, base + 8, zt, True)
    s2 = _word(rows_ptr, base + 12, zt, True)
    sh = (j % 4) * 8
    a = (s0 >> sh) & 0xFF
    b = (s1 >> sh) & 0xFF
    e = (s2 >> sh) & 0xFF
    low = j < 4
    sc = tl.where(low, a & 63, (e & 0xF) | ((a >> 6) << 4))
    mn = tl.where(low, b & 63, (e >> 4) | ((b >> 6) << 4))
    return sc, mn


@triton.jit
def _decode(rows_ptr, base, c, t, zt, h: tl.constexpr, FMT: tl.constexpr):
    """Slot h of the unit at byte `base` of each row, over the tile [rows, C, T2, RW] (c: group, t: word in group).

    Returns (Q, scale, minv): Q holds four unsigned levels u in its bytes, and value = scale * (u - OFFSET) - minv
    (IQ4: u indexes the codebook, value = scale * level).
    """
    if FMT == 0:  # Q8_0: 8 blocks of (d, int8[32]); group c = block
        Q = _word(rows_ptr, base + 34 * c + 2, t, False) ^ -2139062144  # 0x80808080: u = q + 128
        scale = _f16_at(rows_ptr, base + 34 * c, zt)
        minv = scale * 0.0
    elif FMT == 1 or FMT == 9:  # Q4_0 / IQ4_NL: 8 blocks of (d, qs[16]); slot h = low/high nibbles
        Q = (_word(rows_ptr, base + 18 * c + 2, t, False) >> (4 * h)) & 0x0F0F0F0F
        scale = _f16_at(rows_ptr, base + 18 * c, zt)
        minv = scale * 0.0
    elif FMT == 2:  # Q5_0: (d, qh u32, qs[16]); value i's fifth bit is bit i of qh
        qs = _word(rows_ptr, base + 22 * c + 6, t, False)
        qh = _word(rows_ptr, base + 22 * c + 2, zt, False)
        Q = ((qs >> (4 * h)) & 0x0F0F0F0F) | _spread4((qh >> (16 * h + 4 * t)) & 0xF)
        scale = _f16_at(rows_ptr, base + 22 * c, zt)
        minv = scale * 0.0
    elif FMT == 3:  # Q5_1: (d, m, qh, qs[16]); value = d * u + m
        qs = _word(rows_ptr, base + 24 * c + 8, t, True)
        qh = _word(rows_ptr, base + 24 * c + 4, zt, True)
        Q = ((qs >> (4 * h)) & 0x0F0F0F0F) | _spread4((qh >> (16 * h + 4 * t)) & 0xF)
        dm = _word(rows_ptr, base + 24 * c, zt, True)
        scale = _f16lo(dm)
        minv = -_f16hi(dm)
    elif FMT == 4 or FMT == 5:  # Q4_K / Q5_K: group c = 64 values, slot h = its two 32-value sub-blocks
        if FMT == 4:
            Q = (_word(rows_ptr, base + 16 + 32 * c, t, True) >> (4 * h)) & 0x0F0F0F0F
        else:
            qh = _word(rows_ptr, base + 16 + c * 0, t, True)  # bit 2c+h of qh[l]: the fifth bit of value 64c+32h+l
            Q = ((_word(rows_ptr, base + 48 + 32 * c, t, True) >> (4 * h)) & 0x0F0F0F0F) | (
                ((qh >> (2 * c + h)) & 0x01010101) << 4
            )
        sc, mn = _k_scale_min(rows_ptr, base, 2 * c + h, zt)
        dd = _word(rows_ptr, base + c * 0, zt, True)
        scale = _f16lo(dd) * sc.to(tl.float32)
        minv = _f16hi(dd) * mn.to(tl.float32)
    elif FMT == 6:  # Q6_K: group c = (half, low/high 32-byte run of ql), slot h = nibble; value 128*half + 32*j + l
        half = c // 2
        j = 2 * h + c % 2
        ql = _word(rows_ptr, base + 32 * c, t, False)
        qh = _word(rows_ptr, base + 128 + 32 * half, t, False)
        Q = ((ql >> (4 * h)) & 0x0F0F0F0F) | (((qh >> (2 * j)) & 0x03030303) << 4)
        g = 8 * half + 2 * j + t // 4  # one int8 scale per 16 values
        sw = _word(rows_ptr, base + 192 + (g - (g & 3)), zt, False)
        sc = (sw << (24 - 8 * (g & 3))) >> 24
        scale = _f16_at(rows_ptr, base + 208 + c * 0, zt) * sc.to(tl.float32)
        minv = scale * 0.0
    elif FMT == 7:  # Q2_K: group c = half, slot h = 2-bit plane s; value 128*half + 32*s + l
        Q = (_word(rows_ptr, base + 16 + 32 * c, t, True) >> (2 * h)) & 0x03030303
        g = 8 * c + 2 * h + t // 4
        scb = _byte(rows_ptr, base + g, zt, True)
        dd = _word(rows_ptr, base + 80 + c * 0, zt, True)
        scale = _f16lo(dd) * (scb & 0xF).to(tl.float32)
        minv = _f16hi(dd) * (scb >> 4).to(tl.float32)
    elif FMT == 8:  # Q3_K: like Q2_K plus a high bit from hmask (bit 4*half + s of hmask[l]); u = q + 4
        hm = _word(rows_ptr, base + c * 0, t, False)
        Q = ((_word(rows_ptr, base + 32 + 32 * c, t, False) >> (2 * h)) & 0x03030303) | (
            ((hm >> (4 * c + h)) & 0x01010101) << 2
        )
        g = 8 * c + 2 * h + t // 4
        low = (_byte(rows_ptr, base + 96 + g % 8, zt, False) >> (4 * (g // 8))) & 0xF
        high = (_byte(rows_ptr, base + 104 + g % 4, zt, False) >> (2 * (g // 4))) & 3
        scale = _f16_at(rows_ptr, base + 108 + c * 0, zt) * ((low | (high << 4)) - 32).to(tl.float32)
        minv = scale * 0.0
    else:  # IQ4_XS: (d, scales_h u16, scales_l[4], qs[128]); group c = 32-value sub-block
        Q = (_word(rows_ptr, base + 8 + 16 * c, t, True) >> (4 * h)) & 0x0F0F0F0F
        head = _word(rows_ptr, base + c * 0, zt, True)
        ls = ((_word(rows_ptr, base + 4 + c * 0, zt, True) >> (4 * c)) & 0xF) | (((head >> (16 + 2 * c)) & 3) << 4)
        scale = _f16lo(head) * (ls - 32).to(tl.float32)
        minv = scale * 0.0
    return Q, scale, minv


@triton.jit
def _x_quad(c, t, h, FMT: tl.constexpr):
    """Index / 4 (within the unit) of the activation that byte 0 of word (c, t), slot h multiplies."""
    if FMT == 0:
        return 8 * c + t
    elif FMT == 4 or FMT == 5:
        return 16 * c + 8 * h + t
    elif FMT == 6:
        return 32 * (c // 2) + 16 * h + 8 * (c % 2) + t
    elif FMT == 7 or FMT == 8:
        return 32 * c + 8 * h + t
    else:  # 32-value blocks (and IQ4_XS's sub-blocks): low nibbles are values 0..15, high ones 16..31
        return 8 * c + 4 * h + t


@triton.jit
def _offset(FMT: tl.constexpr):
    """The level u's offset: value = scale * (u - OFFSET) - minv."""
    if FMT == 0:
        return 128.0
    elif FMT == 1:
        return 8.0
    elif FMT == 2:
        return 16.0
    elif FMT == 6:
        return 32.0
    elif FMT == 8:
        return 4.0
    else:
        return 0.0


@triton.jit
def _is_table(FMT: tl.constexpr):
    return FMT == 9 or FMT == 10


@triton.jit
def _exponent_word(kv_ptr, zt, FMT: tl.constexpr):
    """The exponent bytes `_level` puts above a level (0x40000000: 2.0; Q8_0: 0x64 bytes, fp16 1024), loaded once
    before the loop from the constants table (entries 16, 17). PRMT needs its second word or its selector in a
    register; with a constant there, ptxas re-creates it (from a uniform register) before every PRMT."""
    return tl.load(kv_ptr + 16 + (FMT == 0) + zt).to(tl.int32, bitcast=True)


@triton.jit
def _prmt(Q, magic, b: tl.constexpr, HALF: tl.constexpr):
    """PTX prmt of (Q, magic) with the selector PRMT_HALF[b] (HALF) or PRMT_FLOAT[b]. (One call per branch: a
    selector taken from a constexpr tuple or held in a local needs newer Tritons than some machines run.)"""
    if HALF:
        if b == 0:
            return tl.inline_asm_elementwise(_PRMT_H0, "=r,r,r", [Q, magic], dtype=tl.int32, is_pure=True, pack=1)
        elif b == 1:
            return tl.inline_asm_elementwise(_PRMT_H1, "=r,r,r", [Q, magic], dtype=tl.int32, is_pure=True, pack=1)
        elif b == 2:
            return tl.inline_asm_elementwise(_PRMT_H2, "=r,r,r", [Q, magic], dtype=tl.int32, is_pure=True, pack=1)
        return tl.inline_asm_elementwise(_PRMT_H3, "=r,r,r", [Q, magic], dtype=tl.int32, is_pure=True, pack=1)
    if b == 0:
        return tl.inline_asm_elementwise(_PRMT_F0, "=r,r,r", [Q, magic], dtype=tl.int32, is_pure=True, pack=1)
    elif b == 1:
        return tl.inline_asm_elementwise(_PRMT_F1, "=r,r,r", [Q, magic], dtype=tl.int32, is_pure=True, pack=1)
    elif b == 2:
        return tl.inline_asm_elementwise(_PRMT_F2, "=r,r,r", [Q, magic], dtype=tl.int32, is_pure=True, pack=1)
    return tl.inline_asm_elementwise(_PRMT_F3, "=r,r,r", [Q, magic], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _level(Q, b: tl.constexpr, kv_ptr, FMT: tl.constexpr, magic):
    """Byte b of Q as a float f = 2 + u * 2^-6 (levels u < 128), built by placing u in the mantissa of 2.0 (one
    PRMT: no int-to-float conversion); Q8_0: f = 1024 + u through fp16; IQ4: the codebook level itself."""
    if _is_table(FMT):
        return tl.load(kv_ptr + ((Q >> (8 * b)) & 0xF))
    if FMT == 0:  # 8-bit levels: under the fp16 exponent of 1024 (0x64uu = 1024 + u, exact), then half to float
        if _PRMT:
            h = _prmt(Q, magic, b, True)
        else:
            h = ((Q >> (8 * b)) & 0xFF) | 0x6400
        return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    if _PRMT:  # the level byte moves to byte 2 under the exponent byte of 2.0 (levels < 128 leave bit 23 clear)
        return _prmt(Q, magic, b, False).to(tl.float32, bitcast=True)
    p = Q << (16 - 8 * b) if b < 2 else Q >> (8 * b - 16)
    return ((p & 0x00FF0000) | 0x40000000).to(tl.float32, bitcast=True)


@triton.jit
def _affine(FMT: tl.constexpr):
    """(A, 1/B) of `_level`'s f = A + B * u."""
    if _is_table(FMT):
        return 0.0, 1.0
    if FMT == 0:
        return 1024.0, 1.0
    return 2.0, 64.0


@triton.jit
def _xval(xq, b: tl.constexpr, X_KIND: tl.constexpr):
    """Value b of four packed 16-bit activations (int64) as fp32."""
    if X_KIND == 1:  # bf16: the bits are the top half of an fp32
        if b == 0:
            v = xq << 16
        elif b == 1:
            v = xq & 0xFFFF0000
        elif b == 2:
            v = (xq >> 16) & 0xFFFF0000
        else:
            v = (xq >> 32) & 0xFFFF0000
        return v.to(tl.int32).to(tl.float32, bitcast=True)
    return ((xq >> (16 * b)) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _pick_first(a, b):
    return a


@triton.jit
def _first(x):
    """x[..., 0] of a tensor constant along its last dim (held in one thread): no arithmetic when compiled
    (the interpreter would run the combine function in Python per element: there, the equal max)."""
    if _PRMT:
        return tl.reduce(x, 3, _pick_first)
    return tl.max(x, axis=3)


@triton.jit
def _tile_index(BN: tl.constexpr, C: tl.constexpr, T2: tl.constexpr, RW: tl.constexpr):
    c = tl.arange(0, C)[None, :, None, None]
    t = tl.arange(0, T2)[None, None, :, None] * RW + tl.arange(0, RW)[None, None, None, :]
    zr = tl.zeros([BN, 1, 1, 1], dtype=tl.int32)
    return c, t, (c + t) * 0, zr  # zt: every per-row field is read through a full-shape (broadcast) pointer


@triton.jit
def _row_starts(w_ptr, rows, N, row_bytes):
    """int32 pointers [BN, 1, 1, 1] to the packed rows' starts; rows past N read row N-1 (no predicated loads):
    their results are never stored."""
    return w_ptr + tl.minimum(rows, N - 1).to(tl.int64)[:, None, None, None] * (row_bytes // 4)


@triton.jit
def _mma(acc, x, w):
    """acc + x @ w.T on the tensor cores: fp32 activations in full precision, 16-bit ones with w in their dtype."""
    if x.dtype == tl.float32:
        return acc + tl.dot(x, tl.trans(w.to(tl.float32)), input_precision="ieee")
    return acc + tl.dot(x, tl.trans(w.to(x.dtype)))


# --- M = 1: FMA ------------------------------------------------------------------------------------------


@triton.jit
def _gemv_rows(
    x_ptr,
    w_ptr,
    kv_ptr,
    rows,
    N,
    row_bytes,
    u_start,
    u_end,
    FMT: tl.constexpr,
    C: tl.constexpr,
    T2: tl.constexpr,
    RW: tl.constexpr,
    NH: tl.constexpr,
    UNIT_BYTES: tl.constexpr,
    X_KIND: tl.constexpr,
    BN: tl.constexpr,
):
    """sum over units u_start..u_end-1 of W[rows, unit] . x[unit] -> fp32 [BN]. x: int64 view (16-bit) or fp32."""
    c, t, zt, zr = _tile_index(BN, C, T2, RW)
    rows_ptr = _row_starts(w_ptr, rows, N, row_bytes)
    A, INV_B = _affine(FMT)
    magic = _exponent_word(kv_ptr, zt, FMT)
    acc = tl.zeros([BN, C, T2], dtype=tl.float32)
    for u in range(u_start, u_end):
        base = u * UNIT_BYTES
        for h in tl.static_range(NH):
            Q, scale, minv = _decode(rows_ptr, base, c, t, zt, h, FMT)
            quad = u * 64 + _x_quad(c, t, h, FMT) + zr
            if X_KIND == 0:
                x0 = tl.load(x_ptr + 4 * quad)
                x1 = tl.load(x_ptr + 4 * quad + 1)
                x2 = tl.load(x_ptr + 4 * quad + 2)
                x3 = tl.load(x_ptr + 4 * quad + 3)
            else:
                xq = tl.load(x_ptr + quad)
                x0 = _xval(xq, 0, X_KIND)
                x1 = _xval(xq, 1, X_KIND)
                x2 = _xval(xq, 2, X_KIND)
                x3 = _xval(xq, 3, X_KIND)
            dot = _level(Q, 0, kv_ptr, FMT, magic) * x0
            dot += _level(Q, 1, kv_ptr, FMT, magic) * x1
            dot += _level(Q, 2, kv_ptr, FMT, magic) * x2
            dot += _level(Q, 3, kv_ptr, FMT, magic) * x3
            # a thread's 4 words share their group: sum them in registers, then scale once per group
            dot = tl.sum(dot, axis=3)
            xsum = tl.sum((x0 + x1) + (x2 + x3), axis=3)  # activations only: shared by all of the thread's rows
            # sum (scale (u - OFF) - minv) x = scale/B * dot - (scale (A/B + OFF) + minv) * xsum: two FMAs
            acc += dot * _first(scale * INV_B)
            acc -= xsum * _first(scale * (A * INV_B + _offset(FMT)) + minv)
    return tl.sum(tl.sum(acc, axis=2), axis=1)


@triton.jit
def _gemv_float_rows(x_ptr, w_ptr, rows, N, K, u_start, u_end, BN: tl.constexpr):
    """Float weights [N, K] (any float dtype) times one row x -> fp32 [BN], in 64-value steps (a [BN, 64] accumulator:
    32 registers per thread at BN = 64)."""
    ks = tl.arange(0, 64)[None, :]
    rows_ptr = w_ptr + tl.minimum(rows, N - 1).to(tl.int64)[:, None] * K  # rows past N are never stored
    zr = tl.zeros([BN, 1], dtype=tl.int32)
    acc = tl.zeros([BN, 64], dtype=tl.float32)
    for k0 in range(u_start * 256, u_end * 256, 64):
        w = tl.load(rows_ptr + k0 + ks)
        x = tl.load(x_ptr + k0 + ks + zr)
        acc += w.to(tl.float32) * x.to(tl.float32)
    return tl.sum(acc, axis=1)


@triton.jit
def _finish_split(part_ptr, y_ptr, count_ptr, tile, offs, live, total, splits):
    """Every split of a tile calls this after storing its partial sums (part[split] + offs): the last to
    arrive writes y[offs] = part[0] + part[1] + ... (in split order) and sets the tile's counter back to 0."""
    # A CTA barrier, then one thread's release at GPU scope, publishes every thread's stores (the pattern of
    # CUTLASS's split-K semaphore); the last program's acquire makes them visible, read from L2 (.cg).
    tl.debug_barrier()
    arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
    if arrived == splits - 1:
        acc = tl.load(part_ptr + offs, mask=live, other=0.0, cache_modifier=".cg")  # L2: what the others wrote
        for s in range(1, splits):
            acc += tl.load(part_ptr + s * total + offs, mask=live, other=0.0, cache_modifier=".cg")
        tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=live)
        tl.atomic_xchg(count_ptr + tile, 0)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    kv_ptr,
    y_ptr,
    count_ptr,
    N,
    row_bytes,
    units,
    units_per_split,
    splits,
    FMT: tl.constexpr,
    C: tl.constexpr,
    T2: tl.constexpr,
    RW: tl.constexpr,
    NH: tl.constexpr,
    UNIT_BYTES: tl.constexpr,
    X_KIND: tl.constexpr,
    BN: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """out[n] (in out's dtype) for one row of x; SPLIT over K: out[split, n] holds fp32 partial sums and the
    tile's last split writes their sum to y[n]."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BN + tl.arange(0, BN)
    u_start = pid_k * units_per_split
    u_end = tl.minimum(u_start + units_per_split, units)
    y = _gemv_rows(x_ptr, w_ptr, kv_ptr, rows, N, row_bytes, u_start, u_end, FMT, C, T2, RW, NH, UNIT_BYTES, X_KIND, BN)
    tl.store(out_ptr + pid_k * N + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)
    if SPLIT:
        _finish_split(out_ptr, y_ptr, count_ptr, pid_n, rows, rows < N, N, splits)


# --- 2 <= M <= 32: tensor cores ---------------------------------------------------------------------------


@triton.jit
def _join4(a, b, c, d):
    """Four equal tensors -> [..., 2, 2] whose flattened last two dims are a, b, c, d in order."""
    return tl.join(tl.join(a, c), tl.join(b, d))


@triton.jit
def _slot_values(rows_ptr, kv_ptr, base, c, t, zt, magic, h: tl.constexpr, FMT: tl.constexpr, EXACT: tl.constexpr):
    """Slot h's weights as fp32 [BN, C, T2, RW, 2, 2] (word, then byte b = 2i + k)."""
    A, INV_B = _affine(FMT)
    Q, scale, minv = _decode(rows_ptr, base, c, t, zt, h, FMT)
    if _is_table(FMT):
        return _join4(
            scale * _level(Q, 0, kv_ptr, FMT, magic),
            scale * _level(Q, 1, kv_ptr, FMT, magic),
            scale * _level(Q, 2, kv_ptr, FMT, magic),
            scale * _level(Q, 3, kv_ptr, FMT, magic),
        )
    elif EXACT:
        off = _offset(FMT)
        return _join4(
            scale * ((Q & 0xFF).to(tl.float32) - off) - minv,
            scale * (((Q >> 8) & 0xFF).to(tl.float32) - off) - minv,
            scale * (((Q >> 16) & 0xFF).to(tl.float32) - off) - minv,
            scale * (((Q >> 24) & 0xFF).to(tl.float32) - off) - minv,
        )
    else:
        mul = scale * INV_B
        sub = scale * (A * INV_B + _offset(FMT)) + minv
        return _join4(
            _level(Q, 0, kv_ptr, FMT, magic) * mul - sub,
            _level(Q, 1, kv_ptr, FMT, magic) * mul - sub,
            _level(Q, 2, kv_ptr, FMT, magic) * mul - sub,
            _level(Q, 3, kv_ptr, FMT, magic) * mul - sub,
        )


@triton.jit
def _unit_values(
    rows_ptr,
    kv_ptr,
    base,
    c,
    t,
    zt,
    magic,
    FMT: tl.constexpr,
    BN: tl.constexpr,
    C: tl.constexpr,
    T2: tl.constexpr,
    RW: tl.constexpr,
    NH: tl.constexpr,
    EXACT: tl.constexpr,
):
    """The unit's 256 weights of each row as fp32 [BN, C, T2, RW, 4, NH] (word, byte, slot order).

    EXACT: scale * (u - OFFSET) - minv as in formats.py (dequantize); else the same through the affine levels
    (one FMA per value; what the matmul uses).
    """
    s0 = _slot_values(rows_ptr, kv_ptr, base, c, t, zt, magic, 0, FMT, EXACT)
    if NH == 1:
        v = s0
    elif NH == 2:
        v = tl.join(s0, _slot_values(rows_ptr, kv_ptr, base, c, t, zt, magic, 1, FMT, EXACT))
    else:
        v = _join4(
            s0,
            _slot_values(rows_ptr, kv_ptr, base, c, t, zt, magic, 1, FMT, EXACT),
            _slot_values(rows_ptr, kv_ptr, base, c, t, zt, magic, 2, FMT, EXACT),
            _slot_values(rows_ptr, kv_ptr, base, c, t, zt, magic, 3, FMT, EXACT),
        )
    return tl.reshape(v, [BN, C, T2, RW, 4, NH])


@triton.jit
def _unit_x_index(FMT: tl.constexpr, C: tl.constexpr, T2: tl.constexpr, RW: tl.constexpr, NH: tl.constexpr):
    """Index within the unit of the activation for each weight of `_unit_values` -> [1, C, T2, RW, 4, NH]."""
    c = tl.arange(0, C)[None, :, None, None, None, None]
    t = tl.arange(0, T2)[None, None, :, None, None, None] * RW + tl.arange(0, RW)[None, None, None, :, None, None]
    b = tl.arange(0, 4)[None, None, None, None, :, None]
    h = tl.arange(0, NH)[None, None, None, None, None, :]
    return 4 * _x_quad(c, t, h, FMT) + b


@triton.jit
def _slot_x_index(FMT: tl.constexpr, C: tl.constexpr, T2: tl.constexpr, RW: tl.constexpr, h: tl.constexpr):
    """Index within the unit of the activation for each weight of `_slot_values` -> [1, C, T2, RW, 4]."""
    c = tl.arange(0, C)[None, :, None, None, None]
    t = tl.arange(0, T2)[None, None, :, None, None] * RW + tl.arange(0, RW)[None, None, None, :, None]
    return 4 * _x_quad(c, t, h, FMT) + tl.arange(0, 4)[None, None, None, None, :]


@triton.jit
def _gemm_tile(
    x_ptr,
    w_ptr,
    kv_ptr,
    rows,
    N,
    row_bytes,
    K,
    x_rows,
    x_live,
    stride_xm,
    u_start,
    u_end,
    FMT: tl.constexpr,
    C: tl.constexpr,
    T2: tl.constexpr,
    RW: tl.constexpr,
    NH: tl.constexpr,
    UNIT_BYTES: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
):
    """fp32 [BM, BN]: x[x_rows] @ W[rows].T over units u_start..u_end-1 (x rows given as indices, x_live masks)."""
    x_row = x_rows.to(tl.int64)[:, None, None, None, None] * stride_xm
    live = x_live[:, None, None, None, None]
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    if FMT >= 100:
        ks = tl.arange(0, 256)
        for u in range(u_start, u_end):
            k = u * 256 + ks
            w = tl.load(w_ptr + rows.to(tl.int64)[:, None] * K + k[None, :], mask=(rows < N)[:, None], other=0.0)
            x = tl.load(x_ptr + x_rows.to(tl.int64)[:, None] * stride_xm + k[None, :], mask=x_live[:, None], other=0.0)
            acc = _mma(acc, x, w)
    else:
        c, t, zt, zr = _tile_index(BN, C, T2, RW)
        rows_ptr = _row_starts(w_ptr, rows, N, row_bytes)
        magic = _exponent_word(kv_ptr, zt, FMT)
        for u in range(u_start, u_end):
            for h in tl.static_range(NH):  # one dot per slot: only a slot's weights are live at once
                w = _slot_values(rows_ptr, kv_ptr, u * UNIT_BYTES, c, t, zt, magic, h, FMT, False)
                x = tl.load(x_ptr + x_row + u * 256 + _slot_x_index(FMT, C, T2, RW, h), mask=live, other=0.0)
                w = tl.reshape(w, [BN, 256 // NH])
                x = tl.reshape(x, [BM, 256 // NH])
                acc = _mma(acc, x, w)
    return acc


@triton.jit
def _gemm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    kv_ptr,
    y_ptr,
    count_ptr,
    M,
    N,
    row_bytes,
    stride_xm,
    units,
    units_per_split,
    splits,
    FMT: tl.constexpr,
    C: tl.constexpr,
    T2: tl.constexpr,
    RW: tl.constexpr,
    NH: tl.constexpr,
    UNIT_BYTES: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """out[m, n]; SPLIT over K: out[split, m, n] holds fp32 partial sums and the tile's last split writes
    their sum to y[m, n]."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows = pid_n * BN + tl.arange(0, BN)
    ms = pid_m * BM + tl.arange(0, BM)
    u_start = pid_k * units_per_split
    u_end = tl.minimum(u_start + units_per_split, units)
    acc = _gemm_tile(
        x_ptr,
        w_ptr,
        kv_ptr,
        rows,
        N,
        row_bytes,
        units * 256,
        ms,
        ms < M,
        stride_xm,
        u_start,
        u_end,
        FMT,
        C,
        T2,
        RW,
        NH,
        UNIT_BYTES,
        BM,
        BN,
    )
    offs = ms[:, None] * N + rows[None, :]
    live = (ms < M)[:, None] & (rows < N)[None, :]
    tl.store(out_ptr + pid_k.to(tl.int64) * M * N + offs, acc.to(out_ptr.dtype.element_ty), mask=live)
    if SPLIT:
        _finish_split(out_ptr, y_ptr, count_ptr, pid_m * tl.num_programs(0) + pid_n, offs, live, M * N, splits)


# --- routed experts ---------------------------------------------------------------------------------------


@triton.jit
def _experts_gemv_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    kv_ptr,
    src_ptr,
    dst_ptr,
    expert_ptr,
    N,
    K,
    row_bytes,
    expert_stride,
    units,
    stride_xm,
    stride_om,
    FMT: tl.constexpr,
    C: tl.constexpr,
    T2: tl.constexpr,
    RW: tl.constexpr,
    NH: tl.constexpr,
    UNIT_BYTES: tl.constexpr,
    X_KIND: tl.constexpr,
    BN: tl.constexpr,
):
    """Program (i, n): out[dst[i]] = x[src[i]] @ W[expert[i]].T for one routed pair i."""
    i = tl.program_id(0)
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    e = tl.load(expert_ptr + i).to(tl.int64)
    src = tl.load(src_ptr + i).to(tl.int64)
    dst = tl.load(dst_ptr + i).to(tl.int64)
    x_src = x_ptr + src * stride_xm  # the pair's row of x
    w_e = w_ptr + e * expert_stride  # int32 words (quantized) or values (float)
    if FMT >= 100:
        y = _gemv_float_rows(x_src, w_e, rows, N, K, 0, units, BN)
    else:
        y = _gemv_rows(x_src, w_e, kv_ptr, rows, N, row_bytes, 0, units, FMT, C, T2, RW, NH, UNIT_BYTES, X_KIND, BN)
    tl.store(out_ptr + dst * stride_om + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)


@triton.jit
def _experts_gemm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    kv_ptr,
    src_ptr,
    dst_ptr,
    expert_ptr,
    offsets_ptr,
    N,
    K,
    row_bytes,
    expert_stride,
    units,
    stride_xm,
    stride_om,
    FMT: tl.constexpr,
    C: tl.constexpr,
    T2: tl.constexpr,
    RW: tl.constexpr,
    NH: tl.constexpr,
    UNIT_BYTES: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
):
    """Program (i, n): if sorted pair i starts a block of BM pairs of its expert, that block's rows times the expert."""
    i = tl.program_id(0)
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    e = tl.load(expert_ptr + i)
    first = tl.load(offsets_ptr + e)
    end = tl.load(offsets_ptr + e + 1)
    if (i - first) % BM == 0:  # other programs of the block exit at once
        pos = i + tl.arange(0, BM)
        live = pos < end
        src = tl.load(src_ptr + pos, mask=live, other=0)
        dst = tl.load(dst_ptr + pos, mask=live, other=0).to(tl.int64)
        acc = _gemm_tile(
            x_ptr,
            w_ptr + e.to(tl.int64) * expert_stride,
            kv_ptr,
            rows,
            N,
            row_bytes,
            K,
            src,
            live,
            stride_xm,
            0,
            units,
            FMT,
            C,
            T2,
            RW,
            NH,
            UNIT_BYTES,
            BM,
            BN,
        )
        tl.store(
            out_ptr + dst[:, None] * stride_om + rows[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=live[:, None] & (rows < N)[None, :],
        )


# --- dequantize -------------------------------------------------------------------------------------------


@triton.jit
def _dequant_kernel(
    w_ptr,
    out_ptr,
    kv_ptr,
    N,
    row_bytes,
    K,
    FMT: tl.constexpr,
    C: tl.constexpr,
    T2: tl.constexpr,
    RW: tl.constexpr,
    NH: tl.constexpr,
    UNIT_BYTES: tl.constexpr,
    BN: tl.constexpr,
):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    u = tl.program_id(1)
    c, t, zt, zr = _tile_index(BN, C, T2, RW)
    rows_ptr = _row_starts(w_ptr, rows, N, row_bytes)
    magic = _exponent_word(kv_ptr, zt, FMT)
    v = _unit_values(rows_ptr, kv_ptr, u * UNIT_BYTES, c, t, zt, magic, FMT, BN, C, T2, RW, NH, True)
    at = rows.to(tl.int64)[:, None, None, None, None, None] * K + u * 256 + _unit_x_index(FMT, C, T2, RW, NH)
    tl.store(out_ptr + at, v.to(out_ptr.dtype.element_ty), mask=(rows < N)[:, None, None, None, None, None])


# --- host side --------------------------------------------------------------------------------------------


def _launch(kernel, grid, *args, **kwargs) -> None:
    """Every launch goes through here (bench/compile_check.py captures them to compile without a GPU)."""
    kernel[grid](*args, **kwargs)


@functools.cache
def _levels(device: torch.device) -> torch.Tensor:
    """The kernels' constants: the IQ4 codebook, then the exponent words of _exponent_word."""
    levels = torch.tensor(IQ4_LEVELS, dtype=torch.float32).view(torch.int32)
    words = torch.cat([levels, torch.tensor([0x40000000, 0x64646464], dtype=torch.int32)])
    return words.view(torch.float32).to(device)


def _family(device: torch.device) -> configs.Family:
    if device.type != "cuda":
        return configs.FAMILIES["sm_90"]
    return configs.family_of(torch.cuda.get_device_capability(device))


@functools.cache
def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a few programs, so split-K is exercised on tiny shapes
    return torch.cuda.get_device_properties(device).multi_processor_count


def _constexprs(fmt: Format) -> dict:
    if not fmt.quantized:
        return dict(FMT=FMT_IDS[fmt.name], C=1, T2=1, RW=1, NH=1, UNIT_BYTES=0)
    til = configs.TILINGS[fmt.name]
    return dict(FMT=FMT_IDS[fmt.name], C=til.groups, T2=til.runs, RW=til.vec, NH=til.slots, UNIT_BYTES=til.unit_bytes)


def _words(packed: torch.Tensor) -> torch.Tensor:
    """uint8 rows -> the same bytes as int32 words (rows are whole words: see configs.kernel_supports)."""
    return packed.contiguous().view(torch.int32)


def _x_arg(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x as the kernels read it: 16-bit rows as int64 (four values per load), fp32 as is."""
    kind = _X_KIND[x.dtype]
    return (x, kind) if kind == 0 else (x.view(torch.int64), kind)


def supports(fmt: Format, k: int) -> bool:
    return fmt.quantized and configs.kernel_supports(fmt.name, k, fmt.row_bytes(k))


def launch_for(fmt: Format, m: int, n: int, k: int, device: torch.device) -> configs.Launch:
    return configs.pick_launch(fmt.name, m, n, k, _family(device), _sms(device))


def matmul_small_m(
    x: torch.Tensor, packed: torch.Tensor, fmt: Format, n: int, launch: configs.Launch | None = None
) -> torch.Tensor:
    """x [M, K] (M <= 32) @ W.T -> [M, n] in x.dtype; W [n, K] packed rows (see configs.kernel_supports)."""
    m, k = x.shape
    x = x.contiguous()
    launch = launch or launch_for(fmt, m, n, k, x.device)
    units = k // configs.UNIT
    per_split = -(-units // launch.split)
    split = -(-units // per_split)
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    out = torch.empty(split, m, n, device=x.device, dtype=torch.float32) if split > 1 else y
    counters = _counters(x.device) if split > 1 else y
    common = dict(**_constexprs(fmt), BN=launch.block_n, num_warps=launch.warps, enable_fp_fusion=True, SPLIT=split > 1)
    w, rb = _words(packed), packed.shape[-1]
    blocks_n, blocks_m = triton.cdiv(n, launch.block_n), triton.cdiv(m, launch.block_m)
    if split > 1 and blocks_n * blocks_m > COUNTERS:
        raise ValueError(f"split-K over {blocks_n * blocks_m} tiles: more than the {COUNTERS} counters")
    if launch.kernel == "gemv":
        xa, kind = _x_arg(x)
        _launch(
            _gemv_kernel,
            (blocks_n, split),
            xa,
            w,
            out,
            _levels(x.device),
            y,
            counters,
            n,
            rb,
            units,
            per_split,
            split,
            X_KIND=kind,
            **common,
        )
    else:
        # num_stages=1: the weight words go to registers; pipelining would stage them through shared memory
        _launch(
            _gemm_kernel,
            (blocks_n, blocks_m, split),
            x,
            w,
            out,
            _levels(x.device),
            y,
            counters,
            m,
            n,
            rb,
            x.stride(0),
            units,
            per_split,
            split,
            BM=launch.block_m,
            num_stages=1,
            **common,
        )
    return y


COUNTERS = 1 << 16  # split-K tiles at most: far more than a split launch has (see configs.pick_launch)


@functools.cache
def _counters(device: torch.device) -> torch.Tensor:
    """The split-K arrival counters of a device, all zero between launches (each tile's last split re-arms its own).
    Made at the first split launch, which a warm-up runs before any capture."""
    return torch.zeros(COUNTERS, dtype=torch.int32, device=device)


def expert_of_position(offsets: torch.Tensor, pairs: int) -> torch.Tensor:
    """The expert of each sorted routed pair, from the experts' offsets (on the device, no sync)."""
    positions = torch.arange(pairs, device=offsets.device, dtype=offsets.dtype)
    return torch.searchsorted(offsets[1:].contiguous(), positions, right=True).to(torch.int32)


def moe_matmul(
    x: torch.Tensor, packed: torch.Tensor, fmt: Format, n: int, routed: Pairs, tokens: int | None = None
) -> torch.Tensor:
    """y [P, n]: y[dst[i]] = x[src[i]] @ W[e].T for every sorted pair i of expert e (see reference.moe_matmul).

    One launch for all experts; packed [E, n, row_bytes] (or a float [E, n, K]). `tokens` (default: rows of x)
    picks the FMA kernel for a single token. The pairs' `expert_of`, when known, saves a searchsorted.
    """
    k = x.shape[-1]
    src, dst, pairs = routed.src, routed.dst, len(routed)
    x = x.contiguous()
    out = torch.empty(pairs, n, device=x.device, dtype=x.dtype)  # every row written (dst: a permutation)
    if pairs == 0:
        return out
    expert_of = routed.expert_of if routed.expert_of is not None else expert_of_position(routed.offsets, pairs)
    launch = configs.pick_experts_launch(fmt.name, x.shape[0] if tokens is None else tokens, _family(x.device))
    w = _words(packed) if fmt.quantized else packed.contiguous()
    row_bytes, expert_stride = packed.shape[-1], w[0].numel()
    units = k // configs.UNIT
    grid = (pairs, triton.cdiv(n, launch.block_n))
    common = dict(**_constexprs(fmt), BN=launch.block_n, num_warps=launch.warps, enable_fp_fusion=True)
    if launch.kernel == "gemv":
        xa, kind = _x_arg(x) if fmt.quantized else (x, 0)
        stride = xa.stride(0)
        _launch(
            _experts_gemv_kernel,
            grid,
            xa,
            w,
            out,
            _levels(x.device),
            src,
            dst,
            expert_of,
            n,
            k,
            row_bytes,
            expert_stride,
            units,
            stride,
            out.stride(0),
            X_KIND=kind,
            **common,
        )
    else:
        _launch(
            _experts_gemm_kernel,
            grid,
            x,
            w,
            out,
            _levels(x.device),
            src,
            dst,
            expert_of,
            routed.offsets,
            n,
            k,
            row_bytes,
            expert_stride,
            units,
            x.stride(0),
            out.stride(0),
            BM=launch.block_m,
            num_stages=1,
            **common,
        )
    return out


def dequantize(packed: torch.Tensor, fmt: Format, k: int, dtype: torch.dtype) -> torch.Tensor:
    """Packed rows [..., row_bytes] -> [..., k] in dtype, bit-exact with formats.dequantize (before the cast)."""
    n = packed.numel() // packed.shape[-1]
    out = torch.empty(n, k, device=packed.device, dtype=dtype)
    bn = 16
    grid = (triton.cdiv(n, bn), k // configs.UNIT)
    # no FMA contraction: scale * (u - off) - minv rounds exactly like the torch path
    _launch(
        _dequant_kernel,
        grid,
        _words(packed.reshape(n, -1)),
        out,
        _levels(packed.device),
        n,
        packed.shape[-1],
        k,
        **_constexprs(fmt),
        BN=bn,
        enable_fp_fusion=False,
    )
    return out.reshape(*packed.shape[:-1], k)


def matmul(x: torch.Tensor, packed: torch.Tensor, fmt: Format, n: int) -> torch.Tensor:
    if x.shape[0] <= configs.SMALL_M and supports(fmt, x.shape[-1]):
        return matmul_small_m(x, packed, fmt, n)
    return x @ dequantize(packed, fmt, x.shape[-1], x.dtype).T
