"""Triton kernels equal the torch path, run on CPU by Triton's interpreter.

TRITON_INTERPRET must be set before triton is imported, so the checks run in a
child process (tests/engine/_kernel_check.py) with that variable set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


def test_triton_kernels_match_torch_path_in_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("DFLASH_CHAT_NO_TRITON", None)
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("_kernel_check.py"))],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all kernel checks passed" in proc.stdout


def test_kernels_compile_for_hopper_without_a_gpu():
    """Triton compiles the CUDA kernels here (bundled ptxas), so a GPU run does not discover syntax errors."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dflash_chat.engine.kernels import triton_quant as tq

    def compile(fn, sig, consts):
        index = list(sig)
        src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in consts}},
                        constexprs={(index.index(k) if k in index else len(index) + list(consts).index(k),): v
                                    for k, v in consts.items()})
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32))
        assert compiled.asm.get("cubin"), f"no cubin for {fn.__name__}"

    ints = dict.fromkeys(("M", "N", "K", "row_bytes", "stride_xm", "stride_ym", "k_per_split"), "i32")
    for fmt, dtype, split in (("Q4_K", "bf16", 4),):  # one variant keeps CI quick; every format x dtype x split compiled by hand
        sig = {"x_ptr": f"*{dtype}", "w_ptr": "*u8", "y_ptr": "*fp32" if split > 1 else f"*{dtype}", **ints}
        compile(tq._matmul_kernel, sig, {"FMT": tq.FMT_IDS[fmt], "BLOCK_M": 16, "BLOCK_N": 64,
                                         "BLOCK_K": 256 if fmt != "Q5_0" else 128, "SPLIT_K": split, "IEEE": False})
    sig = {"x_ptr": "*bf16", "w_ptr": "*u8", "y_ptr": "*bf16", "src_ptr": "*i32", "dst_ptr": "*i32",
           "offsets_ptr": "*i32", **dict.fromkeys(("N", "K", "row_bytes", "expert_bytes", "stride_xm", "stride_ym"), "i32")}
    compile(tq._moe_kernel, sig, {"FMT": tq.FMT_IDS["Q6_K"], "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "IEEE": False})
    sig = {"w_ptr": "*u8", "out_ptr": "*bf16", "N": "i32", "K": "i32", "row_bytes": "i32"}
    compile(tq._dequant_kernel, sig, {"FMT": tq.FMT_IDS["Q5_K"], "BLOCK_N": 32, "BLOCK_K": 256})
