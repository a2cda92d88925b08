"""Quantizers: float rows -> packed GGML blocks.

Q8_0 reproduces ggml's reference bit for bit. Q4_K and Q6_K follow llama.cpp's
reference quantizers (quantize_row_q4_K_ref / quantize_row_q6_K_ref, i.e. the
make_qkx2_quants and make_qx_quants searches), vectorised over blocks in torch
so quantize-on-load can run on the GPU. The legacy fallbacks (Q4_0, Q5_0,
Q5_1) use the gguf package's numpy quantizers.
"""

from __future__ import annotations

import numpy as np
import torch

from dflash_chat.engine.ggml.formats import QK_K, Format, get_format

GROUP_MAX_EPS = 1e-15
_ROWS_PER_CHUNK = 4096


def _fp16_bytes(x: torch.Tensor) -> torch.Tensor:
    """float [nb] -> uint8 [nb, 2] (round to fp16, little-endian)."""
    return x.to(torch.float16).contiguous().view(torch.uint8).reshape(-1, 2)


def _fp16_roundtrip(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).float()


def _round_away(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


# --- Q8_0 -------------------------------------------------------------------


def _q8_0_blocks(x: torch.Tensor) -> torch.Tensor:
    d = x.abs().amax(dim=1, keepdim=True) / 127
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = _round_away(x * inv).to(torch.int8).view(torch.uint8)
    return torch.cat([_fp16_bytes(d.squeeze(1)), q], dim=1)


# --- Q4_K -------------------------------------------------------------------


def make_qkx2_quants(
    x: torch.Tensor, w: torch.Tensor, nmax: int, rmin: float = -1.0, rdelta: float = 0.1, nstep: int = 20
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric (scale, min) search of llama.cpp's make_qkx2_quants over groups x [G, n].

    Returns (scale [G], the_min [G] >= 0, levels L [G, n] in 0..nmax) with y ~ scale*L - the_min.
    """
    mn = x.amin(dim=1).clamp(max=0)
    mx = x.amax(dim=1)
    sum_w = w.sum(dim=1)
    sum_x = (w * x).sum(dim=1)
    flat = mx == mn
    span = torch.where(flat, torch.ones_like(mx), mx - mn)
    iscale = nmax / span
    scale = 1 / iscale
    L = torch.round(iscale[:, None] * (x - mn[:, None])).clamp(0, nmax)
    best = (w * (scale[:, None] * L + mn[:, None] - x) ** 2).sum(dim=1)
    for step in range(nstep):
        iscale = (rmin + rdelta * step + nmax) / span
        la = torch.round(iscale[:, None] * (x - mn[:, None])).clamp(0, nmax)
        sum_l = (w * la).sum(dim=1)
        sum_l2 = (w * la * la).sum(dim=1)
        sum_xl = (w * la * x).sum(dim=1)
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        safe_D = torch.where(ok, D, torch.ones_like(D))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / safe_D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / safe_D
        pos = this_min > 0
        this_scale = torch.where(pos, sum_xl / torch.where(sum_l2 > 0, sum_l2, torch.ones_like(sum_l2)), this_scale)
        this_min = torch.where(pos, torch.zeros_like(this_min), this_min)
        err = (w * (this_scale[:, None] * la + this_min[:, None] - x) ** 2).sum(dim=1)
        better = ok & (err < best)
        L = torch.where(better[:, None], la, L)
        best = torch.where(better, err, best)
        scale = torch.where(better, this_scale, scale)
        mn = torch.where(better, this_min, mn)
    scale = torch.where(flat, torch.zeros_like(scale), scale)
    L = torch.where(flat[:, None], torch.zeros_like(L), L)
    return scale, -mn, L


def _pack_k_scales(ls: torch.Tensor, lm: torch.Tensor) -> torch.Tensor:
    """6-bit scales and mins [nb, 8] -> Q4_K/Q5_K's 12 packed bytes [nb, 12]."""
    ls, lm = ls.to(torch.int32), lm.to(torch.int32)
    first = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    second = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    third = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    return torch.cat([first, second, third], dim=1).to(torch.uint8)


def _q4_k_blocks(x: torch.Tensor) -> torch.Tensor:
    nb = x.shape[0]
    xs = x.reshape(nb * 8, 32)
    av = torch.sqrt((xs * xs).sum(dim=1, keepdim=True) / 32)
    scales, mins, L = make_qkx2_quants(xs, av + xs.abs(), nmax=15)
    scales, mins, L = scales.reshape(nb, 8), mins.reshape(nb, 8), L.reshape(nb, 8, 32)
    max_scale = scales.amax(dim=1, keepdim=True)
    max_min = mins.amax(dim=1, keepdim=True)
    inv_scale = torch.where(max_scale > 0, 63 / torch.where(max_scale > 0, max_scale, 1), 0)
    inv_min = torch.where(max_min > 0, 63 / torch.where(max_min > 0, max_min, 1), 0)
    ls = torch.round(inv_scale * scales).clamp(max=63)
    lm = torch.round(inv_min * mins).clamp(max=63)
    d = _fp16_roundtrip(max_scale / 63)
    dmin = _fp16_roundtrip(max_min / 63)
    dj = (d * ls).unsqueeze(-1)
    dm = (dmin * lm).unsqueeze(-1)
    xr = x.reshape(nb, 8, 32)
    requant = torch.round((xr + dm) / torch.where(dj == 0, 1, dj)).clamp(0, 15)
    L = torch.where(dj == 0, L, requant).to(torch.int32).reshape(nb, 4, 2, 32)
    qs = (L[:, :, 0] | (L[:, :, 1] << 4)).to(torch.uint8).reshape(nb, 128)
    return torch.cat(
        [_fp16_bytes(max_scale.squeeze(1) / 63), _fp16_bytes(max_min.squeeze(1) / 63), _pack_k_scales(ls, lm), qs],
        dim=1,
    )


# --- Q6_K -------------------------------------------------------------------


def make_qx_quants(x: torch.Tensor, nmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric scale search of llama.cpp's make_qx_quants (rmse_type 1: weights x^2) over x [G, n].

    Returns (scale [G], levels L [G, n] in 0..2*nmax-1) with y ~ scale*(L - nmax).
    """
    idx = x.abs().argmax(dim=1, keepdim=True)
    amax = x.abs().gather(1, idx).squeeze(1)
    mx = x.gather(1, idx).squeeze(1)
    tiny = amax < GROUP_MAX_EPS
    mx = torch.where(tiny, torch.ones_like(mx), mx)
    w = x * x

    def levels(iscale: torch.Tensor) -> torch.Tensor:
        return torch.round(iscale[:, None] * x).clamp(-nmax, nmax - 1)

    l = levels(-nmax / mx)
    sumlx = (w * x * l).sum(dim=1)
    suml2 = (w * l * l).sum(dim=1)
    scale = torch.where(suml2 > 0, sumlx / torch.where(suml2 > 0, suml2, 1), 0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        lt = levels(-(nmax + torch.tensor(0.1, dtype=x.dtype) * step) / mx)
        sx = (w * x * lt).sum(dim=1)
        s2 = (w * lt * lt).sum(dim=1)
        better = (s2 > 0) & (sx * sx > best * s2)
        l = torch.where(better[:, None], lt, l)
        scale = torch.where(better, sx / torch.where(s2 > 0, s2, 1), scale)
        best = torch.where(better, scale * sx, best)
    L = torch.where(tiny[:, None], torch.zeros_like(l), l + nmax)
    return torch.where(tiny, torch.zeros_like(scale), scale), L


def _q6_k_blocks(x: torch.Tensor) -> torch.Tensor:
    nb = x.shape[0]
    scales, L = make_qx_quants(x.reshape(nb * 16, 16), nmax=32)
    scales, L = scales.reshape(nb, 16), L.reshape(nb, 16, 16)
    pick = scales.abs().argmax(dim=1, keepdim=True)
    max_scale = scales.gather(1, pick)
    zero = max_scale.abs() < GROUP_MAX_EPS
    iscale = -128 / torch.where(zero, 1, max_scale)
    d = 1 / iscale
    sc = torch.round(iscale * scales).clamp(max=127)
    dj = (_fp16_roundtrip(d) * sc).unsqueeze(-1)
    xr = x.reshape(nb, 16, 16)
    requant = torch.round(xr / torch.where(dj == 0, 1, dj)).clamp(-32, 31) + 32
    L = torch.where(dj == 0, L, requant).to(torch.int32).reshape(nb, 2, 4, 32)  # [half, quarter, l]
    ql = torch.cat(
        [L[:, :, 0] & 0xF | ((L[:, :, 2] & 0xF) << 4), L[:, :, 1] & 0xF | ((L[:, :, 3] & 0xF) << 4)], dim=2
    ).reshape(nb, 128)
    hi = L >> 4
    qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)).reshape(nb, 64)
    out = torch.cat(
        [ql.to(torch.uint8), qh.to(torch.uint8), sc.to(torch.int8).view(torch.uint8), _fp16_bytes(d.squeeze(1))], dim=1
    )
    return torch.where(zero, torch.zeros_like(out), out)


_TORCH_BLOCKS = {"Q8_0": _q8_0_blocks, "Q4_K": _q4_k_blocks, "Q6_K": _q6_k_blocks}
_GGUF_LEGACY = ("Q4_0", "Q5_0", "Q5_1")


def quantize(x: torch.Tensor, fmt: str | Format) -> torch.Tensor:
    """float [..., n] -> packed uint8 [..., row_bytes] (float formats: the raw bytes of that dtype)."""
    fmt = get_format(fmt)
    lead, n = x.shape[:-1], x.shape[-1]
    if not fmt.quantized:
        return x.to(fmt.float_dtype).contiguous().view(torch.uint8).reshape(*lead, n * fmt.type_size)
    row_bytes = fmt.row_bytes(n)
    rows = x.reshape(-1, n)
    if fmt.name in _GGUF_LEGACY:
        from gguf import GGMLQuantizationType, quants

        packed = quants.quantize(rows.float().cpu().numpy(), GGMLQuantizationType(fmt.ggml_type))
        return torch.from_numpy(np.ascontiguousarray(packed)).to(x.device).reshape(*lead, row_bytes)
    if fmt.name not in _TORCH_BLOCKS:
        raise ValueError(f"quantizing to {fmt.name} is not supported; use Q8_0, Q4_K or Q6_K")
    out = torch.empty(rows.shape[0], row_bytes, dtype=torch.uint8, device=x.device)
    for start in range(0, rows.shape[0], _ROWS_PER_CHUNK):
        chunk = rows[start : start + _ROWS_PER_CHUNK].float()
        blocks = _TORCH_BLOCKS[fmt.name](chunk.reshape(-1, fmt.block_size))
        out[start : start + chunk.shape[0]] = blocks.reshape(chunk.shape[0], row_bytes)
    return out.reshape(*lead, row_bytes)


__all__ = ["quantize", "make_qkx2_quants", "make_qx_quants", "QK_K"]
