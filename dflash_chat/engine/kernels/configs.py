"""How the quantized kernels tile each format, and which launch configuration each GPU family gets.

Pure Python (no torch, no triton): the kernels, `tools/gpu_check.py --compile-only` and the tests read it.

Every format is processed in units of 256 values of one weight row (one K-quant block, or eight 32-value
blocks). A unit is decoded as a tile of int32 words [rows, C, T2, RW]: C groups of T2*RW consecutive words,
each thread holding RW consecutive words of one row: 4 (one 128-bit load) where the format's fields are
16-byte aligned (Q4_K, Q5_K), else 2 (the width of the matching activation load: four 16-bit values per
64-bit word, two per 128-bit load), so a group's words and its scale stay in one thread. Every word
carries NH "slots" of four byte-wide levels (the low and high nibbles of Q4_K, the four 2-bit planes of
Q2_K...), so C * T2 * RW * 4 * NH == 256.

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
    runs: int  # T2: runs of `vec` words per group
    slots: int  # NH: 4-level slots per word
    aligned: bool  # every unit starts on a 4-byte boundary (else words are read as two and funnel-shifted)
    vec: int = 2  # RW: consecutive words per thread


TILINGS: dict[str, Tiling] = {
    "Q8_0": Tiling(8 * 34, 8, 4, 1, False),
    "Q4_0": Tiling(8 * 18, 8, 2, 2, False),
    "Q5_0": Tiling(8 * 22, 8, 2, 2, False),
    "Q5_1": Tiling(8 * 24, 8, 2, 2, True),
    "Q2_K": Tiling(84, 2, 4, 4, True),
    "Q3_K": Tiling(110, 2, 4, 4, False),
    "Q4_K": Tiling(144, 4, 2, 2, True, vec=4),
    "Q5_K": Tiling(176, 4, 2, 2, True, vec=4),
    "Q6_K": Tiling(210, 4, 4, 2, False),
    "IQ4_NL": Tiling(8 * 18, 8, 2, 2, False),
    "IQ4_XS": Tiling(136, 8, 2, 2, True),
}

assert all(t.groups * t.runs * t.vec * 4 * t.slots == UNIT for t in TILINGS.values())


def kernel_supports(fmt_name: str, k: int, row_bytes: int) -> bool:
    """The small-M kernels read whole units as int32 words: K a multiple of 256, rows 4-byte aligned."""
    return fmt_name in TILINGS and k % UNIT == 0 and row_bytes % 4 == 0


@dataclass(frozen=True)
class Family:
    """Launch numbers for one GPU family (provisional until measured; see the module docstring)."""

    name: str
    sms: int  # a typical part's SM count, used when compiling without the GPU
    block_n: int  # weight rows per program: 64 rows x 256 values = 4 rows of 4 (or 2) words per thread
    programs_per_sm: int  # resident programs the split-K heuristic aims for (latency hiding)
    min_units_per_split: int = 4


FAMILIES: dict[str, Family] = {
    # H100/H200: 64K registers and 2048 threads per SM
    "sm_90": Family("sm_90", sms=132, block_n=64, programs_per_sm=4),
    # RTX 4090 (Ada): 64K registers, 1536 threads per SM
    "sm_89": Family("sm_89", sms=128, block_n=64, programs_per_sm=3),
    # RTX 3090 / A-series Ampere consumer parts: like Ada, fewer SMs
    "sm_86": Family("sm_86", sms=82, block_n=64, programs_per_sm=3),
}


def family_of(capability: tuple[int, int]) -> Family:
    """The table row for a compute capability: the nearest family at or below it (sm_80 runs as sm_86)."""
    major, minor = capability
    if major >= 9:
        return FAMILIES["sm_90"]
    if (major, minor) >= (8, 9):
        return FAMILIES["sm_89"]
    return FAMILIES["sm_86"]


def warps_for(fmt_name: str, kernel: str) -> int:
    """Warps per 64-row program (the compile check's numbers on sm_90).

    gemv: 4 rows of RW words per thread: 4 warps for RW = 4 (72-120 registers), 8 for RW = 2 (at 4 warps 8 rows
    per thread: 120-170 registers and more instructions per value). gemm: 4 warps (fewest instructions per
    value, 150-220 registers) unless a row-unit holds 64 words (Q8_0's byte levels), which spills at 4 warps; at
    8 warps ptxas caps registers at 128, where Q3_K spills.
    """
    tiling = TILINGS.get(fmt_name)
    if tiling is None:
        return 4
    if kernel == "gemv":
        return 4 if tiling.vec == 4 else 8
    return 8 if tiling.groups * tiling.runs * tiling.vec >= 64 else 4


@dataclass(frozen=True)
class Launch:
    kernel: str  # "gemv" (M == 1, FMA) or "gemm" (tensor cores)
    block_n: int
    block_m: int
    split: int  # K split into this many partial sums, added in split order by each tile's last program
    warps: int


def pick_launch(fmt_name: str, m: int, n: int, k: int, fam: Family, sms: int | None = None) -> Launch:
    """The kernel and its launch for y[M, N] = x[M, K] @ W.T: split K until the GPU has enough programs."""
    sms = sms or fam.sms
    gemv = m == 1
    block_m = 1 if gemv else (16 if m <= 16 else 32)
    tiles = -(-n // fam.block_n) * -(-m // block_m)
    units = k // UNIT
    split = 1
    target = fam.programs_per_sm * sms
    while tiles * split * 2 <= target and units // (split * 2) >= fam.min_units_per_split:
        split *= 2
    kernel = "gemv" if gemv else "gemm"
    return Launch(kernel, fam.block_n, block_m, split, warps_for(fmt_name, kernel))


def pick_experts_launch(fmt_name: str, tokens: int, fam: Family) -> Launch:
    """Routed experts: one program per (routed pair, row block); the FMA kernel for a single token, else the
    tensor-core kernel over blocks of up to 16 (a few tokens) or 64 (prefill) pairs of one expert."""
    if tokens == 1:
        return Launch("gemv", fam.block_n, 1, 1, warps_for(fmt_name, "gemv"))
    return Launch("gemm", fam.block_n, 16 if tokens <= 32 else 64, 1, warps_for(fmt_name, "gemm"))
