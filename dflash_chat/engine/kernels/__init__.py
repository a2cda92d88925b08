"""Quantized matmul, routed experts, dequantize and the fused glue ops: Triton kernels on CUDA, the torch
reference path elsewhere.

Set DFLASH_CHAT_NO_TRITON=1 to force the torch path (for comparisons and debugging).

Every Triton kernel is checked against the torch path the first time it runs for a format, device and
dtype (`_agrees`); that check synchronises, so run one eager step (warm-up) before capturing a CUDA graph.
After it, no function here reads anything back to the host: shapes depend only on the inputs' shapes.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import torch

from dflash_chat.engine.ggml.formats import FORMATS, Format
from dflash_chat.engine.kernels import reference
from dflash_chat.engine.kernels.configs import SMALL_M, kernel_supports
from dflash_chat.engine.kernels.switches import kernel_wanted, triton_available, use_triton

__all__ = [
    "SMALL_M",
    "matmul",
    "dequantize",
    "moe_matmul",
    "route",
    "Routes",
    "grouped_experts",
    "add_rms_norm",
    "rms_norm",
    "silu_mul",
    "gated_rms_norm",
    "conv_step",
    "conv_block",
    "use_triton",
    "kernel_wanted",
    "triton_available",
    "top_k_softmax",
    "moe_combine",
]


_checked: dict[tuple, bool] = {}


@functools.cache
def _triton_quant():
    from dflash_chat.engine.kernels import triton_quant  # imports triton: only once a kernel is wanted

    return triton_quant


@functools.cache
def _triton_glue():
    from dflash_chat.engine.kernels import triton_glue

    return triton_glue


def _agrees(kind: str, probe, packed: torch.Tensor, fmt: Format, dtype: torch.dtype) -> bool:
    """First use of a kernel per format, device and dtype: `probe` must say it matches the torch path on real rows.

    A driver, GPU or Triton version the kernels were never run on then costs speed, not correctness. The probe
    builds its own inputs (never the caller's), so it cannot index outside them whatever the batch looks like.
    """
    key = (kind, fmt.name, packed.device, dtype)
    ok = _checked.get(key)
    if ok is None:
        try:
            ok = probe(packed, fmt, dtype)
            reason = "results differ from the torch path"
        except Exception as exc:  # noqa: BLE001 - any failure means: use the torch path
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        if not ok:
            warnings.warn(
                f"Triton {kind} {fmt.name} kernel disabled on {packed.device} ({reason}); using the slower torch path"
            )
        _checked[key] = ok
    return ok


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    got, want = got.float(), want.float()
    return bool(torch.allclose(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item() + 1e-3))


def _probe_input(rows: int, k: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.randn(rows, k, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)


def _probe_matmul(packed: torch.Tensor, fmt: Format, dtype: torch.dtype) -> bool:
    """The FMA kernel (M=1) and the tensor-core kernel (M=16) on the first 64 rows, split-K included when K is long."""
    rows = packed[:64]
    n, k = rows.shape[0], rows.shape[-1] // fmt.type_size * fmt.block_size
    x = _probe_input(16, k, dtype, packed.device)
    tq = _triton_quant()
    return all(_close(tq.matmul(x[:m], rows, fmt, n), reference.matmul(x[:m], rows, fmt, n)) for m in (1, 16))


def _probe_dequantize(packed: torch.Tensor, fmt: Format, dtype: torch.dtype) -> bool:
    rows = packed.reshape(-1, packed.shape[-1])[:64].contiguous()
    k = rows.shape[-1] // fmt.type_size * fmt.block_size
    return torch.equal(
        _triton_quant().dequantize(rows, fmt, k, torch.float32), reference.dequantize_rows(rows, fmt, torch.float32)
    )


def _probe_experts(packed: torch.Tensor, fmt: Format, dtype: torch.dtype) -> bool:
    """Two experts' first 64 rows; one token (the FMA kernel), then three tokens (the tensor-core kernel)."""
    experts = packed[:2, :64].contiguous()
    n = experts.shape[1]
    k = experts.shape[-1] // fmt.type_size * fmt.block_size if fmt.quantized else experts.shape[-1]
    tq = _triton_quant()
    for tokens, picks in ((1, [[1, 0]]), (3, [[0, 1], [1, 0], [0, 1]])):
        r = route(torch.tensor(picks, device=packed.device), experts.shape[0])
        x = _probe_input(tokens, k, dtype, packed.device)
        args = (x, experts, fmt, n, r.token_of, r.order, r.offsets)
        if not _close(tq.moe_matmul(*args, expert_of=r.expert_of), reference.moe_matmul(*args)):
            return False
    return True


def _kernel_ok(packed: torch.Tensor, fmt: Format, k: int) -> bool:
    return fmt.quantized and use_triton(packed) and kernel_supports(fmt.name, k, packed.shape[-1])


def matmul(x: torch.Tensor, packed: torch.Tensor, fmt: Format, out_features: int) -> torch.Tensor:
    """x [M, K] @ W.T for W [out_features, K] in packed rows -> [M, out_features] in x.dtype."""
    if not fmt.quantized:
        return x @ packed.to(x.dtype).T
    if _kernel_ok(packed, fmt, x.shape[-1]) and _agrees("matmul", _probe_matmul, packed, fmt, x.dtype):
        return _triton_quant().matmul(x, packed, fmt, out_features)
    return reference.matmul(x, packed, fmt, out_features)


def dequantize(packed: torch.Tensor, fmt: Format, dtype: torch.dtype) -> torch.Tensor:
    """Packed rows [..., row_bytes] -> [..., values] in dtype."""
    k = packed.shape[-1] // fmt.type_size * fmt.block_size
    if _kernel_ok(packed, fmt, k) and _agrees("dequantize", _probe_dequantize, packed, fmt, torch.float32):
        return _triton_quant().dequantize(packed.contiguous(), fmt, k, dtype)
    return reference.dequantize_rows(packed, fmt, dtype)


# --- routed experts -----------------------------------------------------------------------------------------


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
    if use_triton(top_k_index) and top_k_index.numel() <= _triton_glue().ROUTE_PAIRS:  # decode, verify: one launch
        return Routes(*_triton_glue().route(top_k_index.contiguous(), num_experts))
    return Routes(*reference.route(top_k_index, num_experts))


def top_k_softmax(logits: torch.Tensor, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(top_k_index [T, k] int64, weights [T, k] in dtype): the router's choice from its logits [T, E]."""
    if use_triton(logits) and logits.stride(-1) == 1:
        return _triton_glue().top_k_softmax(logits, k, dtype)
    return reference.top_k_softmax(logits, k, dtype)


def moe_combine(y: torch.Tensor, top_k_weights: torch.Tensor, shared, dtype: torch.dtype) -> torch.Tensor:
    """[T, H]: the experts' outputs y [T*K, H] (pair order) weighted by top_k_weights [T, K], plus
    sigmoid(gate) * out for shared = (out [T, H], gate [T, 1]) when given."""
    if use_triton(y) and y.is_contiguous() and top_k_weights.is_contiguous():
        return _triton_glue().moe_combine(y, top_k_weights, shared, dtype)
    return reference.moe_combine(y, top_k_weights, shared, dtype)


def _experts_kernel_ok(packed: torch.Tensor, fmt: Format, k: int, dtype: torch.dtype) -> bool:
    if not use_triton(packed):
        return False
    if fmt.quantized:
        fits = kernel_supports(fmt.name, k, packed.shape[-1])
    else:
        fits = k % 256 == 0 and packed.dtype == fmt.float_dtype
    return fits and _agrees("experts", _probe_experts, packed, fmt, dtype)


def moe_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    fmt: Format,
    n: int,
    src: torch.Tensor,
    dst: torch.Tensor,
    offsets: torch.Tensor,
    expert_of: torch.Tensor | None = None,
    tokens: int | None = None,
) -> torch.Tensor:
    """Routed experts in one call: y [P, n], y[dst[i]] = x[src[i]] @ W[e].T for the sorted positions i of
    expert e (offsets[e] <= i < offsets[e + 1]); packed [E, N, row_bytes] (or float [E, N, K]); P = len(src),
    dst a permutation. `expert_of` (Routes.expert_of) saves the kernel path a searchsorted; `tokens` (the layer's,
    default: rows of x) picks the kernel: one token's pairs go through the FMA kernel, also for the down projection."""
    if _experts_kernel_ok(packed, fmt, x.shape[-1], x.dtype):
        return _triton_quant().moe_matmul(x, packed, fmt, n, src, dst, offsets, expert_of, tokens)
    return reference.moe_matmul(x, packed, fmt, n, src, dst, offsets)


def _float_format(t: torch.Tensor) -> Format:
    return FORMATS[{torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}[t.dtype]]


def grouped_experts(
    x: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up: list[tuple[torch.Tensor, Format | None]],
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
        return moe_matmul(inputs, packed, fmt, packed.shape[1], src, r.order, r.offsets, r.expert_of, tokens)

    if len(gate_up) == 1:
        both = project(x, r.token_of, gate_up[0])
        half = both.shape[-1] // 2
        h = silu_mul(both[:, :half], both[:, half:])
    else:
        h = silu_mul(project(x, r.token_of, gate_up[0]), project(x, r.token_of, gate_up[1]))
    y = project(h, r.order, down)  # rows in pair order: pair p = token * top_k + slot
    return moe_combine(y, top_k_weights, shared, x.dtype)


# --- fused glue (see triton_glue.py; the torch reference path beside each) -----------------------------------


def _glue_ok(x: torch.Tensor) -> bool:
    return use_triton(x) and x.is_contiguous()


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, norm(r)) with r = residual + x rounded to x's dtype, as PreNormBlock then RMSNorm compute them."""
    if _glue_ok(x) and residual.is_contiguous():
        return _triton_glue().add_rms_norm(x, residual, weight, eps, zero_centred)
    return reference.add_rms_norm(x, residual, weight, eps, zero_centred)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool) -> torch.Tensor:
    if _glue_ok(x):
        return _triton_glue().rms_norm(x, weight, eps, zero_centred)
    return reference.rms_norm(x, weight, eps, zero_centred)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in the inputs' dtype (gate and up may be the two halves of one fused projection)."""
    if use_triton(gate) and gate.stride(-1) == 1 and up.stride(-1) == 1 and gate.shape == up.shape:
        return _triton_glue().silu_mul(gate, up)
    return reference.silu_mul(gate, up)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GDN's output norm: plain RMSNorm of x times weight, times silu(gate), in x's dtype."""
    if _glue_ok(x) and _rows_apart(gate, x):
        return _triton_glue().gated_rms_norm(x, gate, weight, eps)
    return reference.gated_rms_norm(x, gate, weight, eps)


def conv_block(
    x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, window: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """A speculative block x [T, C] (rows may be strided) through GDN's conv: window[:K-1+T] = [state; x],
    out[:T] = silu(conv(window)), returned; the conv state is left as it was (the commit takes it from window)."""
    if use_triton(x) and x.stride(-1) == 1 and window.is_contiguous() and out.is_contiguous():
        return _triton_glue().conv_block(x, state, weight, window, out)
    return reference.conv_block(x, state, weight, window, out)


def _rows_apart(gate: torch.Tensor, x: torch.Tensor) -> bool:
    """gate is x-shaped and contiguous, or [T, heads, D] contiguous within each token (z: a slice of the
    fused projection's output, its token rows strided)."""
    if gate.shape != x.shape:
        return False
    return gate.is_contiguous() or (gate.dim() == 3 and gate.stride(2) == 1 and gate.stride(1) == gate.shape[2])


def conv_step(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """One decode token through GDN's depthwise causal conv: silu(conv([state; x])) [C]; state [K-1, C] (oldest
    row first, any strides) is shifted in place to end with x."""
    if use_triton(x) and x.is_contiguous():
        return _triton_glue().conv_step(x, state, weight)
    return reference.conv_step(x, state, weight)
