"""Triton kernels equal the torch path, run on CPU by Triton's interpreter.

TRITON_INTERPRET must be set before triton is imported, so the checks run in a child process
(tests/engine/_kernel_check.py) with that variable set.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.helpers import interpreted

pytest.importorskip("triton")


@pytest.mark.parametrize(
    "group",
    [
        pytest.param("matmul", marks=pytest.mark.slow(seconds=45)),
        pytest.param("experts", marks=pytest.mark.slow(seconds=40)),
        "glue",
    ],
)
def test_triton_kernels_match_torch_path_in_interpreter(group):
    printed = interpreted([Path(__file__).with_name("_kernel_check.py"), group], timeout=900)
    assert "all kernel checks passed" in printed
