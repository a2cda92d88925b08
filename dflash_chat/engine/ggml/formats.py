"""GGML block layouts and their torch dequantizers.

A quantized row of `n` values is `n / block_size` blocks of `type_size` bytes,
stored back to back; a tensor is rows of such bytes (uint8 [..., row_bytes]).
Dequantizers take those bytes on any device and return float32 [..., n]. They
follow ggml's reference dequantizers value for value: every product is the
same float32 arithmetic, so results match `gguf.quants.dequantize` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

QK_K = 256


@dataclass(frozen=True)
class Format:
    name: str
    ggml_type: int
    block_size: int  # values per block
    type_size: int  # bytes per block
    float_dtype: torch.dtype | None = None  # set for the plain float formats

    @property
    def quantized(self) -> bool:
        return self.float_dtype is None

    @property
    def plain_dtype(self) -> torch.dtype:
        """The torch dtype of a plain float format's values (a quantized format has none)."""
        if self.float_dtype is None:
            raise ValueError(f"{self.name} is a quantized format, its values have no torch dtype")
        return self.float_dtype

    def row_bytes(self, n: int) -> int:
        if n % self.block_size:
            raise ValueError(f"{self.name} rows need a multiple of {self.block_size} values, got {n}")
        return n // self.block_size * self.type_size


F32 = Format("F32", 0, 1, 4, torch.float32)
F16 = Format("F16", 1, 1, 2, torch.float16)
BF16 = Format("BF16", 30, 1, 2, torch.bfloat16)
Q4_0 = Format("Q4_0", 2, 32, 18)
Q5_0 = Format("Q5_0", 6, 32, 22)
Q5_1 = Format("Q5_1", 7, 32, 24)
Q8_0 = Format("Q8_0", 8, 32, 34)
Q4_K = Format("Q4_K", 12, QK_K, 144)
Q5_K = Format("Q5_K", 13, QK_K, 176)
Q6_K = Format("Q6_K", 14, QK_K, 210)
Q2_K = Format("Q2_K", 10, QK_K, 84)
Q3_K = Format("Q3_K", 11, QK_K, 110)
IQ4_NL = Format("IQ4_NL", 20, 32, 18)
IQ4_XS = Format("IQ4_XS", 23, QK_K, 136)

FORMATS: dict[str, Format] = {
    f.name: f for f in (F32, F16, BF16, Q4_0, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)
}
BY_GGML_TYPE: dict[int, Format] = {f.ggml_type: f for f in FORMATS.values()}


def get_format(name: str | Format) -> Format:
    if isinstance(name, Format):
        return name
    try:
        return FORMATS[name.upper()]
    except KeyError:
        raise ValueError(f"unknown weight format {name!r}; known: {', '.join(FORMATS)}") from None


# --- byte helpers -----------------------------------------------------------


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """fp16 stored at byte `at` of every block -> float32 [nb, 1]."""
    return b[:, at : at + 2].contiguous().view(torch.float16).float()


def _u32(b: torch.Tensor, at: int) -> torch.Tensor:
    """Little-endian uint32 at byte `at` -> int64 [nb, 1]."""
    x = b[:, at : at + 4].long()
    return x[:, 0:1] | (x[:, 1:2] << 8) | (x[:, 2:3] << 16) | (x[:, 3:4] << 24)


