"""Run under TRITON_INTERPRET=1 by test_quant_kernels.py: Triton kernels vs the torch reference."""

from __future__ import annotations

import torch

from dflash_chat.engine import kernels
from dflash_chat.engine.kernels import triton_quant
from dflash_chat.engine.models.layers import Experts, Routing
from dflash_chat.engine.quantized import QuantExperts, QuantTensor
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


def check_experts(name: str) -> None:
    """The routed-experts kernel: idle experts, an expert with more rows than BLOCK_M, rows in pair order."""
    fmt = formats.FORMATS[name]
    e, n, k, tokens, top_k = 4, 40, 512, 20, 2
    packed = torch.stack([torch.from_numpy(random_rows(fmt, n, k, seed=fmt.ggml_type + i)) for i in range(e)])
    ref = [formats.dequantize(packed[i], fmt) for i in range(e)]
    scale = max(float(w.abs().max()) for w in ref)
    g = torch.Generator().manual_seed(1)
    idx = torch.stack([torch.zeros(tokens, dtype=torch.long), torch.randint(2, 4, (tokens,), generator=g)], dim=1)
    r = Routing.sort(idx, e)  # expert 0: all 20 tokens (two BLOCK_M passes), expert 1: none
    x = torch.randn(tokens, k, generator=g)
    y = triton_quant.moe_matmul(x, packed, fmt, n, r.token_of, r.order, r.offsets)
    want = torch.stack([x[p // top_k] @ ref[int(idx.reshape(-1)[p])].T for p in range(tokens * top_k)])
    err = float((y - want).abs().max())
    assert err <= 1e-5 * scale * k ** 0.5, f"{name} experts: max error {err}"


def check_quant_experts_module() -> None:
    """QuantExperts picks the one-launch path here and equals the float experts on the dequantized weights."""
    e, h, i, tokens = 3, 256, 256, 4
    g = torch.Generator().manual_seed(2)
    gate_up = QuantTensor.from_float(torch.randn(e, 2 * i, h, generator=g) * 0.1, "Q4_K")
    down = QuantTensor.from_float(torch.randn(e, h, i, generator=g) * 0.1, "Q6_K")
    experts = QuantExperts(gate_up, down)
    float_experts = Experts(e, h, i)
    float_experts.gate_up_proj.data = gate_up.dequantize()
    float_experts.down_proj.data = down.dequantize()
    x = torch.randn(tokens, h, generator=g)
    idx = torch.tensor([[0, 2], [2, 1], [1, 0], [0, 2]])
    w = torch.softmax(torch.randn(tokens, 2, generator=g), dim=-1)
    torch.testing.assert_close(experts(x, idx, w), float_experts(x, idx, w), rtol=1e-4, atol=1e-4)


def main() -> None:
    assert kernels.use_triton(torch.zeros(1)), "interpreter mode should route to Triton"
    for name in triton_quant.FMT_IDS:
        check_format(name)
    for name in ("Q8_0", "Q4_K", "Q6_K"):
        check_experts(name)
    check_quant_experts_module()
    print("all kernel checks passed")


if __name__ == "__main__":
    main()
