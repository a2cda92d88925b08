"""The Gated DeltaNet recurrence over a few tokens, the state updated in place (or left alone).

    S <- S * exp(g_t);  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t

Decode runs it for one token and writes the state; a speculative verify runs it for the block and
keeps the state as it was (its outputs only); the commit runs it again over the block's stored
inputs for the first `keep` tokens (a device tensor), writing the state: tokens past `keep` are
masked to a no-op (decay 1, beta 0), so the shapes never depend on how many were accepted. Each pass
reads the state once (and writes it once when it updates it). On CUDA one Triton program owns one
value head and a slice of the value dimension, so the state tile stays in registers for all the
tokens; elsewhere the same arithmetic runs as torch ops.
"""

from __future__ import annotations

import functools
import os

import torch

V_BLOCK = 32  # value columns per program


def available(state: torch.Tensor) -> bool:
    from dflash_chat.engine.kernels import triton_available

    if os.environ.get("DFLASH_CHAT_NO_TRITON_GDN"):
        return False
    interpret = os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("DFLASH_CHAT_TRITON_GDN") == "1"
    return (state.is_cuda or interpret) and triton_available()


def recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              state: torch.Tensor, *, update: bool, outputs: bool = True,
              keep: torch.Tensor | None = None) -> torch.Tensor | None:
    """q, k: [T, Hk, K] float32 (Hk key heads, each shared by H / Hk value heads); v: [T, H, V]; g, beta:
    [T, H]; state [H, K, V] float32. `update`: write the state after the tokens (after the first `keep`, a
    0-d device tensor, when given). Returns the outputs [T, H, V] float32 when `outputs`."""
    if available(state):
        return _triton(q, k, v, g, beta, state, update, outputs, keep)
    return reference(q, k, v, g, beta, state, update=update, outputs=outputs, keep=keep)


def reference(q, k, v, g, beta, state, *, update: bool, outputs: bool = True, keep=None):
    T, H = g.shape
    rep = H // q.shape[1]
    if rep > 1:
        q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)
    g, beta = g.float(), beta.float()
    if keep is not None:  # tokens past `keep` change nothing: decay 1, no write
        live = torch.arange(T, device=g.device)[:, None] < keep
        g, beta = torch.where(live, g, 0.0), torch.where(live, beta, 0.0)
    s = state if update else state.clone()
    out = torch.empty(T, H, v.shape[2], dtype=torch.float32, device=v.device) if outputs else None
    decay = g.exp()
    for t in range(T):
        s.mul_(decay[t][:, None, None])
        kt = k[t].float()
        delta = (v[t].float() - torch.einsum("hkv,hk->hv", s, kt)) * beta[t][:, None]
        s.add_(kt[:, :, None] * delta[:, None, :])
        if outputs:
            out[t] = torch.einsum("hkv,hk->hv", s, q[t].float())
    return out


@functools.cache
def _kernel():
    from dflash_chat.engine.kernels import triton_gdn  # imports triton: only once the kernel is wanted

    return triton_gdn


def _triton(q, k, v, g, beta, state, update, outputs, keep):
    T, H = g.shape
    K, V = state.shape[1], state.shape[2]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g, beta = g.float().contiguous(), beta.float().contiguous()
    out = torch.empty(T, H, V, dtype=torch.float32, device=v.device) if outputs else state  # state: unused pointer
    vb = min(V_BLOCK, V)
    kernels = _kernel()
    kernels._launch(
        kernels.recurrent_kernel, (H, V // vb), q, k, v, g, beta, state, out, keep if keep is not None else state,
        T, H // q.shape[1],
        q.stride(0), q.stride(1), v.stride(0), v.stride(1),
        K=K, V=V, VB=vb, UPDATE=update, OUTPUTS=outputs, MASKED=keep is not None,
    )
    return out if outputs else None
