"""Torch reference path: dequantize a tile of weight rows, matmul. Runs on any device."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dflash_chat.engine.ggml.formats import Format, dequantize
from dflash_chat.engine.kernels.pairs import Pairs

# Dequantize at most this many weight values at once (bounds the float scratch to ~64 MB in fp32).
_TILE_VALUES = 16 * 1024 * 1024


def dequantize_rows(packed: torch.Tensor, fmt: Format, dtype: torch.dtype) -> torch.Tensor:
    """Packed rows -> values in dtype; float formats are held as tensors of their own dtype already."""
    if not fmt.quantized:
        return packed.to(dtype)
    return dequantize(packed, fmt).to(dtype)


def matmul(x: torch.Tensor, packed: torch.Tensor, fmt: Format, out_features: int) -> torch.Tensor:
    """x [M, K] @ W.T where W [N, K] is packed rows uint8 [N, row_bytes] -> [M, N] in x.dtype."""
    k = x.shape[-1]
    rows_per_tile = max(1, _TILE_VALUES // max(k, 1))
    if rows_per_tile >= out_features:
        return x @ dequantize_rows(packed, fmt, x.dtype).T
    out = torch.empty(x.shape[0], out_features, dtype=x.dtype, device=x.device)
    for start in range(0, out_features, rows_per_tile):
        w = dequantize_rows(packed[start : start + rows_per_tile], fmt, x.dtype)
        out[:, start : start + w.shape[0]] = x @ w.T
    return out


def moe_matmul(x: torch.Tensor, packed: torch.Tensor, fmt: Format, n: int, routed: Pairs) -> torch.Tensor:
    """y [P, n] with y[dst[i]] = x[src[i]] @ W[e].T for offsets[e] <= i < offsets[e + 1]; packed [E, N, row_bytes].

    P is the number of pairs and dst a permutation of 0..P-1, so every row of y is written once.
    """
    src, dst = routed.src, routed.dst
    out = torch.empty(len(routed), n, dtype=x.dtype, device=x.device)
    bounds = routed.offsets.tolist()
    for e in range(packed.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            picked = x.index_select(0, src[lo:hi].long())
            out.index_copy_(0, dst[lo:hi].long(), matmul(picked, packed[e], fmt, n))
    return out


# --- fused glue: the torch path, rounding where the model code rounds (engine/models/layers.py, gdn.py) ----


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool) -> torch.Tensor:
    """RMSNorm over the last dim: x * (1 + w) in float32 (zero-centred, Qwen3.5/3.6), else w * norm(x) in x's dtype."""
    if zero_centred:
        return F.rms_norm(x.float(), x.shape[-1:], 1.0 + weight.float(), eps).type_as(x)
    return weight * F.rms_norm(x.float(), x.shape[-1:], None, eps).type_as(x)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    r = residual + x
    return r, rms_norm(r, weight, eps, zero_centred)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return (rms_norm(x, weight, eps, False) * F.silu(gate.float())).to(x.dtype)


def causal_conv(window: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """GDN's depthwise causal conv: out[t] = sum_j window[t + j] * weight[:, j] over window [K-1+T, C] (weight
    [C, K]) -> [T, C]. On the CPU as windows of K rows times the weight, summed over K in float32 (as conv1d
    accumulates): a few elementwise ops, where conv1d's depthwise path costs ~0.1 ms a call whatever the
    size. Elsewhere conv1d (one launch, no [T, C, K] product in memory for a long prompt)."""
    if window.device.type != "cpu":
        w = weight.to(window.dtype)[:, None, :]
        return F.conv1d(window.t()[None], w, groups=window.shape[1])[0].t()
    k, f32 = weight.shape[-1], torch.float32
    windows, weight = window.unfold(0, k, 1), weight if weight.dtype == f32 else weight.float()
    out = ((windows if windows.dtype == f32 else windows.float()) * weight).sum(dim=-1)
    return out if out.dtype == window.dtype else out.to(window.dtype)


def conv_step(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    window = torch.cat((state.to(x.dtype), x[None]), dim=0)  # [K, C]
    out = causal_conv(window, weight)[0]
    state.copy_(window[1:])
    return F.silu(out)


def top_k_softmax(logits: torch.Tensor, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The router: the k likeliest experts of softmax(logits) in fp32, their weights renormalised, in dtype."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    top_w, top_i = torch.topk(probs, k, dim=-1)
    top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    return top_i, top_w.to(dtype)


def route(top_k_index: torch.Tensor, num_experts: int):
    """(order, token_of, offsets, expert_of): the pairs p = token * top_k + slot stably sorted by expert."""
    flat = top_k_index.reshape(-1)
    experts, order = torch.sort(flat, stable=True)
    bounds = torch.arange(num_experts + 1, device=flat.device, dtype=experts.dtype)
    offsets = torch.searchsorted(experts, bounds).to(torch.int32)
    return order.to(torch.int32), (order // top_k_index.shape[1]).to(torch.int32), offsets, experts.to(torch.int32)


def add_shared(routed: torch.Tensor, shared) -> torch.Tensor:
    """routed + sigmoid(gate) * out for shared = (out, gate) (Qwen3.5/3.6's shared expert), or routed."""
    if shared is None:
        return routed
    out, gate = shared
    return routed + torch.sigmoid(gate) * out


def moe_combine(y: torch.Tensor, top_k_weights: torch.Tensor, shared, dtype: torch.dtype) -> torch.Tensor:
    """The experts' outputs y [T*K, H] (pair order) weighted and summed per token in fp32, then the shared expert."""
    y = y.view(*top_k_weights.shape, y.shape[-1]) * top_k_weights[..., None].to(y.dtype)
    return add_shared(y.sum(dim=1, dtype=torch.float32).to(dtype), shared)


def conv_block(
    x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, window: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """T tokens x [T, C] through GDN's depthwise causal conv with SiLU: window[:K-1+T] = [state; x] (kept for a
    commit), out[:T] = silu(conv(window)), returned; state [K-1, C] is not changed."""
    t, k1 = x.shape[0], state.shape[0]
    window[:k1].copy_(state)
    window[k1 : k1 + t].copy_(x)
    out[:t].copy_(F.silu(causal_conv(window[: k1 + t], weight)))
    return out[:t]


def routed(top_k_index: torch.Tensor, top_k_weights: torch.Tensor, num_experts: int):
    """(expert, token rows, their routing weights) for every expert that received tokens."""
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    token_of = order // top_k_index.shape[1]
    weights = top_k_weights.reshape(-1)[order]
    start = 0
    for expert, n in enumerate(counts):
        if n:
            yield expert, token_of[start : start + n], weights[start : start + n]
            start += n
