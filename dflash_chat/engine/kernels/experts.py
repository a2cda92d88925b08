"""Routed experts: the router's top-k, the (token, expert) pairs sorted by expert, every expert's matmul in one
launch per projection and the weighted sum; the Triton kernels (triton_quant.py, triton_glue.py) on CUDA, the
torch reference elsewhere. No host sync after the first-use check (first_use.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dflash_chat.engine.ggml.formats import FORMATS, Format
from dflash_chat.engine.kernels import first_use, lazy, reference
from dflash_chat.engine.kernels.configs import kernel_supports
from dflash_chat.engine.kernels.glue import silu_mul
from dflash_chat.engine.kernels.pairs import Pairs
from dflash_chat.engine.kernels.switches import use_triton


@dataclass
class Routes:
    """The (token, expert) pairs of a routed layer sorted by expert, on the device (no host sync).

    Pair p = token * top_k + slot; `order[i]` is the pair at sorted position i, `token_of[i]` its token,
    `expert_of[i]` its expert; the pairs of expert e sit at sorted positions offsets[e] .. offsets[e + 1].
    """

    order: torch.Tensor
    token_of: torch.Tensor
    offsets: torch.Tensor
    expert_of: torch.Tensor


def route(top_k_index: torch.Tensor, num_experts: int) -> Routes:
    if use_triton(top_k_index) and top_k_index.numel() <= lazy.glue().ROUTE_PAIRS:  # decode, verify: one launch
        return Routes(*lazy.glue().route(top_k_index.contiguous(), num_experts))
    return Routes(*reference.route(top_k_index, num_experts))


def top_k_softmax(logits: torch.Tensor, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(top_k_index [T, k] int64, weights [T, k] in dtype): the router's choice from its logits [T, E]."""
    if use_triton(logits) and logits.stride(-1) == 1:
        return lazy.glue().top_k_softmax(logits, k, dtype)
    return reference.top_k_softmax(logits, k, dtype)


def moe_combine(y: torch.Tensor, top_k_weights: torch.Tensor, shared, dtype: torch.dtype) -> torch.Tensor:
    """[T, H]: the experts' outputs y [T*K, H] (pair order) weighted by top_k_weights [T, K], plus
    sigmoid(gate) * out for shared = (out [T, H], gate [T, 1]) when given."""
    if use_triton(y) and y.is_contiguous() and top_k_weights.is_contiguous():
        return lazy.glue().moe_combine(y, top_k_weights, shared, dtype)
    return reference.moe_combine(y, top_k_weights, shared, dtype)


def _probe_experts(packed: torch.Tensor, fmt: Format, dtype: torch.dtype) -> bool:
    """Two experts' first 64 rows; one token (the FMA kernel), then three tokens (the tensor-core kernel)."""
    experts = packed[:2, :64].contiguous()
    n = experts.shape[1]
    k = experts.shape[-1] // fmt.type_size * fmt.block_size if fmt.quantized else experts.shape[-1]
    tq = lazy.quant()
    for tokens, picks in ((1, [[1, 0]]), (3, [[0, 1], [1, 0], [0, 1]])):
        r = route(torch.tensor(picks, device=packed.device), experts.shape[0])
        x = first_use.probe_input(tokens, k, dtype, packed.device)
        pairs = Pairs(r.token_of, r.order, r.offsets)
        kernel = tq.moe_matmul(x, experts, fmt, n, Pairs(r.token_of, r.order, r.offsets, r.expert_of))
        if not first_use.close(kernel, reference.moe_matmul(x, experts, fmt, n, pairs)):
            return False
    return True


def _experts_kernel_ok(packed: torch.Tensor, fmt: Format, k: int, dtype: torch.dtype) -> bool:
    if not use_triton(packed):
        return False
    if fmt.quantized:
        fits = kernel_supports(fmt.name, k, packed.shape[-1])
    else:
        fits = k % 256 == 0 and packed.dtype == fmt.float_dtype
    return fits and first_use.agrees("experts", _probe_experts, packed, fmt, dtype)


def moe_matmul(
    x: torch.Tensor, packed: torch.Tensor, fmt: Format, n: int, routed: Pairs, tokens: int | None = None
) -> torch.Tensor:
    """Routed experts in one call: y [P, n], y[dst[i]] = x[src[i]] @ W[e].T for the sorted positions i of
    expert e (kernels/pairs.py); packed [E, N, row_bytes] (or float [E, N, K]). `tokens` (the layer's, default:
    rows of x) picks the kernel: one token's pairs go through the FMA kernel, also for the down projection."""
    if _experts_kernel_ok(packed, fmt, x.shape[-1], x.dtype):
        return lazy.quant().moe_matmul(x, packed, fmt, n, routed, tokens)
    return reference.moe_matmul(x, packed, fmt, n, routed)


def _float_format(t: torch.Tensor) -> Format:
    return FORMATS[{torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}[t.dtype]]


def grouped_experts(
    x: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up: Sequence[tuple[torch.Tensor, Format | None]],
    down: tuple[torch.Tensor, Format | None],
    shared=None,
) -> torch.Tensor:
    """Routed experts, every expert in one launch per projection, no host sync (any number of tokens).

    gate_up: [(fused [E, 2I, ...], fmt)] (gate rows then up rows) or [(gate, fmt), (up, fmt)]; down: ([E, H, ...],
    fmt). A fmt of None means a float tensor of its own dtype (the float `Experts` module's parameters:
    `grouped_experts(x, idx, w, [(m.gate_up_proj, None)], (m.down_proj, None))`). Returns [tokens, H] in x.dtype,
    with sigmoid(gate) * out of a shared expert added when shared = (out, gate).
    """
    r = route(top_k_index, down[0].shape[0])
    tokens = top_k_index.shape[0]

    def project(inputs, src, weights):
        packed, fmt = weights
        fmt = fmt or _float_format(packed)
        return moe_matmul(inputs, packed, fmt, packed.shape[1], Pairs(src, r.order, r.offsets, r.expert_of), tokens)

    if len(gate_up) == 1:
        both = project(x, r.token_of, gate_up[0])
        half = both.shape[-1] // 2
        h = silu_mul(both[:, :half], both[:, half:])
    else:
        h = silu_mul(project(x, r.token_of, gate_up[0]), project(x, r.token_of, gate_up[1]))
    y = project(h, r.order, down)  # rows in pair order: pair p = token * top_k + slot
    return moe_combine(y, top_k_weights, shared, x.dtype)
