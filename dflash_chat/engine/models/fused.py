"""Projections that read the same input, run as one matmul per weight format.

A GDN layer's qkv/z/b/a, an attention layer's q/k/v, an MLP's gate/up and a routed layer's router and
shared-expert gate each multiply the same normed input. `fuse_projections` concatenates their weight rows once after loading (grouped by
format: a Q4_K_M file stores some of them in Q6_K) and leaves every original module a view of its
rows, so the fused model holds no extra bytes and the unfused modules keep working; the layers then
call `SharedInput` for one launch per format instead of one per projection.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from dflash_chat.engine.models.layers import Router
from dflash_chat.engine.quantized import QuantLinear
from dflash_chat.engine.weights.quant_tensor import QuantTensor


def _format_key(module: nn.Module):
    """Modules with equal keys can share one matmul; None: keep apart."""
    if isinstance(module, QuantLinear):
        return None if module.input_index is not None else ("packed", module.fmt.name, module.in_features)
    if isinstance(module, (nn.Linear, Router)) and getattr(module, "bias", None) is None:
        return ("float", module.weight.dtype, module.in_features)
    return None


class SharedInput(nn.Module):
    def __init__(self, parts: list[nn.Module]):
        super().__init__()
        self.sizes = [p.out_features for p in parts]
        groups: dict = {}
        for i, part in enumerate(parts):
            key = _format_key(part)
            groups.setdefault(key if key is not None else ("alone", i), []).append(i)
        self.plan = []  # (matrix module, indices of the parts it computes)
        self.matrices = nn.ModuleList()
        for indices in groups.values():
            members = [parts[i] for i in indices]
            matrix = members[0] if len(members) == 1 else _concatenate(members)
            self.matrices.append(matrix)
            self.plan.append(indices)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out: dict[int, torch.Tensor] = {}
        for matrix, indices in zip(self.matrices, self.plan, strict=True):
            y = matrix(x)
            for i, piece in zip(indices, y.split([self.sizes[i] for i in indices], dim=-1), strict=True):
                out[i] = piece
        return tuple(out[i] for i in range(len(self.sizes)))


def _concatenate(members: list[nn.Module]) -> nn.Module:
    """One module over the members' weight rows stacked; each member rebound to a view of its rows.
    `_format_key` groups packed linears apart from float ones (nn.Linear, Router)."""
    if isinstance(members[0], QuantLinear):
        return _concatenate_packed(cast("list[QuantLinear]", members))
    return _concatenate_float(cast("list[nn.Linear | Router]", members))


def _concatenate_packed(members: list[QuantLinear]) -> QuantLinear:
    rows = torch.cat([m.weight.data for m in members])
    fused = QuantLinear(QuantTensor(rows, members[0].fmt, (rows.shape[0], members[0].in_features)))
    at = 0
    for m in members:
        m.packed = rows[at : at + m.out_features]  # rows is the fused module's buffer
        at += m.out_features
    return fused


def _concatenate_float(members: list[nn.Linear | Router]) -> nn.Linear:
    """The members' rows stacked, in their layout: column-major when each is (engine/layout.py)."""
    if all(m.weight.stride(0) == 1 and m.weight.stride(1) != 1 for m in members):
        weight = torch.cat([m.weight.detach().t() for m in members], dim=1).t()
    else:
        weight = torch.cat([m.weight.detach() for m in members])
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    fused.weight = nn.Parameter(weight, requires_grad=False)
    at = 0
    for m in members:
        m.weight = nn.Parameter(weight[at : at + m.out_features], requires_grad=False)
        at += m.out_features
    return fused


def fuse_projections(model: nn.Module) -> None:
    """Give every module that declares `shared_input_parts()` its SharedInput (after loading, in place)."""
    for module in list(model.modules()):
        parts = getattr(module, "shared_input_parts", None)
        if parts is not None and getattr(module, "shared", None) is None:
            module.shared = SharedInput(parts())
