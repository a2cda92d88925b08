"""Modules whose weights stay in packed GGML blocks on the device.

`QuantLinear`, `QuantEmbedding` and `QuantExperts` are drop-ins for nn.Linear, nn.Embedding and the MoE
experts module, built from `QuantTensor`s (weights/quant_tensor.py); they run through `engine.kernels`
(Triton on CUDA, torch elsewhere). Plain float formats (F32/F16/BF16) go through the same modules.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dflash_chat.engine import kernels
from dflash_chat.engine.kernels import reference
from dflash_chat.engine.weights.quant_tensor import QuantTensor, as_quant


class QuantLinear(nn.Module):
    """y = x @ W.T with W [out_features, in_features] kept packed; x may have any leading shape."""

    packed: torch.Tensor
    input_index: torch.Tensor | None

    def __init__(self, weight: QuantTensor | torch.Tensor):
        super().__init__()
        weight = as_quant(weight)
        if len(weight.shape) != 2:
            raise ValueError(f"QuantLinear needs a 2-D weight, got shape {weight.shape}")
        self.out_features, self.in_features = weight.shape
        self.fmt = weight.fmt
        self.register_buffer("packed", weight.data)
        self.register_buffer("input_index", weight.input_index)

    @property
    def weight(self) -> QuantTensor:
        return QuantTensor(self.packed, self.fmt, (self.out_features, self.in_features), self.input_index)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x = x.reshape(-1, self.in_features)
        if self.input_index is not None:
            x = x.index_select(1, self.input_index)
        y = kernels.matmul(x, self.packed, self.fmt, self.out_features)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.fmt.name}"


class QuantEmbedding(nn.Module):
    """Embedding lookup that dequantizes only the gathered rows; `as_linear()` reuses the table as a tied lm_head."""

    packed: torch.Tensor

    def __init__(self, weight: QuantTensor | torch.Tensor, dtype: torch.dtype | None = None):
        super().__init__()
        weight = as_quant(weight)
        if weight.input_index is not None:
            raise ValueError("an embedding table cannot have reordered columns")
        self.num_embeddings, self.embedding_dim = weight.shape
        self.fmt = weight.fmt
        self.register_buffer("packed", weight.data)
        self.dtype = dtype or (torch.float32 if self.fmt.quantized else weight.data.dtype)

    @property
    def weight(self) -> QuantTensor:
        return QuantTensor(self.packed, self.fmt, (self.num_embeddings, self.embedding_dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.packed.index_select(0, ids.reshape(-1).to(self.packed.device))
        return kernels.dequantize(rows, self.fmt, self.dtype).reshape(*ids.shape, self.embedding_dim)

    def as_linear(self) -> QuantLinear:
        """A QuantLinear sharing this table's bytes (no copy)."""
        return QuantLinear(self.weight)


class QuantExperts(nn.Module):
    """Routed experts with packed weights; same contract as the float module.

    gate_up: [E, 2I, H] (gate rows then up rows), or a (gate [E, I, H], up [E, I, H]) pair when
    a file stores the two in different formats; down: [E, H, I].
    """

    gate_up: torch.Tensor  # when `fused`
    gate: torch.Tensor  # when not `fused`
    up: torch.Tensor
    down: torch.Tensor

    def __init__(
        self, gate_up: QuantTensor | tuple[QuantTensor, QuantTensor] | torch.Tensor, down: QuantTensor | torch.Tensor
    ):
        super().__init__()
        fused = None
        if isinstance(gate_up, tuple):
            gate, up = (as_quant(t) for t in gate_up)
        else:
            fused = as_quant(gate_up)
            half = fused.shape[1] // 2
            gate, up = fused[:, :half], fused[:, half:]
        down = as_quant(down)
        if any(t.input_index is not None for t in (gate, up, down)):
            raise ValueError("expert weights cannot have reordered columns")
        self.num_experts, self.intermediate, self.hidden = gate.shape
        if up.shape != gate.shape or down.shape != (self.num_experts, self.hidden, self.intermediate):
            raise ValueError(f"expert shapes do not fit: gate {gate.shape}, up {up.shape}, down {down.shape}")
        self.gate_fmt, self.up_fmt, self.down_fmt = gate.fmt, up.fmt, down.fmt
        self.fused = gate.fmt == up.fmt
        if self.fused:  # one matmul for gate and up: gate rows then up rows, whole rows of blocks
            both = fused.data if fused is not None else torch.cat([gate.data, up.data], dim=1)
            self.register_buffer("gate_up", both.contiguous())
        else:
            self.register_buffer("gate", gate.data.contiguous())
            self.register_buffer("up", up.data.contiguous())
        self.register_buffer("down", down.data.contiguous())

    def forward(
        self,
        x: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
        shared: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if kernels.use_triton(self.down):
            return self.forward_grouped(x, top_k_index, top_k_weights, shared)
        return reference.add_shared(self.forward_per_expert(x, top_k_index, top_k_weights), shared)

    def forward_grouped(
        self,
        x: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
        shared: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Every expert in one kernel call per projection, no host sync (decode, verify and prefill alike)."""
        if self.fused:
            gate_up = [(self.gate_up, self.gate_fmt)]
        else:
            gate_up = [(self.gate, self.gate_fmt), (self.up, self.up_fmt)]
        return kernels.grouped_experts(x, top_k_index, top_k_weights, gate_up, (self.down, self.down_fmt), shared)

    def _gate_up(self, x: torch.Tensor, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fused:
            both = kernels.matmul(x, self.gate_up[e], self.gate_fmt, 2 * self.intermediate)
            return both[:, : self.intermediate], both[:, self.intermediate :]
        return (
            kernels.matmul(x, self.gate[e], self.gate_fmt, self.intermediate),
            kernels.matmul(x, self.up[e], self.up_fmt, self.intermediate),
        )

    def forward_per_expert(
        self, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """The torch path (no Triton): one dequantize + matmul per expert that received tokens (reads the
        routing back to the host)."""
        out = torch.zeros_like(x)
        for expert, rows, weights in reference.routed(top_k_index, top_k_weights, self.num_experts):
            gate, up = self._gate_up(x[rows], expert)
            y = kernels.matmul(F.silu(gate) * up, self.down[expert], self.down_fmt, self.hidden)
            out.index_add_(0, rows, (y * weights[:, None]).to(out.dtype))
        return out
