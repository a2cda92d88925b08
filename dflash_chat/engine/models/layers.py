"""Building blocks shared by the target models and the drafter (batch size 1, tokens along dim 0)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class NormWeight(nn.Module):
    """An RMSNorm's weight and settings; `zero_centred` stores w with the scale 1 + w (Qwen3.5/3.6)."""

    def __init__(self, dim: int, eps: float = 1e-6, zero_centred: bool = False):
        super().__init__()
        self.eps = eps
        self.zero_centred = zero_centred
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centred else torch.ones(dim))


class RMSNorm(NormWeight):
    """RMSNorm over the last dim."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # zero-centred: normalised and scaled in float32, as the reference does
        return ops().rms_norm(x, self.weight, self.eps, self.zero_centred)


class GatedRMSNorm(NormWeight):
    """The GDN output norm: plain RMSNorm, then times silu(gate)."""

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return ops().gated_rms_norm(x, gate, self.weight, self.eps)


def ops():
    """The fused kernels (engine/kernels: Triton on CUDA, the same arithmetic in torch elsewhere) when no
    gradient is wanted; the torch reference when training (the kernels have no backward)."""
    from dflash_chat.engine import kernels
    from dflash_chat.engine.kernels import reference

    return reference if torch.is_grad_enabled() else kernels


class Rotary(nn.Module):
    """RoPE on the first `rotary_dim` channels of each head (rotate-half layout).

    `allocate` precomputes the cos/sin tables for a context once; `at` then gathers the rows of the
    positions asked for (a device tensor, so fixed-shape steps need no host value), with the same
    values `cos_sin` computes, element for element.
    Scaled RoPE (YaRN...) passes its own `inv_freq` and the `attention_factor` cos and sin are scaled by.
    """

    inv_freq: torch.Tensor  # a buffer

    def __init__(
        self, rotary_dim: int, theta: float, inv_freq: torch.Tensor | None = None, attention_factor: float = 1.0
    ):
        super().__init__()
        self.rotary_dim = rotary_dim
        if inv_freq is None:
            inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_factor = attention_factor
        self.table: tuple[torch.Tensor, torch.Tensor] | None = None

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype), sin.to(dtype)

    def allocate(self, length: int, dtype: torch.dtype) -> None:
        """Tables for positions 0..length-1 (kept when the ones there already cover them)."""
        if self._covers(length, dtype):
            return
        self.table = self.cos_sin(torch.arange(length, device=self.inv_freq.device), dtype)

    def at(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, rotary_dim] for positions [T]; they must lie inside the allocated table."""
        if self.table is None or self.table[0].dtype != dtype or self.table[0].device != self.inv_freq.device:
            return self.cos_sin(positions, dtype)
        cos, sin = self.table
        return cos.index_select(0, positions), sin.index_select(0, positions)

    def _covers(self, length: int, dtype: torch.dtype) -> bool:
        return (
            self.table is not None
            and self.table[0].shape[0] >= length
            and self.table[0].dtype == dtype
            and self.table[0].device == self.inv_freq.device
        )


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos/sin: [T, rotary_dim]."""
    rd = cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    half = rd // 2
    rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    rot = rot * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat((rot, rest), dim=-1) if rest.shape[-1] else rot


class PreNormBlock(nn.Module):
    """A pre-norm decoder layer's tail; subclasses hold `mlp` and `post_attention_layernorm`."""

    mlp: nn.Module
    post_attention_layernorm: RMSNorm

    def finish(self, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        """Add the mixer's (attention's) output to the residual stream, then the MLP's (the add and the
        post-attention norm in one kernel)."""
        norm = self.post_attention_layernorm
        x, h = ops().add_rms_norm(mixed, x, norm.weight, norm.eps, norm.zero_centred)
        return x + self.mlp(h)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        # gate and up in one matmul per weight format, once fused (models/fused.py)
        self.shared: nn.Module | None = None

    def shared_input_parts(self) -> list[nn.Module]:
        return [self.gate_proj, self.up_proj]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.shared(x) if self.shared is not None else (self.gate_proj(x), self.up_proj(x))
        return self.down_proj(ops().silu_mul(gate, up))


class Experts(nn.Module):
    """Routed experts as 3-D weights: gate_up_proj [E, 2I, H] (gate rows, then up rows), down_proj [E, H, I]."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))

    def forward(
        self,
        x: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
        shared: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The routed experts' weighted sum, plus sigmoid(gate) * out of a shared expert for shared = (out, gate)."""
        from dflash_chat.engine import kernels
        from dflash_chat.engine.kernels import reference

        if kernels.use_triton(x) and not torch.is_grad_enabled():  # one launch per projection, no host sync
            return kernels.grouped_experts(
                x, top_k_index, top_k_weights, [(self.gate_up_proj, None)], (self.down_proj, None), shared
            )
        if x.shape[0] <= PAIRWISE_TOKENS:
            return reference.add_shared(self.pairwise(x, top_k_index, top_k_weights), shared)
        out = torch.zeros_like(x)
        for expert, rows, weights in reference.routed(top_k_index, top_k_weights, self.gate_up_proj.shape[0]):
            gate, up = F.linear(x[rows], self.gate_up_proj[expert]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[expert])
            out.index_add_(0, rows, (y * weights[:, None]).to(out.dtype))
        return reference.add_shared(out, shared)

    def pairwise(self, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        """Each (token, expert) pair with its expert's weights gathered: no host read (the per-expert loop needs
        the counts on the host), for decode and verify steps."""
        T, k = top_k_index.shape
        pairs = top_k_index.reshape(-1)
        xs = x.index_select(0, torch.arange(T * k, device=x.device) // k)[..., None]  # [P, H, 1]
        gate, up = torch.bmm(self.gate_up_proj.index_select(0, pairs).to(x.dtype), xs)[..., 0].chunk(2, dim=-1)
        y = torch.bmm(self.down_proj.index_select(0, pairs).to(x.dtype), (F.silu(gate) * up)[..., None])[..., 0]
        return (y * top_k_weights.reshape(-1, 1).to(y.dtype)).view(T, k, -1).sum(dim=1)


# Without the routed-experts kernel (CPU), up to this many tokens (decode, verify) float experts run pair by
# pair (no host sync); longer inputs (prefill) loop over the experts that got tokens.
PAIRWISE_TOKENS = 32


class Router(nn.Module):
    """The experts' logits (a float matrix, like nn.Linear without bias: fused.py stacks it with the
    shared expert's gate) and the top-k choice from them."""

    def __init__(self, num_experts: int, hidden: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.in_features, self.out_features = hidden, num_experts
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.choose(F.linear(x, self.weight), x.dtype)

    def choose(self, logits: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(top_k_index, weights in dtype) from the logits [T, E] (any row stride)."""
        return ops().top_k_softmax(logits, self.top_k, dtype)


class SparseMoE(nn.Module):
    """Top-k routed experts plus a sigmoid-gated shared expert (Qwen3.5/3.6 MoE)."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, intermediate: int, shared_intermediate: int):
        super().__init__()
        self.gate = Router(num_experts, hidden, top_k)
        self.experts = Experts(num_experts, hidden, intermediate)
        self.shared_expert = MLP(hidden, shared_intermediate)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)
        self.shared: nn.Module | None = None  # the router and the shared expert's gate as one matmul (fused.py)

    def shared_input_parts(self) -> list[nn.Module]:
        return [self.gate, self.shared_expert_gate]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.shared is not None:
            logits, shared_gate = self.shared(x)
            top_i, top_w = self.gate.choose(logits, x.dtype)
        else:
            (top_i, top_w), shared_gate = self.gate(x), self.shared_expert_gate(x)
        return self.experts(x, top_i, top_w, (self.shared_expert(x), shared_gate))
