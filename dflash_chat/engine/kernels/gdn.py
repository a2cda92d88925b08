"""Gated DeltaNet's recurrence, from the conv output and the raw gate projections, the state updated in
place (or left alone).

Per token t and value head h, with state S [k_dim, v_dim]:
    S <- S * exp(g_t);  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
q and k are the conv output's L2-normalised key-head slices (q scaled by k_dim^-1/2), shared by
value_heads / key_heads value heads; g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b).

Decode runs it for one token and writes the state; a speculative verify runs it for the block and
keeps the state as it was (its outputs only); the commit runs it again over the block's stored
inputs for the first `keep` tokens (a device tensor), writing the state: tokens past `keep` are
masked to a no-op (decay 1, beta 0), so the shapes never depend on how many were accepted. Each pass
reads the state once (and writes it once when it updates it). On CUDA one Triton program owns one
value head and a slice of the value dimension: it normalises its q and k, computes its gates and keeps
the state tile in registers for all the tokens, so a layer's recurrence is one launch. Elsewhere the
same arithmetic runs as torch ops: token by token for a few tokens, a chunk at a time (a triangular
solve per chunk) for a verify's outputs and for prefill.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

V_BLOCK = 32  # value columns per program


def available(state: torch.Tensor) -> bool:
    from dflash_chat.engine.kernels import triton_available

    if os.environ.get("DFLASH_CHAT_NO_TRITON_GDN"):
        return False
    interpret = os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("DFLASH_CHAT_TRITON_GDN") == "1"
    return (state.is_cuda or interpret) and triton_available()


CHUNK = 64  # tokens per triangular solve
STEPWISE = 4  # below this many tokens, the token-by-token recurrence beats a solve


@dataclass(frozen=True)
class Heads:
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int

    @property
    def key_total(self) -> int:
        return self.key_heads * self.key_dim


def mix(qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
        state: torch.Tensor, heads: Heads, *, update: bool, outputs: bool = True,
        keep: torch.Tensor | None = None) -> torch.Tensor | None:
    """The recurrence over T tokens from the conv output qkv [T, 2*key_total + value_heads*value_dim] and
    the raw b, a projections [T, value_heads]; state [H, K, V] float32. `update`: write the state after the
    tokens (after the first `keep`, a 0-d device tensor >= 1, when given). Returns the outputs [T, H, V]
    (float32) when `outputs`."""
    if available(state):
        return _triton(qkv, b, a, A_log, dt_bias, state, heads, update, outputs, keep)
    q, k, v, g, beta = prepare(qkv, b, a, A_log, dt_bias, heads)
    T, H = g.shape
    if keep is not None or T < STEPWISE:
        return reference(q, k, v, g, beta, state, update=update, outputs=outputs, keep=keep)
    q, k = per_value_head(q, H), per_value_head(k, H)
    if not update:
        if T <= CHUNK:
            return solve_chunk(q, k, v, g, beta, state, advance=False)[0]
        state = state.clone()
    return chunked(q, k, v, g, beta, state)


def prepare(qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
            heads: Heads):
    """(q, k [T, key_heads, K] float32, normalised; v [T, value_heads, V]; g, beta [T, value_heads] float32)."""
    T = qkv.shape[0]
    q, k, v = torch.split(qkv, [heads.key_total, heads.key_total, heads.value_heads * heads.value_dim], dim=-1)
    q = q.reshape(T, heads.key_heads, heads.key_dim).float()
    k = k.reshape(T, heads.key_heads, heads.key_dim).float()
    v = v.reshape(T, heads.value_heads, heads.value_dim)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * heads.key_dim**-0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    beta = torch.sigmoid(b.float())
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return q, k, v, g, beta


def per_value_head(x: torch.Tensor, heads: int) -> torch.Tensor:
    """q or k [T, key_heads, K] -> [T, heads, K]: value head h reads key head h // (heads / key_heads)."""
    rep = heads // x.shape[1]
    return x.repeat_interleave(rep, dim=1) if rep > 1 else x


