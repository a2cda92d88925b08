"""Gated DeltaNet (the linear-attention layers of Qwen3.5/3.6), batch size 1.

Per token t and value head h, with state S [k_dim, v_dim]:
    S <- S * exp(g_t);  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
q and k are L2-normalised, q is scaled by k_dim^-1/2, g = -exp(A_log) * softplus(a + dt_bias),
beta = sigmoid(b). A depthwise causal conv (kernel 4) with SiLU runs over [q; k; v] first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dflash_chat.engine.kernels import gdn as gdn_kernel
from dflash_chat.engine.models.config import TargetConfig
from dflash_chat.engine.models.layers import GatedRMSNorm
from dflash_chat.engine.state import GDNCache


CHUNK = 64  # tokens per triangular solve
STEPWISE = 4  # below this many tokens, the token-by-token recurrence beats a solve


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


def delta_rule(q, k, v, g, beta, state: torch.Tensor) -> torch.Tensor:
    """The recurrence over T tokens, `state` updated in place; q, k at key heads. On CUDA the fused kernel;
    elsewhere token by token for a few tokens (decode), a chunk at a time beyond (prefill)."""
    if q.shape[0] < STEPWISE or gdn_kernel.available(state):
        return gdn_kernel.recurrent(q, k, v, g, beta, state, update=True)
    H = v.shape[1]
    return chunked(per_value_head(q, H), per_value_head(k, H), v, g, beta, state)


def outputs_only(q, k, v, g, beta, state: torch.Tensor) -> torch.Tensor:
    """The outputs of the recurrence over T tokens from `state`, which stays as it was (a verify)."""
    H = v.shape[1]
    if gdn_kernel.available(state):
        return gdn_kernel.recurrent(q, k, v, g, beta, state, update=False)
    if q.shape[0] <= CHUNK:
        return solve_chunk(per_value_head(q, H), per_value_head(k, H), v, g, beta, state, advance=False)[0]
    return chunked(per_value_head(q, H), per_value_head(k, H), v, g, beta, state.clone())


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.num_k_heads = cfg.linear_num_key_heads
        self.num_v_heads = cfg.linear_num_value_heads
        self.k_dim = cfg.linear_key_head_dim
        self.v_dim = cfg.linear_value_head_dim
        self.key_total = self.k_dim * self.num_k_heads
        self.value_total = self.v_dim * self.num_v_heads
        self.conv_dim = 2 * self.key_total + self.value_total
        self.kernel = cfg.linear_conv_kernel_dim
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, self.value_total, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, self.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, self.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.v_dim, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_total, cfg.hidden_size, bias=False)
        self.shared = None  # qkv, z, b and a in one matmul per weight format, once fused (models/fused.py)

    def shared_input_parts(self) -> list[nn.Module]:
        return [self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a]

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(qkv, z, b, a) projections of x."""
        if self.shared is not None:
            return self.shared(x)
        return self.in_proj_qkv(x), self.in_proj_z(x), self.in_proj_b(x), self.in_proj_a(x)

    def new_cache(self, device, dtype, block: int = 1) -> GDNCache:
        """The layer's state, with room for the inputs of a speculative forward of up to `block` tokens."""
        f32 = dict(dtype=torch.float32, device=device)
        H, Hk = self.num_v_heads, self.num_k_heads
        return GDNCache(
            recurrent=torch.zeros(H, self.k_dim, self.v_dim, **f32),
            conv=torch.zeros(self.kernel - 1, self.conv_dim, dtype=dtype, device=device),
            spec_q=torch.zeros(block, Hk, self.k_dim, **f32),
            spec_k=torch.zeros(block, Hk, self.k_dim, **f32),
            spec_v=torch.zeros(block, H, self.v_dim, dtype=dtype, device=device),
            spec_g=torch.zeros(block, H, **f32),
            spec_beta=torch.zeros(block, H, **f32),
            spec_window=torch.zeros(self.kernel - 1 + block, self.conv_dim, dtype=dtype, device=device),
        )

    def conv(self, window: torch.Tensor) -> torch.Tensor:
        """Depthwise causal conv, SiLU, over the window [conv state; T new rows] [K-1+T, C] -> [T, C]."""
        w = self.conv1d.weight[:, 0, :].to(window.dtype)  # [C, K]
        out = F.conv1d(window.t()[None], w[:, None, :], groups=self.conv_dim)[0].t()
        return F.silu(out)

    def recurrence_inputs(self, mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, cache: GDNCache):
        """The conv window [conv state; qkv projections] and the recurrence inputs (q, k, v, g, beta)."""
        window = torch.cat((cache.conv.to(mixed.dtype), mixed), dim=0)  # [K-1+T, C]
        return window, self.split_normalise(self.conv(window), b, a)

    def split_normalise(self, qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor):
        """(q, k, v, g, beta) from the conv output [T, C] and the b, a projections."""
        T = qkv.shape[0]
        q, k, v = torch.split(qkv, [self.key_total, self.key_total, self.value_total], dim=-1)
        q = q.reshape(T, self.num_k_heads, self.k_dim).float()
        k = k.reshape(T, self.num_k_heads, self.k_dim).float()
        v = v.reshape(T, self.num_v_heads, self.v_dim)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        q = q * self.k_dim**-0.5
        beta = torch.sigmoid(b.float())
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        return q, k, v, g, beta

    def forward(self, x: torch.Tensor, cache: GDNCache, speculative: bool = False) -> torch.Tensor:
        """Mix T new tokens. A speculative forward leaves the state as it was and keeps its recurrence
        inputs and conv window in the cache, so `commit` can take the state to after any prefix of the block."""
        T = x.shape[0]
        mixed, z, b, a = self.project(x)
        if T == 1 and not speculative:  # decode: the conv window shifts in place
            return self._decode(mixed, z, b, a, cache)
        window, (q, k, v, g, beta) = self.recurrence_inputs(mixed, b, a, cache)
        if speculative:
            _hold(cache, window, q, k, v, g, beta)
            core = outputs_only(q, k, v, g, beta, cache.recurrent)
        else:
            cache.conv.copy_(window[T:])
            core = delta_rule(q, k, v, g, beta, cache.recurrent)
            cache.pending = 0
        core = self.norm(core.to(x.dtype), z.reshape(T, self.num_v_heads, self.v_dim))
        return self.out_proj(core.reshape(T, self.value_total))

    def _decode(self, mixed, z, b, a, cache: GDNCache) -> torch.Tensor:
        from dflash_chat.engine import kernels

        qkv = kernels.conv_step(mixed[0], cache.conv, self.conv1d.weight[:, 0, :])[None]
        q, k, v, g, beta = self.split_normalise(qkv, b, a)
        core = delta_rule(q, k, v, g, beta, cache.recurrent)
        cache.pending = 0
        core = self.norm(core.to(mixed.dtype), z.reshape(1, self.num_v_heads, self.v_dim))
        return self.out_proj(core.reshape(1, self.value_total))

    @staticmethod
    def commit(cache: GDNCache, keep: int | torch.Tensor) -> None:
        """State after only the first `keep` tokens of the last speculative forward (a host int, or a 0-d
        device tensor >= 1): the recurrence re-run over the kept tokens' stored inputs, in place."""
        rows = cache.conv.shape[0]
        inputs = (cache.spec_q, cache.spec_k, cache.spec_v, cache.spec_g, cache.spec_beta)
        if isinstance(keep, int):
            if keep:
                gdn_kernel.recurrent(*(x[:keep] for x in inputs), cache.recurrent, update=True, outputs=False)
            cache.conv.copy_(cache.spec_window[keep : keep + rows])
        else:
            gdn_kernel.recurrent(*(x[: cache.pending] for x in inputs), cache.recurrent, update=True,
                                 outputs=False, keep=keep)
            cache.conv.copy_(cache.spec_window.index_select(0, keep + torch.arange(rows, device=keep.device)))
        cache.pending = 0


def _hold(cache: GDNCache, window, q, k, v, g, beta) -> None:
    """Keep a speculative forward's recurrence inputs and conv window for its commit."""
    T = q.shape[0]
    if cache.spec_g.shape[0] < T:  # an eager step longer than the buffers were made for
        for name in ("spec_q", "spec_k", "spec_v", "spec_g", "spec_beta"):
            buf = getattr(cache, name)
            setattr(cache, name, buf.new_zeros(T, *buf.shape[1:]))
        cache.spec_window = cache.spec_window.new_zeros(window.shape[0], window.shape[1])
    for buf, x in ((cache.spec_q, q), (cache.spec_k, k), (cache.spec_v, v), (cache.spec_g, g), (cache.spec_beta, beta)):
        buf[:T].copy_(x)
    cache.spec_window[: window.shape[0]].copy_(window)
    cache.pending = T
