"""Run under TRITON_INTERPRET=1 by test_quant_kernels.py: Triton kernels vs the torch reference path.

python tests/engine/_kernel_check.py matmul|experts|glue [FORMAT ...]
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import replace

import torch

from dflash_chat.engine import kernels
from dflash_chat.engine.ggml import formats
from dflash_chat.engine.kernels import configs, first_use, reference, triton_quant
from dflash_chat.engine.models.layers import Experts
from dflash_chat.engine.quantized import QuantExperts
from dflash_chat.engine.weights.quant_tensor import QuantTensor
from tests.engine.quant_helpers import random_rows

QUANT = list(configs.TILINGS)
# one format of each tiling (the kernels' index arithmetic follows the tiling; a format's own bits are its dequantize,
# checked exactly for every format below and through every kernel kind in tools/gpu_check.py's dry run, which
# test_quant_gpu_check.py runs): every launch variant and activation dtype runs on these
TILED = list({replace(t, unit_bytes=0): name for name, t in reversed(configs.TILINGS.items())}.values())[::-1]


def _x(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _check(name: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    err = float((got.float() - want).abs().max() / want.abs().max())
    assert got.shape == want.shape and err <= tol, f"{name}: relative error {err:.2e} > {tol:.0e}"


# output rounding of each dtype (the kernels accumulate in fp32; the result is rounded once)
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def check_dequantize(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The dequantize kernel against the torch path, bit for bit, flat and batched: (packed, its values)."""
    fmt = formats.FORMATS[name]
    n, k = 40, 512  # N not a multiple of BLOCK_N; two units of K
    packed = torch.from_numpy(random_rows(fmt, n, k, seed=fmt.ggml_type))
    ref = formats.dequantize(packed, fmt)
    assert torch.equal(triton_quant.dequantize(packed, fmt, k, torch.float32), ref), f"{name}: dequantize differs"
    assert torch.equal(triton_quant.dequantize(packed.reshape(2, 20, -1), fmt, k, torch.float32), ref.reshape(2, 20, k))
    return packed, ref


def check_matmul(name: str) -> None:
    fmt = formats.FORMATS[name]
    packed, ref = check_dequantize(name)
    n, k = ref.shape

    gemv, gemm = configs.Launch("gemv", 16, 1, 1, 4), configs.Launch("gemm", 16, 16, 1, 4)
    cases = [  # M, dtype, launch: FMA and tensor-core kernels, with and without split-K, every activation dtype
        (1, torch.float32, gemv),
        (1, torch.float16, gemv),
        (1, torch.bfloat16, gemv),
        (1, torch.float32, configs.Launch("gemv", 32, 1, 2, 4)),
        (4, torch.float32, gemm),
        (4, torch.float16, gemm),  # (the interpreter's tl.dot mishandles bf16)
        (16, torch.float16, configs.Launch("gemm", 32, 16, 2, 4)),
        (17, torch.float32, configs.Launch("gemm", 16, 32, 1, 4)),
    ]
    for m, dtype, launch in cases:
        x = _x(m, k, dtype, seed=m)
        y = triton_quant.matmul_small_m(x, packed, fmt, n, launch=launch)
        assert y.dtype == dtype
        _check(f"{name} M={m} {dtype} {launch}", y, x.float() @ ref.T, TOL[dtype])
        if launch.split > 1:  # the last split of each tile summed, in split order, and re-armed its counter
            assert torch.equal(triton_quant.matmul_small_m(x, packed, fmt, n, launch=launch), y), (
                f"{name}: not repeatable"
            )
            assert not triton_quant._counters(x.device).any(), f"{name}: a split-K counter was left set"

    # the dispatcher: first-use check, then its own launch choice; large M goes through dequantize + matmul
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a disabled kernel warns: that must not happen here
        for m in (1, 16, 40):
            x = _x(m, k, torch.float16, seed=m)
            want = x.float() @ ref.to(torch.float16).float().T
            _check(f"{name} dispatch M={m}", kernels.matmul(x, packed, fmt, n), want, TOL[torch.float16])
    assert first_use.checked[("matmul", name, packed.device, torch.float16)] is True