@dataclass
class ChunkUpdate:
    """How one chunk changes the state, token by token: after its first n tokens the state is
    S0 * exp(G[n-1]) + (k[:n] * exp(G[n-1] - G[:n]))^T @ u[:n]. The corrected values u of a token do
    not depend on later tokens, so this holds for every prefix of the chunk, not only the whole."""

    k: torch.Tensor  # [H, C, K], float32
    G: torch.Tensor  # [H, C], cumulative log decay inside the chunk
    u: torch.Tensor  # [H, C, V], corrected values from the triangular solve

    def advance(self, n: int | torch.Tensor, state: torch.Tensor) -> None:
        """Take `state` (the state before the chunk) to the state after the chunk's first n tokens, in place.

        n: a host int, or a 0-d device tensor >= 1 (then every row is weighted and the rows >= n get weight 0,
        so the shapes do not depend on n).
        """
        if isinstance(n, int):
            if n == 0:
                return
            last = self.G[:, n - 1 : n]
            weighted = self.k[:, :n] * (last - self.G[:, :n]).exp()[..., None]
            state.mul_(last.exp()[..., None]).baddbmm_(weighted.transpose(1, 2), self.u[:, :n])
            return
        rows = torch.arange(self.G.shape[1], device=self.G.device)
        last = self.G.index_select(1, (n - 1).reshape(1))  # [H, 1]
        log_w = torch.where(rows[None, :] < n, last - self.G, float("-inf"))
        weighted = self.k * log_w.exp()[..., None]
        state.mul_(last.exp()[..., None]).baddbmm_(weighted.transpose(1, 2), self.u)


def solve_chunk(q, k, v, g, beta, state: torch.Tensor, advance: bool = True) -> tuple[torch.Tensor, ChunkUpdate]:
    """The recurrence over one chunk at once; advances `state` to the chunk's end unless told not to.

    Derivation: with decays folded in (G_i = sum_{j<=i} g_j inside the chunk), the chunk's corrected
    values u = (I + tril(beta K K^T * exp(G_i - G_j), -1))^-1 (beta V - beta exp(G) K S0), the outputs are
    o = exp(G) Q S0 + tril(Q K^T * exp(G_i - G_j)) u, and the state after token n is as in `ChunkUpdate`.
    Returns outputs [C, H, V] (float32) and the chunk's update.
    """
    qc, kc, vc = (x.float().transpose(0, 1) for x in (q, k, v))  # [H, C, *]
    gc = g.float().transpose(0, 1).cumsum(-1)  # [H, C]
    bc = beta.float().transpose(0, 1)[..., None]  # [H, C, 1]
    H, C = gc.shape
    diff = gc[:, :, None] - gc[:, None, :]
    strict = torch.ones(C, C, dtype=torch.bool, device=v.device).tril(-1)
    lower = torch.ones(C, C, dtype=torch.bool, device=v.device).tril()
    decay_ij = torch.where(lower, diff, torch.full_like(diff, float("-inf"))).exp()
    a = (bc * kc) @ kc.transpose(1, 2) * decay_ij * strict
    eye = torch.eye(C, device=v.device).expand(H, C, C)
    rhs = bc * vc - bc * gc.exp()[..., None] * (kc @ state)
    u = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
    attn = (qc @ kc.transpose(1, 2)) * decay_ij
    o = gc.exp()[..., None] * (qc @ state) + attn @ u
    update = ChunkUpdate(kc, gc, u)
    if advance:
        update.advance(C, state)
    return o.transpose(0, 1), update


def chunked(q, k, v, g, beta, state: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """The same recurrence, a chunk at a time (for prefill): within a chunk the delta rule's
    triangular system is solved once (UT transform), so the loop runs T/chunk times, not T."""
    T = q.shape[0]
    out = torch.empty(T, v.shape[1], v.shape[2], dtype=torch.float32, device=v.device)
    for s in range(0, T, chunk):
        e = min(s + chunk, T)
        out[s:e], _ = solve_chunk(q[s:e], k[s:e], v[s:e], g[s:e], beta[s:e], state)
    return out


def reference(q, k, v, g, beta, state, *, update: bool, outputs: bool = True, keep=None):
    """The recurrence token by token on prepared inputs (q, k at key heads), as `mix` specifies it."""
    T, H = g.shape
    q, k = per_value_head(q, H), per_value_head(k, H)
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


def _triton(qkv, b, a, A_log, dt_bias, state, heads: Heads, update, outputs, keep):
    T, H = b.shape
    K, V = heads.key_dim, heads.value_dim
    qkv = qkv.contiguous()
    if b.stride() != a.stride() or b.stride(-1) != 1:  # b and a usually are columns of one fused projection
        b, a = b.contiguous(), a.contiguous()
    out = torch.empty(T, H, V, dtype=torch.float32, device=qkv.device) if outputs else state  # state: unused
    vb = min(V_BLOCK, V)
    kernels = _kernel()
    kernels._launch(
        kernels.recurrent_kernel, (H, V // vb), qkv, b, a, A_log, dt_bias, state, out,
        keep if keep is not None else state, T, H // heads.key_heads, qkv.stride(0), heads.key_total, b.stride(0),
        K=K, V=V, VB=vb, UPDATE=update, OUTPUTS=outputs, MASKED=keep is not None,
    )
    return out if outputs else None
