"""Whole models on the GPU's fused kernel paths (Triton's interpreter on the CPU): greedy DFlash equals greedy
AR through the fixed-shape steps, on the trained demo pair and on a routed (MoE) target."""

from __future__ import annotations

import pytest

from dflash_chat.models.demo import demo_available
from tests.engine.helpers import run_in_interpreter


@pytest.mark.slow(seconds=55)
def test_greedy_dflash_equals_ar_with_every_kernel(tmp_path):
    if not demo_available():
        pytest.skip("this install has no demo pair")
    assert "model kernel checks passed" in run_in_interpreter("_model_check.py", "ATTENTION,GDN", str(tmp_path))
