"""The fused glue ops (norms, SiLU gate, GDN's conv): the Triton kernels (triton_glue.py) on CUDA, the torch
reference beside each elsewhere."""

from __future__ import annotations

import torch

from dflash_chat.engine.kernels import lazy, reference
from dflash_chat.engine.kernels.switches import use_triton


def _glue_ok(x: torch.Tensor) -> bool:
    return use_triton(x) and x.is_contiguous()


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, norm(r)) with r = residual + x rounded to x's dtype, as PreNormBlock then RMSNorm compute them."""
    if _glue_ok(x) and residual.is_contiguous():
        return lazy.glue().add_rms_norm(x, residual, weight, eps, zero_centred)
    return reference.add_rms_norm(x, residual, weight, eps, zero_centred)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centred: bool) -> torch.Tensor:
    if _glue_ok(x):
        return lazy.glue().rms_norm(x, weight, eps, zero_centred)
    return reference.rms_norm(x, weight, eps, zero_centred)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in the inputs' dtype (gate and up may be the two halves of one fused projection)."""
    if use_triton(gate) and gate.stride(-1) == 1 and up.stride(-1) == 1 and gate.shape == up.shape:
        return lazy.glue().silu_mul(gate, up)
    return reference.silu_mul(gate, up)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GDN's output norm: plain RMSNorm of x times weight, times silu(gate), in x's dtype."""
    if _glue_ok(x) and _rows_apart(gate, x):
        return lazy.glue().gated_rms_norm(x, gate, weight, eps)
    return reference.gated_rms_norm(x, gate, weight, eps)


def _rows_apart(gate: torch.Tensor, x: torch.Tensor) -> bool:
    """gate is x-shaped and contiguous, or [T, heads, D] contiguous within each token (z: a slice of the
    fused projection's output, its token rows strided)."""
    if gate.shape != x.shape:
        return False
    return gate.is_contiguous() or (gate.dim() == 3 and gate.stride(2) == 1 and gate.stride(1) == gate.shape[2])


def conv_block(
    x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, window: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """A speculative block x [T, C] (rows may be strided) through GDN's conv: window[:K-1+T] = [state; x],
    out[:T] = silu(conv(window)), returned; the conv state is left as it was (the commit takes it from window)."""
    if use_triton(x) and x.stride(-1) == 1 and window.is_contiguous() and out.is_contiguous():
        return lazy.glue().conv_block(x, state, weight, window, out)
    return reference.conv_block(x, state, weight, window, out)


def conv_step(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """One decode token through GDN's depthwise causal conv: silu(conv([state; x])) [C]; state [K-1, C] (oldest
    row first, any strides) is shifted in place to end with x."""
    if use_triton(x) and x.is_contiguous():
        return lazy.glue().conv_step(x, state, weight)
    return reference.conv_step(x, state, weight)
