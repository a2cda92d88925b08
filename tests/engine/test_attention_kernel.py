"""The length-aware cache attention: its Triton kernel against the SDPA reference (interpreter, in a child
process since TRITON_INTERPRET must be set before triton is imported), and the reference's masking."""

from __future__ import annotations

import pytest
import torch

from dflash_chat.engine.models.attention import attend_cache
from dflash_chat.engine.models.span import Span
from tests.engine.helpers import run_in_interpreter


@pytest.mark.slow(seconds=14)
def test_kernel_equals_masked_sdpa_over_the_used_rows():
    assert "attention kernel checks passed" in run_in_interpreter("_attention_check.py", "ATTENTION")


def test_reference_path_of_a_fixed_span_ignores_rows_past_the_end():
    """The SDPA path of a fixed-shape step reads the whole cache but masks rows >= end."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 2, 8, generator=g), torch.randn(50, 1, 8, generator=g), torch.randn(50, 1, 8, generator=g)
    span = Span.fixed(torch.tensor(20), torch.arange(3), 50)
    fixed = attend_cache(q, k, v, span, 0.3)
    k2, v2 = k.clone(), v.clone()
    k2[23:], v2[23:] = 7.0, -7.0
    assert torch.equal(fixed, attend_cache(q, k2, v2, span, 0.3))
    torch.testing.assert_close(fixed, attend_cache(q, k[:23], v[:23], Span.eager(20, 3, q.device), 0.3))
