"""Triton kernels equal the torch path, run on CPU by Triton's interpreter.

TRITON_INTERPRET must be set before triton is imported, so the checks run in a child process
(tests/engine/_kernel_check.py) with that variable set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "group",
    [
        pytest.param("matmul", marks=pytest.mark.slow(seconds=55)),
        pytest.param("experts", marks=pytest.mark.slow(seconds=50)),
        "glue",
    ],
)
def test_triton_kernels_match_torch_path_in_interpreter(group):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("DFLASH_CHAT_NO_TRITON", None)
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("_kernel_check.py")), group],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all kernel checks passed" in proc.stdout
