"""Our torch dequantizers against gguf's numpy reference, on random blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from dflash_chat.engine.ggml import formats
from tests.engine.quant_helpers import random_rows


@pytest.mark.parametrize("name", list(formats.FORMATS))
def test_dequantize_equals_gguf_reference(name):
    fmt = formats.FORMATS[name]
    rows, cols = 3, 512
    packed = random_rows(fmt, rows, cols, seed=fmt.ggml_type)
    ours = formats.dequantize(torch.from_numpy(packed), fmt).numpy()
    ref = quants.dequantize(packed, GGMLQuantizationType(fmt.ggml_type)).astype(np.float32)
    assert ours.shape == (rows, cols) == ref.shape
    # bit-exact: the same float32 products in the same order as ggml
    np.testing.assert_array_equal(ours, ref)


def test_dequantize_keeps_leading_dims():
    fmt = formats.Q4_K
    packed = torch.from_numpy(random_rows(fmt, 6, 256)).reshape(2, 3, -1)
    out = formats.dequantize(packed, fmt)
    assert out.shape == (2, 3, 256)
    np.testing.assert_array_equal(out.reshape(6, 256).numpy(), formats.dequantize(packed.reshape(6, -1), fmt).numpy())


def test_partial_blocks_are_rejected():
    with pytest.raises(ValueError, match="whole blocks"):
        formats.dequantize(torch.zeros(2, 100, dtype=torch.uint8), formats.Q8_0)
    with pytest.raises(ValueError, match="multiple of 256"):
        formats.Q4_K.row_bytes(300)
