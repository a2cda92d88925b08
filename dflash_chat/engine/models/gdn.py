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

from dflash_chat.engine.models.config import TargetConfig
from dflash_chat.engine.models.layers import GatedRMSNorm
from dflash_chat.engine.state import GDNCache


CHUNK = 64  # tokens per triangular solve
STEPWISE = 4  # below this many tokens, the token-by-token recurrence beats a solve


def recurrence(q, k, v, g, beta, state: torch.Tensor) -> torch.Tensor:
    """Run the delta rule token by token, updating `state` [H, K, V] (float32) in place.

    q, k: [T, H, K]; v: [T, H, V]; g, beta: [T, H]. Returns outputs [T, H, V] (float32).
    """
    T = q.shape[0]
    out = torch.empty(T, v.shape[1], v.shape[2], dtype=torch.float32, device=v.device)
    decay = g.float().exp()
    for t in range(T):
        state.mul_(decay[t][:, None, None])
        kt = k[t].float()
        remembered = torch.einsum("hkv,hk->hv", state, kt)
        delta = (v[t].float() - remembered) * beta[t].float()[:, None]
        state.add_(kt[:, :, None] * delta[:, None, :])
        out[t] = torch.einsum("hkv,hk->hv", state, q[t].float())
    return out


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


@dataclass
class Replay:
    """A block's recurrence inputs and conv window, for blocks longer than a chunk: re-run the first n
    (n a host int)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    window: torch.Tensor

    def advance(self, n: int, state: torch.Tensor) -> None:
        if n:
            delta_rule(self.q[:n], self.k[:n], self.v[:n], self.g[:n], self.beta[:n], state)


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
    """Token by token for a few tokens (decode), a chunk at a time beyond (verify blocks, prefill)."""
    if q.shape[0] < STEPWISE:
        return recurrence(q, k, v, g, beta, state)
    return chunked(q, k, v, g, beta, state)


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

    def new_cache(self, device, dtype, block: int = 1) -> GDNCache:
        """The layer's state, with room for what a speculative forward of up to `block` tokens leaves to commit."""
        f32 = dict(dtype=torch.float32, device=device)
        H = self.num_v_heads
        return GDNCache(
            recurrent=torch.zeros(H, self.k_dim, self.v_dim, **f32),
            conv=torch.zeros(self.kernel - 1, self.conv_dim, dtype=dtype, device=device),
            spec_k=torch.zeros(H, block, self.k_dim, **f32),
            spec_G=torch.zeros(H, block, **f32),
            spec_u=torch.zeros(H, block, self.v_dim, **f32),
            spec_window=torch.zeros(self.kernel - 1 + block, self.conv_dim, dtype=dtype, device=device),
        )

    def conv(self, window: torch.Tensor) -> torch.Tensor:
        """Depthwise causal conv, SiLU, over the window [conv state; T new rows] [K-1+T, C] -> [T, C]."""
        w = self.conv1d.weight[:, 0, :].to(window.dtype)  # [C, K]
        out = F.conv1d(window.t()[None], w[:, None, :], groups=self.conv_dim)[0].t()
        return F.silu(out)

    def recurrence_inputs(self, x: torch.Tensor, cache: GDNCache):
        """The conv window [conv state; qkv projections] and the recurrence inputs (q, k, v, g, beta)."""
        T = x.shape[0]
        mixed = self.in_proj_qkv(x)
        window = torch.cat((cache.conv.to(mixed.dtype), mixed), dim=0)  # [K-1+T, C]
        qkv = self.conv(window)
        q, k, v = torch.split(qkv, [self.key_total, self.key_total, self.value_total], dim=-1)
        q = q.reshape(T, self.num_k_heads, self.k_dim).float()
        k = k.reshape(T, self.num_k_heads, self.k_dim).float()
        v = v.reshape(T, self.num_v_heads, self.v_dim)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        q = q * self.k_dim**-0.5
        if self.num_v_heads != self.num_k_heads:
            rep = self.num_v_heads // self.num_k_heads
            q = q.repeat_interleave(rep, dim=1)
            k = k.repeat_interleave(rep, dim=1)
        beta = torch.sigmoid(self.in_proj_b(x).float())
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float())
        return window, (q, k, v, g, beta)

    def forward(self, x: torch.Tensor, cache: GDNCache, speculative: bool = False) -> torch.Tensor:
        """Mix T new tokens. A speculative forward leaves the state as it was and keeps, in the cache, what
        `commit` needs to take it to the state after any prefix of the block."""
        T = x.shape[0]
        window, (q, k, v, g, beta) = self.recurrence_inputs(x, cache)
        if speculative:
            core = self._hold(cache, window, q, k, v, g, beta)
        else:
            cache.conv.copy_(window[T:])
            core = delta_rule(q, k, v, g, beta, cache.recurrent)
            cache.pending = None
        z = self.in_proj_z(x).reshape(T, self.num_v_heads, self.v_dim)
        core = self.norm(core.to(x.dtype), z)
        return self.out_proj(core.reshape(T, self.value_total))

    @staticmethod
    def _hold(cache: GDNCache, window, q, k, v, g, beta) -> torch.Tensor:
        T = q.shape[0]
        if T > CHUNK:
            cache.pending = Replay(q, k, v, g, beta, window)
            return delta_rule(q, k, v, g, beta, cache.recurrent.clone())
        if cache.spec_G.shape[1] < T:  # an eager step longer than the buffers were made for
            H = cache.spec_G.shape[0]
            cache.spec_k = cache.spec_k.new_zeros(H, T, cache.spec_k.shape[2])
            cache.spec_G = cache.spec_G.new_zeros(H, T)
            cache.spec_u = cache.spec_u.new_zeros(H, T, cache.spec_u.shape[2])
            cache.spec_window = cache.spec_window.new_zeros(window.shape[0], window.shape[1])
        core, update = solve_chunk(q, k, v, g, beta, cache.recurrent, advance=False)
        kept = ChunkUpdate(cache.spec_k[:, :T], cache.spec_G[:, :T], cache.spec_u[:, :T])
        kept.k.copy_(update.k)
        kept.G.copy_(update.G)
        kept.u.copy_(update.u)
        cache.spec_window[: window.shape[0]].copy_(window)
        cache.pending = kept
        return core

    @staticmethod
    def commit(cache: GDNCache, keep: int | torch.Tensor) -> None:
        """State after only the first `keep` tokens of the last speculative forward (a host int, or a 0-d
        device tensor >= 1)."""
        rows = cache.conv.shape[0]
        cache.pending.advance(keep, cache.recurrent)
        if isinstance(keep, int):
            window = cache.pending.window if isinstance(cache.pending, Replay) else cache.spec_window
            cache.conv.copy_(window[keep : keep + rows])
        else:
            at = keep + torch.arange(rows, device=cache.conv.device)
            cache.conv.copy_(cache.spec_window.index_select(0, at))
        cache.pending = None
