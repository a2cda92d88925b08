"""Run under TRITON_INTERPRET=1 by test_quant_kernels.py: Triton kernels vs the torch reference."""

from __future__ import annotations

import torch

from dflash_chat.engine import kernels
from dflash_chat.engine.kernels import triton_quant
from dflash_chat.engine.weights import formats
from tests.engine.quant_helpers import random_rows


def check_format(name: str) -> None:
    fmt = formats.FORMATS[name]
    n, k = 40, 512  # N not a multiple of BLOCK_N, two K-quant super-blocks
    packed = torch.from_numpy(random_rows(fmt, n, k, seed=fmt.ggml_type))
    ref = formats.dequantize(packed, fmt)
    scale = float(ref.abs().max())

    deq = triton_quant.dequantize(packed, fmt, k, torch.float32)
    assert torch.equal(deq, ref), f"{name}: dequantize differs"

    bk = 256 if fmt.block_size == 256 else 128
    for m, config in [(1, (16, 32, bk, 1)), (5, (16, 32, bk, 2)), (17, (32, 16, bk, 4))]:
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        y = triton_quant.matmul_small_m(x, packed, fmt, n, config=config)
        expected = x @ ref.T
        err = float((y - expected).abs().max())
        assert err <= 1e-5 * scale * k ** 0.5, f"{name} M={m} {config}: max error {err}"

    # the dispatcher picks Triton here (interpreter on) and a config of its own
    # fp16 (the interpreter mishandles bf16; tools/gpu_check.py covers bf16 on CUDA)
    x = torch.randn(3, k, dtype=torch.float16)
    y = kernels.matmul(x, packed, fmt, n)
    expected = x.float() @ ref.to(torch.float16).float().T  # weights rounded to fp16, fp32 accumulation
    assert y.dtype == torch.float16
    assert torch.allclose(y.float(), expected, rtol=1e-2, atol=1e-2 * float(expected.abs().max())), f"{name}: fp16 matmul"
    # large M goes through dequantize + matmul
    x = torch.randn(40, k)
    assert torch.allclose(kernels.matmul(x, packed, fmt, n), x @ ref.T, atol=1e-4 * scale * k ** 0.5)


def main() -> None:
    assert kernels.use_triton(torch.zeros(1)), "interpreter mode should route to Triton"
    for name in triton_quant.FMT_IDS:
        check_format(name)
    print("all kernel checks passed")


if __name__ == "__main__":
    main()
