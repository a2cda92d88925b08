"""Triton kernels that read GGML blocks straight from the packed bytes.

- `matmul_small_m`: y = x @ W.T for M <= 32 (decode, the 16-token verify). One
  program owns BLOCK_N weight rows and a slice of K, dequantizes each weight
  tile once into registers and multiplies it with all M rows, so every weight
  byte is read once per call. Split-K spreads narrow matrices over the SMs.
- `moe_matmul`: the small-M kernel for routed experts: one launch covers every
  expert, each program finds its expert's rows from device-side offsets (no
  host sync, idle experts exit at once).
- `dequantize`: packed rows -> fp16/bf16 matrix; prefill then runs cuBLAS on it
  (for large M the dequantize pass is cheap next to the matmul).

Every format decodes value k of a row from its block with the same arithmetic
as `weights/formats.py`; the unit tests compare both under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from dflash_chat.engine.kernels import SMALL_M
from dflash_chat.engine.weights.formats import Format

FMT_IDS = {"Q8_0": 0, "Q4_0": 1, "Q5_0": 2, "Q5_1": 3, "Q4_K": 4, "Q5_K": 5, "Q6_K": 6}


@triton.jit
def _byte(ptr, off, mask):
    return tl.load(ptr + off, mask=mask, other=0).to(tl.int32)


@triton.jit
def _f16(ptr, off, mask):
    lo = tl.load(ptr + off, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(ptr + off + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _dequant_tile(w_ptr, rows, ks, row_bytes, N, K, FMT: tl.constexpr):
    """fp32 [BLOCK_N, BLOCK_K]: values `ks` of weight rows `rows` (0 outside N x K)."""
    mask = (rows[:, None] < N) & (ks[None, :] < K)
    row0 = rows[:, None].to(tl.int64) * row_bytes
    if FMT == 0:  # Q8_0: d, int8[32]
        base = row0 + (ks[None, :] // 32) * 34
        q = tl.load(w_ptr + base + 2 + ks[None, :] % 32, mask=mask, other=0).to(tl.int8, bitcast=True)
        val = _f16(w_ptr, base, mask) * q.to(tl.float32)
    elif FMT == 1 or FMT == 2 or FMT == 3:  # Q4_0 / Q5_0 / Q5_1
        i = ks[None, :] % 32
        if FMT == 1:
            size = 18
            qs_at = 2
        elif FMT == 2:
            size = 22
            qs_at = 6
        else:
            size = 24
            qs_at = 8
        base = row0 + (ks[None, :] // 32) * size
        q = (_byte(w_ptr, base + qs_at + i % 16, mask) >> ((i // 16) * 4)) & 0xF
        d = _f16(w_ptr, base, mask)
        if FMT == 1:
            val = d * (q - 8).to(tl.float32)
        else:
            qh_at = 2 if FMT == 2 else 4
            hb = (_byte(w_ptr, base + qh_at + i // 8, mask) >> (i % 8)) & 1
            q = q | (hb << 4)
            if FMT == 2:
                val = d * (q - 16).to(tl.float32)
            else:
                val = d * q.to(tl.float32) + _f16(w_ptr, base + 2, mask)
    elif FMT == 4 or FMT == 5:  # Q4_K / Q5_K: d, dmin, 12 B scales, [qh 32 B], qs 128 B
        size = 144 if FMT == 4 else 176
        qs_at = 16 if FMT == 4 else 48
        i = ks[None, :] % 256
        base = row0 + (ks[None, :] // 256) * size
        j = i // 32
        jl = j % 4
        a = _byte(w_ptr, base + 4 + jl, mask)
        b = _byte(w_ptr, base + 8 + jl, mask)
        c = _byte(w_ptr, base + 12 + jl, mask)
        low = j < 4
        sc = tl.where(low, a & 63, (c & 0xF) | ((a >> 6) << 4))
        mn = tl.where(low, b & 63, (c >> 4) | ((b >> 6) << 4))
        w = i % 64
        q = (_byte(w_ptr, base + qs_at + (i // 64) * 32 + w % 32, mask) >> ((w // 32) * 4)) & 0xF
        if FMT == 5:
            q = q | (((_byte(w_ptr, base + 16 + i % 32, mask) >> j) & 1) << 4)
        d = _f16(w_ptr, base, mask) * sc.to(tl.float32)
        m = _f16(w_ptr, base + 2, mask) * mn.to(tl.float32)
        val = d * q.to(tl.float32) - m
    else:  # Q6_K: ql 128 B, qh 64 B, int8 scales[16], d
        i = ks[None, :] % 256
        base = row0 + (ks[None, :] // 256) * 210
        h = i // 128
        quarter = (i % 128) // 32
        l = i % 32
        lo = (_byte(w_ptr, base + 64 * h + l + 32 * (quarter % 2), mask) >> (4 * (quarter // 2))) & 0xF
        hi = (_byte(w_ptr, base + 128 + 32 * h + l, mask) >> (2 * quarter)) & 3
        sc = tl.load(w_ptr + base + 192 + i // 16, mask=mask, other=0).to(tl.int8, bitcast=True)
        d = _f16(w_ptr, base + 208, mask) * sc.to(tl.float32)
        val = d * ((lo | (hi << 4)) - 32).to(tl.float32)
    return tl.where(mask, val, 0.0)


@triton.jit
def _accumulate(acc, x, w_ptr, rn, ks, row_bytes, N, K, FMT: tl.constexpr, IEEE: tl.constexpr):
    """acc += x [BLOCK_M, BLOCK_K] @ W[rn, ks].T, the weight tile dequantized in registers."""
    w = _dequant_tile(w_ptr, rn, ks, row_bytes, N, K, FMT).to(x.dtype)
    if IEEE:
        return acc + tl.dot(x, tl.trans(w), input_precision="ieee")
    return acc + tl.dot(x, tl.trans(w))


@triton.jit
def _matmul_kernel(x_ptr, w_ptr, y_ptr, M, N, K, row_bytes, stride_xm, stride_ym, k_per_split,
                   FMT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   SPLIT_K: tl.constexpr, IEEE: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    for k0 in range(k_start, k_start + k_per_split, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        xm = (rm[:, None] < M) & (ks[None, :] < K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + ks[None, :], mask=xm, other=0.0)
        acc = _accumulate(acc, x, w_ptr, rn, ks, row_bytes, N, K, FMT, IEEE)
    ym = (rm[:, None] < M) & (rn[None, :] < N)
    y_off = rm[:, None] * stride_ym + rn[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptr + y_off, acc.to(y_ptr.dtype.element_ty), mask=ym)
    else:
        tl.atomic_add(y_ptr + y_off, acc, mask=ym)


@triton.jit
def _moe_kernel(x_ptr, w_ptr, y_ptr, src_ptr, dst_ptr, offsets_ptr, N, K, row_bytes, expert_bytes,
                stride_xm, stride_ym, FMT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    """Program (e, n): rows src[offsets[e]:offsets[e+1]] of x times expert e's weight rows, into y[dst]."""
    e = tl.program_id(0)
    pid_n = tl.program_id(1)
    start = tl.load(offsets_ptr + e)
    end = tl.load(offsets_ptr + e + 1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_e = w_ptr + e.to(tl.int64) * expert_bytes
    for m0 in range(start, end, BLOCK_M):  # idle experts run no iteration
        rm = m0 + tl.arange(0, BLOCK_M)
        live = rm < end
        src = tl.load(src_ptr + rm, mask=live, other=0).to(tl.int64)
        dst = tl.load(dst_ptr + rm, mask=live, other=0).to(tl.int64)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + src[:, None] * stride_xm + ks[None, :], mask=live[:, None] & (ks[None, :] < K),
                        other=0.0)
            acc = _accumulate(acc, x, w_e, rn, ks, row_bytes, N, K, FMT, IEEE)
        tl.store(y_ptr + dst[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=live[:, None] & (rn[None, :] < N))


@triton.jit
def _dequant_kernel(w_ptr, out_ptr, N, K, row_bytes, FMT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    val = _dequant_tile(w_ptr, rn, ks, row_bytes, N, K, FMT)
    mask = (rn[:, None] < N) & (ks[None, :] < K)
    tl.store(out_ptr + rn[:, None].to(tl.int64) * K + ks[None, :], val.to(out_ptr.dtype.element_ty), mask=mask)


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=1024)
def pick_config(m: int, n: int, k: int, block: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K) for the small-M kernel: enough programs to fill the GPU."""
    block_m = 16 if m <= 16 else 32
    block_n = 64
    block_k = 256 if block == 256 else 128
    n_tiles = triton.cdiv(n, block_n)
    k_steps = triton.cdiv(k, block_k)
    split = 1
    target = 2 * _sm_count(device)
    while n_tiles * split < target and k_steps // (split * 2) >= 2:
        split *= 2
    return block_m, block_n, block_k, split


def matmul_small_m(x: torch.Tensor, packed: torch.Tensor, fmt: Format, n: int,
                   config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    m, k = x.shape
    x = x.contiguous()
    bm, bn, bk, split = config or pick_config(m, n, k, fmt.block_size, x.device)
    k_steps = triton.cdiv(k, bk)
    k_per_split = triton.cdiv(k_steps, split) * bk
    split = triton.cdiv(k, k_per_split)
    y = torch.zeros if split > 1 else torch.empty
    out = y(m, n, device=x.device, dtype=torch.float32 if split > 1 else x.dtype)
    grid = (triton.cdiv(n, bn), triton.cdiv(m, bm), split)
    _matmul_kernel[grid](x, packed, out, m, n, k, packed.shape[-1], x.stride(0), out.stride(0), k_per_split,
                         FMT=FMT_IDS[fmt.name], BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
                         IEEE=x.dtype == torch.float32)
    return out.to(x.dtype)


def moe_matmul(x: torch.Tensor, packed: torch.Tensor, fmt: Format, n: int, src: torch.Tensor, dst: torch.Tensor,
               offsets: torch.Tensor) -> torch.Tensor:
    """y [P, n]: y[dst[i]] = x[src[i]] @ W[e].T for every sorted position i of expert e (see reference.moe_matmul).

    One launch for all experts; each active expert's weight tile is read once for all of its rows (up to BLOCK_M).
    """
    num_experts, _, row_bytes = packed.shape
    k = x.shape[-1]
    x = x.contiguous()
    packed = packed.contiguous()
    out = torch.empty(src.numel(), n, device=x.device, dtype=x.dtype)  # every row written (dst: a permutation)
    bn, bk = 64, 256 if fmt.block_size == 256 else 128
    grid = (num_experts, triton.cdiv(n, bn))
    _moe_kernel[grid](x, packed, out, src, dst, offsets, n, k, row_bytes, packed[0].numel(), x.stride(0),
                      out.stride(0), FMT=FMT_IDS[fmt.name], BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk,
                      IEEE=x.dtype == torch.float32)
    return out


def dequantize(packed: torch.Tensor, fmt: Format, k: int, dtype: torch.dtype) -> torch.Tensor:
    n = packed.numel() // packed.shape[-1]
    out = torch.empty(n, k, device=packed.device, dtype=dtype)
    bn, bk = 32, 256
    grid = (triton.cdiv(n, bn), triton.cdiv(k, bk))
    # no FMA contraction: d*q - m rounds exactly like the torch path (bit-equal dequantization)
    _dequant_kernel[grid](packed, out, n, k, packed.shape[-1], FMT=FMT_IDS[fmt.name], BLOCK_N=bn, BLOCK_K=bk,
                          enable_fp_fusion=False)
    return out.reshape(*packed.shape[:-1], k)


def matmul(x: torch.Tensor, packed: torch.Tensor, fmt: Format, n: int) -> torch.Tensor:
    if x.shape[0] <= SMALL_M:
        return matmul_small_m(x, packed, fmt, n)
    return x @ dequantize(packed, fmt, x.shape[-1], x.dtype).T