def _nibbles(qs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q = qs.to(torch.int32)
    return q & 0xF, q >> 4


def k_scales_mins(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpack Q4_K/Q5_K's 12 bytes of 6-bit scales and mins -> two int32 [nb, 8]."""
    s = scales.to(torch.int32)
    lo_sc, lo_m, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([lo_sc & 63, (hi & 0xF) | ((lo_sc >> 6) << 4)], dim=1)
    mn = torch.cat([lo_m & 63, (hi >> 4) | ((lo_m >> 6) << 4)], dim=1)
    return sc, mn


# --- per-format block dequantizers: uint8 [nb, type_size] -> float32 [nb, block_size]


def _deq_q4_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b, 0)
    lo, hi = _nibbles(b[:, 2:18])
    return d * (torch.cat([lo, hi], dim=1) - 8).float()


def _five_bit(b: torch.Tensor, qh_at: int, qs_at: int) -> torch.Tensor:
    qh = _u32(b, qh_at)
    bits = (qh >> torch.arange(32, device=b.device)) & 1
    lo, hi = _nibbles(b[:, qs_at : qs_at + 16])
    return torch.cat([lo, hi], dim=1) | (bits.to(torch.int32) << 4)


def _deq_q5_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * (_five_bit(b, 2, 6) - 16).float()


def _deq_q5_1(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * _five_bit(b, 4, 8).float() + _f16(b, 2)


def _deq_q8_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * b[:, 2:34].contiguous().view(torch.int8).float()


def _k_quant_levels(b: torch.Tensor, qs_at: int) -> torch.Tensor:
    """Q4_K/Q5_K nibbles in value order: 4 chunks of 32 bytes, low nibbles then high -> [nb, 256]."""
    lo, hi = _nibbles(b[:, qs_at : qs_at + 128].reshape(-1, 4, 32))
    return torch.stack([lo, hi], dim=2).reshape(-1, QK_K)


def _apply_k_scales(b: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    sc, mn = k_scales_mins(b[:, 4:16])
    d = _f16(b, 0) * sc.float()  # [nb, 8], one per 32 values
    m = _f16(b, 2) * mn.float()
    y = d.unsqueeze(-1) * q.reshape(-1, 8, 32).float() - m.unsqueeze(-1)
    return y.reshape(-1, QK_K)


def _deq_q4_k(b: torch.Tensor) -> torch.Tensor:
    return _apply_k_scales(b, _k_quant_levels(b, 16))


def _deq_q5_k(b: torch.Tensor) -> torch.Tensor:
    q = _k_quant_levels(b, 48)
    # bit j of qh[l] is the fifth bit of value 32*j + l
    qh = b[:, 16:48].to(torch.int32).unsqueeze(1)
    high = (qh >> torch.arange(8, device=b.device).view(1, 8, 1)) & 1
    return _apply_k_scales(b, q | (high.reshape(-1, QK_K) << 4))


def _deq_q6_k(b: torch.Tensor) -> torch.Tensor:
    ql = b[:, 0:128].to(torch.int32).reshape(-1, 2, 2, 32)  # [half, lo/hi 32-byte run, l]
    qh = b[:, 128:192].to(torch.int32).reshape(-1, 2, 1, 32)
    sc = b[:, 192:208].contiguous().view(torch.int8).float()
    d = _f16(b, 208)
    # value 128*h + 32*j + l: nibble (j>=2) of ql[h, j%2, l], 2 high bits (2*j) of qh[h, l]
    low = torch.stack([ql[:, :, 0] & 0xF, ql[:, :, 1] & 0xF, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], dim=2)
    shifts = torch.arange(0, 8, 2, device=b.device).view(1, 1, 4, 1)
    high = (qh >> shifts) & 3
    q = (low | (high << 4)) - 32  # [nb, 2, 4, 32]
    scale = sc.reshape(-1, 2, 4, 2)  # one scale per 16 values
    y = (d.view(-1, 1, 1, 1, 1) * scale.unsqueeze(-1)) * q.reshape(-1, 2, 4, 2, 16).float()
    return y.reshape(-1, QK_K)


def _two_bit_planes(qs: torch.Tensor) -> torch.Tensor:
    """Q2_K/Q3_K's 64 bytes of 2-bit fields -> [nb, 256]: value 128*h + 32*s + l is bits 2s..2s+1 of qs[32*h + l]."""
    q = qs.to(torch.int32).reshape(-1, 2, 1, 32)
    shifts = torch.arange(0, 8, 2, device=qs.device).view(1, 1, 4, 1)
    return ((q >> shifts) & 3).reshape(-1, QK_K)


def _deq_q2_k(b: torch.Tensor) -> torch.Tensor:
    sc = b[:, 0:16].to(torch.int32)  # per 16 values: scale in the low nibble, min in the high one
    dl = _f16(b, 80) * (sc & 0xF).float()
    ml = _f16(b, 82) * (sc >> 4).float()
    q = _two_bit_planes(b[:, 16:80]).reshape(-1, 16, 16).float()
    return (dl.unsqueeze(-1) * q - ml.unsqueeze(-1)).reshape(-1, QK_K)


def q3_k_scales(scales: torch.Tensor) -> torch.Tensor:
    """Q3_K's 12 bytes of 6-bit scales -> int32 [nb, 16] in -32..31: low nibbles from bytes 0..7 (low nibble
    first, then high), the two high bits from bytes 8..11 (group g: bits 2*(g // 4) of byte 8 + g % 4)."""
    s = scales.to(torch.int32)
    low = torch.cat([s[:, 0:8] & 0xF, s[:, 0:8] >> 4], dim=1)
    shifts = torch.arange(0, 8, 2, device=scales.device).view(1, 4, 1)
    high = ((s[:, 8:12].unsqueeze(1) >> shifts) & 3).reshape(-1, 16)
    return (low | (high << 4)) - 32


def _deq_q3_k(b: torch.Tensor) -> torch.Tensor:
    dl = _f16(b, 108) * q3_k_scales(b[:, 96:108]).float()
    # bit i of hmask[l] belongs to value 32*i + l; a clear bit subtracts 4
    hm = b[:, 0:32].to(torch.int32).unsqueeze(1)
    high = ((hm >> torch.arange(8, device=b.device).view(1, 8, 1)) & 1).reshape(-1, QK_K)
    q = _two_bit_planes(b[:, 32:96]) - 4 * (1 - high)
    return (dl.unsqueeze(-1) * q.reshape(-1, 16, 16).float()).reshape(-1, QK_K)


# The IQ4 codebook: a nibble indexes one of 16 non-uniform int8 levels.
IQ4_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _iq4_levels(qs: torch.Tensor) -> torch.Tensor:
    """16-byte runs of index nibbles -> levels [.., 32]: low nibbles (values 0..15), then high ones."""
    lo, hi = _nibbles(qs)
    table = torch.tensor(IQ4_LEVELS, dtype=torch.float32, device=qs.device)
    return table[torch.cat([lo, hi], dim=-1).long()]


def _deq_iq4_nl(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * _iq4_levels(b[:, 2:18])


def _deq_iq4_xs(b: torch.Tensor) -> torch.Tensor:
    sh = (b[:, 2].to(torch.int32) | (b[:, 3].to(torch.int32) << 8)).unsqueeze(1)
    sl = b[:, 4:8].to(torch.int32)
    j = torch.arange(8, device=b.device)
    low = (sl[:, j // 2] >> (4 * (j % 2))) & 0xF
    ls = (low | (((sh >> (2 * j)) & 3) << 4)) - 32
    dl = _f16(b, 0) * ls.float()  # [nb, 8], one per 32 values
    levels = _iq4_levels(b[:, 8:136].reshape(-1, 8, 16))
    return (dl.unsqueeze(-1) * levels).reshape(-1, QK_K)


_BLOCK_DEQUANT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Q4_0": _deq_q4_0,
    "Q5_0": _deq_q5_0,
    "Q5_1": _deq_q5_1,
    "Q8_0": _deq_q8_0,
    "Q2_K": _deq_q2_k,
    "Q3_K": _deq_q3_k,
    "Q4_K": _deq_q4_k,
    "Q5_K": _deq_q5_k,
    "Q6_K": _deq_q6_k,
    "IQ4_NL": _deq_iq4_nl,
    "IQ4_XS": _deq_iq4_xs,
}


def dequantize(data: torch.Tensor, fmt: str | Format) -> torch.Tensor:
    """Packed rows uint8 [..., row_bytes] -> float32 [..., values]."""
    fmt = get_format(fmt)
    if data.dtype != torch.uint8:
        raise TypeError(f"packed {fmt.name} data must be uint8, got {data.dtype}")
    if data.shape[-1] % fmt.type_size:
        raise ValueError(f"{fmt.name} rows must be whole blocks of {fmt.type_size} bytes, got {data.shape[-1]}")
    lead = data.shape[:-1]
    n = data.shape[-1] // fmt.type_size * fmt.block_size
    if not fmt.quantized:
        return data.contiguous().view(fmt.plain_dtype).float().reshape(*lead, n)
    blocks = data.reshape(-1, fmt.type_size)
    return _BLOCK_DEQUANT[fmt.name](blocks).reshape(*lead, n)
