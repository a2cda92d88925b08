"""Gated DeltaNet (the linear-attention layers of Qwen3.5/3.6), batch size 1.

Per token t and value head h, with state S [k_dim, v_dim]:
    S <- S * exp(g_t);  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
q and k are L2-normalised, q is scaled by k_dim^-1/2, g = -exp(A_log) * softplus(a + dt_bias),
beta = sigmoid(b). A depthwise causal conv (kernel 4) with SiLU runs over [q; k; v] first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dflash_chat.engine.models.config import TargetConfig
from dflash_chat.engine.models.layers import GatedRMSNorm
from dflash_chat.engine.state import GDNCache


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


def chunked(q, k, v, g, beta, state: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """The same recurrence, a chunk at a time (for prefill): within a chunk the delta rule's
    triangular system is solved once (UT transform), so the loop runs T/chunk times, not T.

    Derivation: with decays folded in (G_i = sum_{j<=i} g_j inside the chunk), the chunk's corrected
    values u = (I + tril(beta K K^T * exp(G_i - G_j), -1))^-1 (beta V - beta exp(G) K S0), the outputs are
    o = exp(G) Q S0 + tril(Q K^T * exp(G_i - G_j)) u, and the final state is
    S = exp(G_T) S0 + (K * exp(G_T - G))^T u.
    """
    T, H, K = k.shape
    out = torch.empty(T, H, v.shape[2], dtype=torch.float32, device=v.device)
    for s in range(0, T, chunk):
        e = min(s + chunk, T)
        qc, kc, vc = (x[s:e].float().transpose(0, 1) for x in (q, k, v))  # [H, C, *]
        gc = g[s:e].float().transpose(0, 1).cumsum(-1)  # [H, C]
        bc = beta[s:e].float().transpose(0, 1)[..., None]  # [H, C, 1]
        C = e - s
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
        out[s:e] = o.transpose(0, 1)
        g_last = gc[:, -1:]
        state.mul_(g_last.exp()[..., None])
        state.add_((kc * (g_last - gc).exp()[..., None]).transpose(1, 2) @ u)
    return out


def delta_rule(q, k, v, g, beta, state: torch.Tensor) -> torch.Tensor:
    """Token by token for a few tokens (decode), a chunk at a time beyond (verify blocks, prefill)."""
    if q.shape[0] < 4:
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

    def new_cache(self, device, dtype) -> GDNCache:
        rec = torch.zeros(self.num_v_heads, self.k_dim, self.v_dim, dtype=torch.float32, device=device)
        conv = torch.zeros(self.kernel - 1, self.conv_dim, dtype=dtype, device=device)
        return GDNCache(rec, conv, rec.clone(), conv.clone())

    def conv(self, mixed: torch.Tensor, conv_state: torch.Tensor) -> torch.Tensor:
        """Depthwise causal conv over [conv_state; mixed] rows, SiLU. mixed: [T, C] -> [T, C]."""
        window = torch.cat((conv_state.to(mixed.dtype), mixed), dim=0)  # [K-1+T, C]
        w = self.conv1d.weight[:, 0, :].to(mixed.dtype)  # [C, K]
        out = F.conv1d(window.t()[None], w[:, None, :], groups=self.conv_dim)[0].t()
        return F.silu(out)

    def recurrence_inputs(self, x: torch.Tensor, cache: GDNCache):
        T = x.shape[0]
        mixed = self.in_proj_qkv(x)
        qkv = self.conv(mixed, cache.conv)
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
        return mixed, (q, k, v, g, beta)

    def forward(self, x: torch.Tensor, cache: GDNCache, speculative: bool = False) -> torch.Tensor:
        T = x.shape[0]
        mixed, (q, k, v, g, beta) = self.recurrence_inputs(x, cache)
        if speculative:
            cache.saved_recurrent.copy_(cache.recurrent)
            cache.saved_conv.copy_(cache.conv)
            cache.record = (q, k, v, g, beta, mixed)
        else:
            cache.record = None
        keep = self.kernel - 1
        cache.conv.copy_(torch.cat((cache.conv, mixed.to(cache.conv.dtype)), dim=0)[-keep:])
        core = delta_rule(q, k, v, g, beta, cache.recurrent)
        z = self.in_proj_z(x).reshape(T, self.num_v_heads, self.v_dim)
        core = self.norm(core.to(x.dtype), z)
        return self.out_proj(core.reshape(T, self.value_total))

    @staticmethod
    def rollback(cache: GDNCache, keep: int) -> None:
        """State after only the first `keep` tokens of the last speculative forward."""
        q, k, v, g, beta, mixed = cache.record
        if keep == q.shape[0]:
            return
        cache.recurrent.copy_(cache.saved_recurrent)
        if keep:
            delta_rule(q[:keep], k[:keep], v[:keep], g[:keep], beta[:keep], cache.recurrent)
        rows = torch.cat((cache.saved_conv, mixed[:keep].to(cache.conv.dtype)), dim=0)
        cache.conv.copy_(rows[-cache.conv.shape[0] :])
