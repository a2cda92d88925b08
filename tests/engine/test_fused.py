"""Projections sharing an input run as one matmul per weight format, with no extra memory."""

from __future__ import annotations

import torch
from torch import nn

from dflash_chat.engine.models.fused import SharedInput, fuse_projections
from dflash_chat.engine.quantized import QuantLinear
from dflash_chat.engine.weights.quant_tensor import QuantTensor


def _quant(n, k, fmt, seed):
    g = torch.Generator().manual_seed(seed)
    return QuantLinear(QuantTensor.from_float(torch.randn(n, k, generator=g) * 0.1, fmt))


def test_one_matmul_per_format_and_the_parts_become_views():
    parts = [
        _quant(64, 256, "Q4_K", 0),
        _quant(32, 256, "Q4_K", 1),
        _quant(48, 256, "Q6_K", 2),
        _quant(16, 256, "Q4_K", 3),
    ]
    x = torch.randn(3, 256)
    want = [p(x) for p in parts]
    before = sum(p.packed.untyped_storage().nbytes() for p in parts)
    shared = SharedInput(parts)
    assert len(shared.matrices) == 2  # the Q4_K parts together, the Q6_K part alone
    got = shared(x)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    storages = {p.packed.untyped_storage().data_ptr(): p.packed.untyped_storage().nbytes() for p in parts}
    assert sum(storages.values()) == before  # the Q4_K parts are views of one buffer now, nothing copied twice
    for a, b in zip((p(x) for p in parts), want, strict=True):  # the parts still work on their own
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_float_projections_fuse_in_a_loaded_model(tiny_dirs):
    from dflash_chat.engine.load import load_target

    model = load_target(tiny_dirs["qwen3_5"][0], "cpu", torch.float32)
    layer = model.model.layers[0]
    assert layer.linear_attn.shared is not None and len(layer.linear_attn.shared.matrices) == 1
    x = torch.randn(5, model.cfg.hidden_size)
    parts = layer.linear_attn.shared_input_parts()
    fused = layer.linear_attn.shared(x)
    for got, part in zip(fused, parts, strict=True):
        torch.testing.assert_close(got, nn.functional.linear(x, part.weight), rtol=1e-6, atol=1e-6)
    storage = {p.weight.untyped_storage().data_ptr() for p in parts}
    assert len(storage) == 1
    fuse_projections(model)  # a second call changes nothing
    assert len(layer.linear_attn.shared.matrices) == 1


def test_the_router_and_the_shared_expert_gate_are_one_matmul(tiny_dirs):
    from dflash_chat.engine.load import load_target
    from dflash_chat.engine.models.layers import SparseMoE

    model = load_target(tiny_dirs["qwen3_5_moe"][0], "cpu", torch.float32)
    moe = next(m for m in model.modules() if isinstance(m, SparseMoE))
    assert moe.shared is not None and len(moe.shared.matrices) == 1
    x = torch.randn(4, model.cfg.hidden_size)
    logits, gate = moe.shared(x)
    torch.testing.assert_close(logits, nn.functional.linear(x, moe.gate.weight), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gate, moe.shared_expert_gate(x), rtol=1e-6, atol=1e-6)
    assert moe.gate.weight.untyped_storage().data_ptr() == moe.shared_expert_gate.weight.untyped_storage().data_ptr()
    # the layer gives what the unfused router and gate give
    unfused = moe.shared
    want = moe(x)
    moe.shared = None
    torch.testing.assert_close(moe(x), want, rtol=1e-5, atol=1e-6)
    moe.shared = unfused
