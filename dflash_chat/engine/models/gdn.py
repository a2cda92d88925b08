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

from dflash_chat.engine.kernels import gdn as gdn_kernel
from dflash_chat.engine.kernels.reference import causal_conv
from dflash_chat.engine.models.config import TargetConfig
from dflash_chat.engine.models.layers import GatedRMSNorm
from dflash_chat.engine.state import GDNCache


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
        # qkv, z, b and a in one matmul per weight format, once fused (models/fused.py)
        self.shared: nn.Module | None = None
        self.heads = gdn_kernel.Heads(self.num_k_heads, self.num_v_heads, self.k_dim, self.v_dim)

    def shared_input_parts(self) -> list[nn.Module]:
        return [self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a]

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(qkv, z, b, a) projections of x."""
        if self.shared is not None:
            return self.shared(x)
        return self.in_proj_qkv(x), self.in_proj_z(x), self.in_proj_b(x), self.in_proj_a(x)

    def new_cache(self, device, dtype, block: int = 1) -> GDNCache:
        """The layer's state, with room for the inputs of a speculative forward of up to `block` tokens."""
        H = self.num_v_heads
        return GDNCache(
            recurrent=torch.zeros(H, self.k_dim, self.v_dim, dtype=torch.float32, device=device),
            conv=torch.zeros(self.kernel - 1, self.conv_dim, dtype=dtype, device=device),
            spec_qkv=torch.zeros(block, self.conv_dim, dtype=dtype, device=device),
            spec_b=torch.zeros(block, H, dtype=dtype, device=device),
            spec_a=torch.zeros(block, H, dtype=dtype, device=device),
            spec_window=torch.zeros(self.kernel - 1 + block, self.conv_dim, dtype=dtype, device=device),
            window_rows=torch.arange(self.kernel - 1, device=device),
        )

    def conv(self, window: torch.Tensor) -> torch.Tensor:
        """Depthwise causal conv, SiLU, over the window [conv state; T new rows] [K-1+T, C] -> [T, C]."""
        return F.silu(causal_conv(window, self.conv1d.weight[:, 0, :]))

    def forward(self, x: torch.Tensor, cache: GDNCache, speculative: bool = False) -> torch.Tensor:
        """Mix T new tokens. A speculative forward leaves the state as it was and keeps its conv output, gate
        projections and conv window in the cache, so `commit` can take the state to after any prefix of the block."""
        from dflash_chat.engine import kernels

        T = x.shape[0]
        mixed, z, b, a = self.project(x)
        if T == 1 and not speculative:  # decode: the conv window shifts in place
            qkv = kernels.conv_step(mixed[0], cache.conv, self.conv1d.weight[:, 0, :])[None]
        elif speculative:  # the conv output and window go straight to what the commit reads
            _make_room(cache, T)
            qkv = kernels.conv_block(mixed, cache.conv, self.conv1d.weight[:, 0, :], cache.spec_window, cache.spec_qkv)
            cache.spec_b[:T].copy_(b)
            cache.spec_a[:T].copy_(a)
            cache.pending = T
        else:
            window = torch.cat((cache.conv.to(mixed.dtype), mixed), dim=0)  # [K-1+T, C]
            qkv = self.conv(window)
            cache.conv.copy_(window[T:])
        solved: list[gdn_kernel.Chunks] = []
        core = gdn_kernel.mix(
            qkv,
            b,
            a,
            self.A_log,
            self.dt_bias,
            cache.recurrent,
            self.heads,
            update=not speculative,
            out_dtype=x.dtype,
            solved=solved if speculative else None,
        )
        assert core is not None, "mix returns the outputs unless told not to"
        cache.solved = solved[0] if solved else None
        if not speculative:
            cache.pending = 0
        core = self.norm(core.to(x.dtype), z.reshape(T, self.num_v_heads, self.v_dim))  # (a kernel's are x.dtype)
        return self.out_proj(core.reshape(T, self.value_total))

    def commit(self, cache: GDNCache, keep: torch.Tensor) -> None:
        """State after only the first `keep` tokens (a 0-d device tensor) of the last speculative forward: the
        recurrence re-run over the kept tokens' stored inputs, in place (tokens past `keep` masked to no-ops),
        or finished from the forward's kept solve."""
        n = cache.pending
        if isinstance(cache.solved, gdn_kernel.Chunks):
            cache.solved.commit(cache.recurrent, keep)
        else:
            self._rerun(cache, n, keep)
        torch.index_select(cache.spec_window, 0, keep + cache.window_rows, out=cache.conv)
        cache.pending = 0
        cache.solved = None

    def _rerun(self, cache: GDNCache, n: int, keep: torch.Tensor) -> None:
        gdn_kernel.mix(
            cache.spec_qkv[:n],
            cache.spec_b[:n],
            cache.spec_a[:n],
            self.A_log,
            self.dt_bias,
            cache.recurrent,
            self.heads,
            update=True,
            outputs=False,
            keep=keep,
        )


def _make_room(cache: GDNCache, T: int) -> None:
    """Room in the speculative buffers for T tokens (an eager step longer than the block they were made for)."""
    if cache.spec_b.shape[0] >= T:
        return
    for name in ("spec_qkv", "spec_b", "spec_a"):
        buf = getattr(cache, name)
        setattr(cache, name, buf.new_zeros(T, *buf.shape[1:]))
    window = cache.spec_window
    cache.spec_window = window.new_zeros(cache.conv.shape[0] + T, window.shape[1])