def check_experts(name: str) -> None:
    """The routed-experts kernels: idle experts, an expert with more rows than BLOCK_M, duplicates, pair order."""
    fmt = formats.FORMATS[name]
    e, n, k, top_k = 4, 40, 512, 2
    packed = torch.stack([torch.from_numpy(random_rows(fmt, n, k, seed=fmt.ggml_type + i)) for i in range(e)])
    if not fmt.quantized:
        packed = packed.view(fmt.float_dtype).reshape(e, n, k)
    ref = [reference.dequantize_rows(packed[i], fmt, torch.float32) for i in range(e)]
    g = torch.Generator().manual_seed(1)
    for tokens in (1, 20):  # one token: the FMA kernel; 20: the tensor-core kernel (expert 0 gets 20 rows)
        idx = torch.stack([torch.zeros(tokens, dtype=torch.long), torch.randint(2, 4, (tokens,), generator=g)], dim=1)
        r = kernels.route(idx, e)  # expert 1: no pairs
        for dtype in (torch.float32, torch.bfloat16 if tokens == 1 else torch.float16):  # (interpreter: no bf16 tl.dot)
            x = _x(tokens, k, dtype, seed=tokens)
            y = triton_quant.moe_matmul(x, packed, fmt, n, kernels.Pairs(r.token_of, r.order, r.offsets, r.expert_of))
            want = torch.stack([x[p // top_k].float() @ ref[int(idx.reshape(-1)[p])].T for p in range(tokens * top_k)])
            _check(f"{name} experts tokens={tokens} {dtype}", y, want, TOL[dtype])
    # without expert_of: found from the offsets
    y = triton_quant.moe_matmul(x, packed, fmt, n, kernels.Pairs(r.token_of, r.order, r.offsets))
    _check(f"{name} experts (searchsorted)", y, want, TOL[dtype])


def check_experts_module() -> None:
    """QuantExperts at a reduced Qwen3.6-35B-A3B-like shape (many experts, top-k, Q4_K gate_up + Q6_K down) on one
    token, as decode runs it: the first-use check must pass (it once indexed a second token that one-token decode
    lacks: a device-side assert on the H200) and the layer equal the float experts on the dequantized weights.
    (check_experts covers several tokens per format.)"""
    e, h, i, top_k = 16, 256, 512, 4  # I = 512 as in the real model: Q6_K rows of two blocks are whole words
    g = torch.Generator().manual_seed(2)
    q4k, q6k = formats.FORMATS["Q4_K"], formats.FORMATS["Q6_K"]
    gate_up = QuantTensor(
        torch.from_numpy(random_rows(q4k, e * 2 * i, h, seed=4)).reshape(e, 2 * i, -1), q4k, (e, 2 * i, h)
    )
    down = QuantTensor(torch.from_numpy(random_rows(q6k, e * h, i, seed=6)).reshape(e, h, -1), q6k, (e, h, i))
    layer = QuantExperts(gate_up, down)
    float_experts = Experts(e, h, i)
    float_experts.gate_up_proj.data = formats.dequantize(gate_up.data, q4k)  # the torch path, not the kernel
    float_experts.down_proj.data = formats.dequantize(down.data, q6k)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for tokens in (1,):
            x = torch.randn(tokens, h, generator=g)
            idx = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(tokens)])
            w = torch.softmax(torch.randn(tokens, top_k, generator=g), dim=-1)
            with torch.no_grad():
                want = float_experts(x, idx, w)
            _check("QuantExperts", layer(x, idx, w), want, 1e-5)
            # the float experts through the same one-launch kernels (how models/ can call them)
            got = kernels.grouped_experts(
                x, idx, w, [(float_experts.gate_up_proj.data, None)], (float_experts.down_proj.data, None)
            )
            _check("float experts, one launch", got, want, 1e-5)
        # gate and up stored in different formats (files may mix them): two launches for the pair
        q8 = formats.FORMATS["Q8_0"]
        up = torch.from_numpy(random_rows(q8, e * i, h, seed=8)).reshape(e, i, -1)
        mixed = QuantExperts((gate_up[:, :i], QuantTensor(up, q8, (e, i, h))), down)
        assert not mixed.fused
        float_experts.gate_up_proj.data = torch.cat(
            [float_experts.gate_up_proj.data[:, :i], formats.dequantize(up, q8)], dim=1
        )
        with torch.no_grad():
            _check("QuantExperts, gate and up apart", mixed(x, idx, w), float_experts(x, idx, w), 1e-5)
    assert all(
        first_use.checked[("experts", f, torch.device("cpu"), torch.float32)] for f in ("Q4_K", "Q6_K", "F32", "Q8_0")
    )


def check_glue() -> None:
    g = torch.Generator().manual_seed(3)
    # the interpreter casts fp32 -> bf16 by truncation (the GPU rounds to nearest even): rounding is checked
    # exactly in fp16, and bf16 to a unit in the last place
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        tol = {
            torch.float32: dict(rtol=1e-5, atol=1e-5),
            torch.float16: dict(rtol=1e-3, atol=1e-3),
            torch.bfloat16: dict(rtol=3e-2, atol=3e-2),
        }[dtype]
        x = torch.randn(3, 320, generator=g).to(dtype)  # hidden not a power of two
        res = torch.randn(3, 320, generator=g).to(dtype)
        w = (torch.randn(320, generator=g) * 0.1).to(dtype)
        for zero_centred in (True, False):
            r, normed = kernels.add_rms_norm(x, res, w, 1e-6, zero_centred)
            r_ref, n_ref = reference.add_rms_norm(x, res, w, 1e-6, zero_centred)
            torch.testing.assert_close(r, r_ref, rtol=0 if dtype != torch.bfloat16 else 1e-2, atol=0)
            torch.testing.assert_close(normed, n_ref, **tol)
            torch.testing.assert_close(
                kernels.rms_norm(x, w, 1e-6, zero_centred), reference.rms_norm(x, w, 1e-6, zero_centred), **tol
            )
        both = torch.randn(5, 2 * 96, generator=g).to(dtype)  # a fused gate_up output: two strided halves
        torch.testing.assert_close(
            kernels.silu_mul(both[:, :96], both[:, 96:]), reference.silu_mul(both[:, :96], both[:, 96:]), **tol
        )
        core = torch.randn(2, 6, 128, generator=g).to(dtype)  # [tokens, heads, head_dim]
        z = torch.randn(2, 6, 128, generator=g).to(dtype)
        wn = (1 + torch.randn(128, generator=g) * 0.1).to(dtype)
        torch.testing.assert_close(
            kernels.gated_rms_norm(core, z, wn, 1e-6), reference.gated_rms_norm(core, z, wn, 1e-6), **tol
        )
        fused = torch.randn(2, 6 * 128 + 40, generator=g).to(dtype)  # z as a slice of a fused projection's output
        z = fused[:, 40:].reshape(2, 6, 128)
        assert not z.is_contiguous()
        torch.testing.assert_close(
            kernels.gated_rms_norm(core, z, wn, 1e-6), reference.gated_rms_norm(core, z, wn, 1e-6), **tol
        )
        conv_w = torch.randn(72, 4, generator=g).to(dtype)
        fused = torch.randn(5, 72 + 8, generator=g).to(dtype)  # a block's conv input: columns of a fused output
        state = torch.randn(3, 72, generator=g).to(dtype)
        before = state.clone()
        got = [torch.zeros(3 + 6, 72, dtype=dtype), torch.zeros(6, 72, dtype=dtype)]
        want = [torch.zeros(3 + 6, 72, dtype=dtype), torch.zeros(6, 72, dtype=dtype)]
        out = kernels.conv_block(fused[:, 8:], state, conv_w, *got)
        torch.testing.assert_close(out, reference.conv_block(fused[:, 8:], state, conv_w, *want), **tol)
        assert out.data_ptr() == got[1].data_ptr() and torch.equal(got[0], want[0]) and torch.equal(state, before)
        for layout in ("rows", "channels"):  # state [K-1, C] as gdn.py keeps it, or a [C, K-1] buffer transposed
            base = torch.randn(3, 72, generator=g).to(dtype)
            state = base.clone() if layout == "rows" else base.t().contiguous().t()
            want_state = base.clone()
            for step in range(3):
                tok = torch.randn(72, generator=g).to(dtype)
                out = kernels.conv_step(tok, state, conv_w)
                want = reference.conv_step(tok, want_state, conv_w)
                torch.testing.assert_close(out, want, **tol)
                assert torch.equal(state, want_state), f"conv state after step {step} ({layout})"
                assert state.data_ptr() != want_state.data_ptr()


def check_moe_glue() -> None:
    """The routed layer's glue kernels against the torch path: router top-k, pair sort, weighted sum (+ shared)."""
    from dflash_chat.engine.kernels import triton_glue

    g = torch.Generator().manual_seed(5)
    for tokens, experts, k in ((1, 256, 8), (16, 256, 8), (3, 10, 3), (32, 512, 8)):
        logits = torch.randn(tokens, experts, generator=g)
        want_i, want_w = reference.top_k_softmax(logits, k, torch.bfloat16)
        got_i, got_w = triton_glue.top_k_softmax(logits, k, torch.bfloat16)
        assert torch.equal(got_i, want_i), f"top-k of {experts} for {tokens} tokens"
        assert got_w.dtype == torch.bfloat16
        torch.testing.assert_close(got_w.float(), want_w.float(), rtol=8e-3, atol=1e-6)
        # a token routed twice to one expert, idle experts, pairs of one expert in pair order
        idx = torch.randint(0, experts, (tokens, k), generator=g)
        idx[0, :2] = idx[-1, -1]
        got = triton_glue.route(idx, experts)
        for name, a, b in zip(
            ("order", "token_of", "offsets", "expert_of"), got, reference.route(idx, experts), strict=True
        ):
            assert torch.equal(a, b), f"route {name} for {tokens} tokens of top-{k} over {experts} experts"
    for dtype in (torch.float32, torch.bfloat16):
        tokens, k, h = 3, 8, 300
        y = torch.randn(tokens * k, h, generator=g).to(dtype)
        w = torch.softmax(torch.randn(tokens, k, generator=g), -1).to(dtype)
        shared = (torch.randn(tokens, h, generator=g).to(dtype), torch.randn(tokens, 1, generator=g).to(dtype))
        for extra in (None, shared):
            want = reference.moe_combine(y, w, extra, dtype)
            got = triton_glue.moe_combine(y, w, extra, dtype)
            assert got.dtype == dtype
            torch.testing.assert_close(got, want, rtol=TOL[dtype], atol=TOL[dtype])


def main(argv: list[str]) -> None:
    assert kernels.use_triton(torch.zeros(1)), "interpreter mode should route to Triton"
    group, names = argv[0], argv[1:]
    if group == "matmul":
        for name in names or TILED:
            check_matmul(name)
        for name in [] if names else [n for n in QUANT if n not in TILED]:
            check_dequantize(name)
    elif group == "experts":
        for name in names or [*TILED, "F32", "F16", "BF16"]:
            check_experts(name)
        check_experts_module()
        check_moe_glue()
    else:
        check_glue()
    print("all kernel checks passed")


if __name__ == "__main__":
    main(sys.argv[1:])
