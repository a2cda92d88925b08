"""QuantLinear / QuantEmbedding / QuantExperts equal their float counterparts on the dequantized weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dflash_chat.engine.ggml import formats
from dflash_chat.engine.quantized import QuantEmbedding, QuantExperts, QuantLinear
from dflash_chat.engine.weights.quant_tensor import QuantTensor
from tests.engine.quant_helpers import one_thread

_single_thread = pytest.fixture(autouse=True)(one_thread)
FORMATS = ["Q8_0", "Q4_K", "Q6_K", "Q5_0", "F16", "BF16", "F32"]


def _g(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("fmt", FORMATS)
def test_quant_linear_equals_linear_on_dequantized_weight(fmt):
    w = QuantTensor.from_float(torch.randn(24, 256, generator=_g(0)), fmt)
    lin = QuantLinear(w)
    ref = nn.Linear(256, 24, bias=False)
    ref.weight.data = w.dequantize()
    x = torch.randn(2, 3, 256, generator=_g(1))
    assert (lin.in_features, lin.out_features) == (256, 24)
    torch.testing.assert_close(lin(x), ref(x), rtol=1e-5, atol=1e-5)


def test_quant_tensor_keeps_bytes_and_selects_whole_rows():
    w = torch.randn(8, 256, generator=_g(2))
    q = QuantTensor.from_float(w, "Q4_K")
    assert q.nbytes == 8 * 144
    perm = torch.tensor([3, 1, 0, 2, 7, 6, 5, 4])
    torch.testing.assert_close(q.permute_rows(perm).dequantize(), q.dequantize()[perm], rtol=0, atol=0)
    torch.testing.assert_close(q[2:5].dequantize(), q.dequantize()[2:5], rtol=0, atol=0)
    with pytest.raises(ValueError, match="whole rows"):
        q.permute_rows(torch.arange(256), dim=1)


@pytest.mark.parametrize("fmt", ["Q4_K", "Q8_0", "BF16"])
def test_quant_embedding_gathers_rows_and_serves_as_lm_head(fmt):
    table = QuantTensor.from_float(torch.randn(50, 64 if fmt != "Q4_K" else 256, generator=_g(3)), fmt)
    emb = QuantEmbedding(table, dtype=torch.float32)
    ref = nn.Embedding(*table.shape)
    ref.weight.data = table.dequantize()
    ids = torch.tensor([[0, 7, 49], [7, 7, 3]])
    torch.testing.assert_close(emb(ids), ref(ids), rtol=0, atol=0)
    x = torch.randn(5, table.shape[1], generator=_g(4))
    head = emb.as_linear()
    assert head.packed.data_ptr() == emb.packed.data_ptr()  # shared, not copied
    torch.testing.assert_close(head(x), x @ ref.weight.T, rtol=1e-5, atol=1e-4)


def _float_experts(gate_up, down):
    from dflash_chat.engine.models.layers import Experts

    e, two_i, h = gate_up.shape
    mod = Experts(e, h, two_i // 2)
    mod.gate_up_proj.data = gate_up
    mod.down_proj.data = down
    return mod


@pytest.mark.parametrize("split_formats, down_format", [(False, "Q6_K"), (True, "Q6_K"), (False, "F16")])
def test_quant_experts_equal_float_experts(split_formats, down_format):
    E, H, I, N, K = 5, 256, 256, 6, 2  # expert 4 gets no token
    gate_up = torch.randn(E, 2 * I, H, generator=_g(5)) * 0.1
    down = torch.randn(E, H, I, generator=_g(6)) * 0.1
    if split_formats:
        gu = (QuantTensor.from_float(gate_up[:, :I], "Q4_K"), QuantTensor.from_float(gate_up[:, I:], "Q8_0"))
        deq_gate_up = torch.cat([gu[0].dequantize(), gu[1].dequantize()], dim=1)
    else:
        gu = QuantTensor.from_float(gate_up, "Q4_K")
        deq_gate_up = gu.dequantize()
    dq = QuantTensor.from_float(down, down_format)  # F16: a float part beside packed ones, as files may mix
    experts = QuantExperts(gu, dq)
    assert experts.fused is not split_formats
    ref = _float_experts(deq_gate_up, dq.dequantize())
    x = torch.randn(N, H, generator=_g(7))
    idx = torch.tensor([[0, 2], [2, 3], [1, 0], [3, 3], [2, 0], [0, 1]])
    w = torch.softmax(torch.randn(N, K, generator=_g(8)), dim=-1)
    want = ref(x, idx, w)
    torch.testing.assert_close(experts(x, idx, w), want, rtol=1e-5, atol=1e-5)
    # both strategies, whichever forward picks here: one call per expert (prefill) and all experts at once (decode)
    torch.testing.assert_close(experts.forward_per_expert(x, idx, w), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(experts.forward_grouped(x, idx, w), want, rtol=1e-5, atol=1e-5)


def test_shape_mismatch_is_reported():
    with pytest.raises(ValueError, match="does not hold"):
        QuantTensor(torch.zeros(2, 100, dtype=torch.uint8), formats.Q4_K, (2, 256))
