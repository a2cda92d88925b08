"""Quantizers: Q8_0 bit-exact with gguf; Q4_K/Q6_K decode through gguf's numpy dequantizer and stay within the format's error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from dflash_chat.engine.ggml import formats
from dflash_chat.engine.ggml.quantize import make_qkx2_quants, make_qx_quants, quantize
from tests.engine.quant_helpers import one_thread

_single_thread = pytest.fixture(autouse=True)(one_thread)


def _data(rows=8, cols=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    x[1] *= 50  # a row of large values
    x[2, :256] = 0.0  # an all-zero super-block
    x[3] = x[3].abs() + 1  # all positive (min clamps to 0)
    return x


def _gguf_deq(packed: torch.Tensor, fmt) -> np.ndarray:
    return quants.dequantize(packed.numpy(), GGMLQuantizationType(fmt.ggml_type))


def test_q8_0_equals_gguf_quantizer():
    x = _data()
    ours = quantize(x, "Q8_0").numpy()
    ref = quants.quantize(x.numpy(), GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("name, rel_rmse", [("Q4_K", 0.12), ("Q6_K", 0.035)])
def test_k_quant_round_trip(name, rel_rmse):
    fmt = formats.FORMATS[name]
    x = _data()
    packed = quantize(x, fmt)
    assert packed.shape == (8, fmt.row_bytes(512)) and packed.dtype == torch.uint8
    ours = formats.dequantize(packed, fmt).numpy()
    np.testing.assert_array_equal(ours, _gguf_deq(packed, fmt))  # our layout is gguf's layout
    assert np.all(ours[2, :256] == 0)
    for row, orig in zip(ours, x.numpy(), strict=True):
        err = np.sqrt(np.mean((row - orig) ** 2)) / np.sqrt(np.mean(orig**2))
        assert err < rel_rmse, (name, err)


def test_q4_k_error_is_bounded_by_half_a_step_per_group():
    """Away from clamping, every value lands within half a quantization step of its group."""
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(3))
    packed = quantize(x, "Q4_K")
    y = formats.dequantize(packed, "Q4_K")
    sc, mn = formats.k_scales_mins(packed[:, 4:16])
    d = packed[:, 0:2].contiguous().view(torch.float16).float()
    dmin = packed[:, 2:4].contiguous().view(torch.float16).float()
    step = (d * sc.float()).repeat_interleave(32, dim=1)
    low = -(dmin * mn.float()).repeat_interleave(32, dim=1)
    inside = (x >= low) & (x <= low + 15 * step)
    assert inside.float().mean() > 0.95
    assert torch.all((y - x).abs()[inside] <= step[inside] / 2 + 1e-5)


def test_q6_k_error_is_bounded_by_half_a_step():
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(4))
    packed = quantize(x, "Q6_K")
    y = formats.dequantize(packed, "Q6_K")
    d = packed[:, 208:210].contiguous().view(torch.float16).float()
    sc = packed[:, 192:208].contiguous().view(torch.int8).float()
    step = (d * sc).abs().repeat_interleave(16, dim=1)
    assert torch.all((y - x).abs() <= step / 2 + 1e-6)


def test_make_qkx2_quants_beats_plain_min_max():
    """The search must never be worse than the first min/max guess it starts from."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 32, generator=g)
    w = torch.ones_like(x)
    scale, the_min, L = make_qkx2_quants(x, w, nmax=15, nstep=20)
    searched = ((scale[:, None] * L - the_min[:, None] - x) ** 2).sum(1)
    scale0, min0, L0 = make_qkx2_quants(x, w, nmax=15, nstep=0)
    plain = ((scale0[:, None] * L0 - min0[:, None] - x) ** 2).sum(1)
    assert torch.all(searched <= plain + 1e-6) and torch.any(searched < plain)
    assert L.min() >= 0 and L.max() <= 15


def test_make_qx_quants_levels_in_range():
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(6))
    scale, L = make_qx_quants(x, nmax=32)
    assert L.min() >= 0 and L.max() <= 63
    assert torch.allclose(scale[:, None] * (L - 32), x, atol=float(scale.abs().max()))


@pytest.mark.parametrize("name", ["Q4_0", "Q5_0", "Q5_1", "F16", "BF16"])
def test_other_formats_round_trip(name):
    x = _data(4, 64)
    y = formats.dequantize(quantize(x, name), name)
    tol = {"Q4_0": 0.2, "Q5_0": 0.1, "Q5_1": 0.1, "F16": 1e-3, "BF16": 1e-2}[name]
    assert torch.sqrt(((y - x) ** 2).mean()) / torch.sqrt((x**2).mean()) < tol


def test_unsupported_quantizer():
    with pytest.raises(ValueError, match="Q8_0, Q4_K or Q6_K"):
        quantize(torch.zeros(1, 256), "Q5_K")
