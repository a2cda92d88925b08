"""How the quantized kernels tile each format, and which launch configuration each GPU family gets.

Pure Python (no torch, no triton): the kernels, `tools/gpu_check.py --compile-only` and the tests read it.

Every format is processed in units of 256 values of one weight row (one K-quant block, or eight 32-value
blocks). A unit is decoded as a tile of int32 words [rows, C, T2, 4]: C groups of 4*T2 consecutive words,
each thread holding 4 consecutive words of one row (one 128-bit load when the field is 16-byte aligned).
Every word carries NH "slots" of four byte-wide levels (the low and high nibbles of Q4_K, the four 2-bit
planes of Q2_K...), so C * T2 * 4 * 4 * NH == 256.

The launch numbers below are PROVISIONAL: chosen from the byte/issue budget in NOTES.md and checked for
registers and spills by the compile check, not yet measured on each family. `tools/gpu_check.py` prints
the achieved bandwidth; change the table when it says so.
"""

from __future__ import annotations

from dataclasses import dataclass

UNIT = 256  # values of a row per loop step
SMALL_M = 32  # rows of x up to which the small-M kernels run (decode, verify); prefill dequantizes + cuBLAS


@dataclass(frozen=True)
class Tiling:
    unit_bytes: int  # bytes of one unit in a packed row
    groups: int  # C: word groups per unit
    runs: int  # T2: 4-word runs per group
    slots: int  # NH: 4-level slots per word
    aligned: bool  # every unit starts on a 4-byte boundary (else words are read as two and funnel-shifted)


TILINGS: dict[str, Tiling] = {
    "Q8_0": Tiling(8 * 34, 8, 2, 1, False),
    "Q4_0": Tiling(8 * 18, 8, 1, 2, False),
    "Q5_0": Tiling(8 * 22, 8, 1, 2, False),
    "Q5_1": Tiling(8 * 24, 8, 1, 2, True),
    "Q2_K": Tiling(84, 2, 2, 4, True),
    "Q3_K": Tiling(110, 2, 2, 4, False),
    "Q4_K": Tiling(144, 4, 2, 2, True),
    "Q5_K": Tiling(176, 4, 2, 2, True),
    "Q6_K": Tiling(210, 4, 2, 2, False),
    "IQ4_NL": Tiling(8 * 18, 8, 1, 2, False),
    "IQ4_XS": Tiling(136, 8, 1, 2, True),
}
FLOATS = {"F32": 4, "F16": 2, "BF16": 2}  # float experts: bytes per value

assert all(t.groups * t.runs * 16 * t.slots == UNIT for t in TILINGS.values())


def kernel_supports(fmt_name: str, k: int, row_bytes: int) -> bool:
    """The small-M kernels read whole units as int32 words: K a multiple of 256, rows 4-byte aligned."""
    return fmt_name in TILINGS and k % UNIT == 0 and row_bytes % 4 == 0


@dataclass(frozen=True)
class Family:
    """Launch numbers for one GPU family (provisional until measured; see the module docstring)."""

    name: str
    sms: int  # a typical part's SM count, used when compiling without the GPU
    gemv_rows: int  # BN of the M=1 FMA kernel: 64 rows x 256 values = 128 values per thread per unit (4 warps)
    gemm_rows: int  # BN of the tensor-core kernel for 2 <= M <= 32
    warps: int
    programs_per_sm: int  # resident programs the split-K heuristic aims for (latency hiding)
    min_units_per_split: int = 4


FAMILIES: dict[str, Family] = {
    # H100/H200: 64K registers and up to 2048 threads per SM: four 128-thread programs of <= 128 registers
    "sm_90": Family("sm_90", sms=132, gemv_rows=64, gemm_rows=64, warps=4, programs_per_sm=4),
    # RTX 4090 (Ada): 1536 threads per SM, so three programs
    "sm_89": Family("sm_89", sms=128, gemv_rows=64, gemm_rows=64, warps=4, programs_per_sm=3),
    # RTX 3090 / A-series Ampere consumer parts: like Ada, fewer SMs
    "sm_86": Family("sm_86", sms=82, gemv_rows=64, gemm_rows=64, warps=4, programs_per_sm=3),
}


def family_of(capability: tuple[int, int]) -> Family:
    """The table row for a compute capability: the nearest family at or below it (sm_80 runs as sm_86)."""
    major, minor = capability
    if major >= 9:
        return FAMILIES["sm_90"]
    if (major, minor) >= (8, 9):
        return FAMILIES["sm_89"]
    return FAMILIES["sm_86"]


@dataclass(frozen=True)
class Launch:
    kernel: str  # "gemv" (M == 1, FMA) or "gemm" (tensor cores)
    block_n: int
    block_m: int
    split: int  # K split into this many partial sums, reduced by a second kernel (no atomics)
    warps: int


def pick_launch(m: int, n: int, k: int, fam: Family, sms: int | None = None) -> Launch:
    """The kernel and its launch for y[M, N] = x[M, K] @ W.T: split K until the GPU has enough programs."""
    sms = sms or fam.sms
    gemv = m == 1
    block_n = fam.gemv_rows if gemv else fam.gemm_rows
    block_m = 1 if gemv else (16 if m <= 16 else 32)
    tiles = -(-n // block_n) * -(-m // max(block_m, 1))
    units = k // UNIT
    split = 1
    target = fam.programs_per_sm * sms
    while tiles * split * 2 <= target and units // (split * 2) >= fam.min_units_per_split:
        split *= 2
    return Launch("gemv" if gemv else "gemm", block_n, block_m, split, fam.warps)


def pick_experts_launch(tokens: int, fam: Family) -> Launch:
    """Routed experts: one program per (routed pair, row block); the FMA kernel for a single token."""
    if tokens == 1:
        return Launch("gemv", fam.gemv_rows, 1, 1, fam.warps)
    return Launch("gemm", fam.gemm_rows, 16, 1, fam.warps)
