#!/usr/bin/env python
"""The one kernel check a GPU session runs (under ~3 minutes on an H200), and its offline half.

    python tools/gpu_check.py                 # CUDA: correctness, bandwidth, experts, glue, resident bytes
    python tools/gpu_check.py --sweep         # ... plus a few launch configurations at M=1 and M=16
    python tools/gpu_check.py --compile-only  # no GPU: compile every kernel configuration the engine would pick
                                              # for the catalog's models, for sm_86/sm_89/sm_90; print registers,
                                              # spills, load widths and instructions per weight value
    python tools/gpu_check.py --dry-run       # CPU, tiny shapes (the tests run it under TRITON_INTERPRET=1)

On a GPU:
1. Correctness: every quantized format (Q8_0, Q4_0, Q5_0, Q5_1, Q2_K..Q6_K, IQ4_NL, IQ4_XS), M in {1, 4, 16}
   (the FMA kernel, the tensor-core kernel, split-K and its in-kernel finish), bf16 (Q4_K also fp16), against the
   torch path in fp32; dequantize bit-exact; routed experts (quantized and bf16) against one matmul per
   expert; the fused glue kernels against their torch references. A kernel that failed its first-use check
   and fell back to torch counts as a failure.
2. Bandwidth at Qwen3.6-27B shapes (Q4_K_M mix and Q8_0): GB/s at M=1 against device-to-device copy
   (goal >= 70%), time at M=16 over M=1 (goal <= 1.3x).
3. Routed experts at Qwen3.6-35B-A3B shapes (256 experts, top-8, hidden 2048, width 512; Q4_K gate_up +
   Q6_K down, and Q8_0): one launch per projection against one torch matmul per expert.
4. Resident bytes: a few layers written to a GGUF and loaded as QuantLinear modules (goal within 5%).
Kernels are compiled up front in parallel processes (they land in Triton's cache), which keeps the
check short. Prints a report; writes it as JSON to $OUT/gpu_check.json when $OUT is set (or --json PATH).

It is one script of about 650 lines because a GPU session copies and runs it whole, in one process: the four
checks share the packed weights and the timing helpers, and each section is marked by a `# ---` line. The
compile-only cases live in dflash_chat/bench/kernel_cases.py, beside compile_check.py that builds them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflash_chat.bench.kernel_cases import MOE_35B, catalog_cases, dequant_case, matmul_case  # noqa: E402
from dflash_chat.engine import kernels  # noqa: E402
from dflash_chat.engine.ggml.formats import FORMATS  # noqa: E402
from dflash_chat.engine.kernels import configs, first_use, reference  # noqa: E402
from dflash_chat.engine.quantized import QuantLinear  # noqa: E402
from dflash_chat.engine.weights.quant_tensor import QuantTensor  # noqa: E402

QUANT_FORMATS = list(configs.TILINGS)
M_VALUES = [1, 4, 16]
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 2e-5}
# (name, out_features N, in_features K, format) at Qwen3.6-27B shapes, as in a Q4_K_M file, and a Q8_0 one
SHAPES_27B = [
    ("ffn_gate/up 17408x5120", 17408, 5120, "Q4_K"),
    ("ffn_down 5120x17408", 5120, 17408, "Q4_K"),
    ("ffn_down(bumped) 5120x17408", 5120, 17408, "Q6_K"),
    ("attn_qkv 10240x5120", 10240, 5120, "Q4_K"),
    ("ssm_out 5120x6144", 5120, 6144, "Q4_K"),
    ("ffn_gate/up Q8_0", 17408, 5120, "Q8_0"),
]
GATE_UP_DOWN = [("Q4_K", "Q6_K"), ("Q8_0", "Q8_0"), ("BF16", "BF16")]


# --- weights -------------------------------------------------------------------------------------------------

_FP16_FIELDS = {
    "Q4_0": (0,),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}


def packed_weights(
    fmt_name: str, n: int, k: int, device: torch.device, seed: int = 0, lead: tuple = ()
) -> torch.Tensor:
    """Random blocks of `fmt` [*lead, n, row_bytes], made on the device: random bytes, small finite fp16 scales
    (the kernels' speed does not depend on the values; correctness compares against the same blocks)."""
    fmt = FORMATS[fmt_name]
    g = torch.Generator(device=device).manual_seed(seed)
    count = int(np.prod(lead, dtype=np.int64)) * n
    if not fmt.quantized:
        w = torch.randn(count, k, generator=g, device=device) * 0.05
        return w.to(fmt.float_dtype).reshape(*lead, n, k)
    nb = count * k // fmt.block_size
    blocks = torch.randint(0, 256, (nb, fmt.type_size), generator=g, device=device, dtype=torch.uint8)
    for at in _FP16_FIELDS[fmt_name]:
        scale = (torch.randn(nb, generator=g, device=device) * 2e-4).to(torch.float16)
        blocks[:, at : at + 2] = scale.view(torch.uint8).reshape(nb, 2)
    return blocks.reshape(*lead, n, -1)


# --- timing ----------------------------------------------------------------------------------------------------


def time_fn(fn, device: torch.device, reps: int = 1) -> float:
    """Median seconds of fn() (on CPU `reps` timed runs and no warm-up: the dry run only exercises the code, and
    under Triton's interpreter each call is seconds)."""
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median") / 1e3
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Device-to-device copy: bytes read + written per second."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / time_fn(lambda: dst.copy_(src), device)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-12))


# --- 1. correctness -------------------------------------------------------------------------------------------


def check_matmuls(device: torch.device, n: int, k: int, dtype: torch.dtype) -> list[dict]:
    rows = []
    for fmt_name in QUANT_FORMATS:
        fmt = FORMATS[fmt_name]
        packed = packed_weights(fmt_name, n, k, device, seed=fmt.ggml_type)
        ref_w = reference.dequantize_rows(packed, fmt, torch.float32)
        deq_exact = bool(torch.equal(kernels.dequantize(packed, fmt, torch.float32), ref_w))
        for dt in [dtype, torch.float16] if fmt_name == "Q4_K" and dtype != torch.float16 else [dtype]:
            for m in M_VALUES:
                x = torch.randn(m, k, device=device, generator=torch.Generator(device=device).manual_seed(m)).to(dt)
                rel = _rel(kernels.matmul(x, packed, fmt, n), x.float() @ ref_w.T)
                rows.append(
                    {
                        "what": "matmul",
                        "format": fmt_name,
                        "dtype": str(dt).split(".")[-1],
                        "M": m,
                        "rel_error": rel,
                        "dequantize_exact": deq_exact,
                        "ok": rel < TOLERANCE[dt] and deq_exact,
                    }
                )
    return rows + check_split_repeats(device, n, k, dtype, repeats=200 if device.type == "cuda" else 2)


def check_split_repeats(device: torch.device, n: int, k: int, dtype: torch.dtype, repeats: int = 200) -> list[dict]:
    """Split-K finished in the kernel by each tile's last program: the same bits every time (no race between
    the partial sums and the arrival count) and every counter back at zero."""
    from dflash_chat.engine.kernels import triton_quant

    if not kernels.use_triton(torch.empty(0, device=device)):
        return []
    fmt = FORMATS["Q4_K"]
    packed = packed_weights("Q4_K", n, k, device, seed=fmt.ggml_type)
    ref_w = reference.dequantize_rows(packed, fmt, torch.float32)
    rows = []
    for kernel, m in (("gemv", 1), ("gemm", 16)):
        split = max(2, min(8, k // configs.UNIT // 2))
        launch = configs.Launch(kernel, 16, 1 if m == 1 else 16, split, configs.warps_for("Q4_K", kernel))
        x = torch.randn(m, k, device=device, generator=torch.Generator(device=device).manual_seed(7)).to(dtype)
        first = triton_quant.matmul_small_m(x, packed, fmt, n, launch=launch)
        same = all(
            torch.equal(triton_quant.matmul_small_m(x, packed, fmt, n, launch=launch), first) for _ in range(repeats)
        )
        armed = not bool(triton_quant._counters(device).any())
        rel = _rel(first, x.float() @ ref_w.T)
        rows.append(
            {
                "what": "split-K repeat",
                "format": "Q4_K",
                "dtype": str(dtype).split(".")[-1],
                "M": m,
                "split": split,
                "repeats": repeats,
                "rel_error": rel,
                "identical": same,
                "counters_zero": armed,
                "ok": same and armed and rel < TOLERANCE[dtype],
            }
        )
    return rows


def _experts_reference(x, idx, w, gate_up, down, gu_fmt, d_fmt) -> torch.Tensor:
    """One torch matmul per (token, slot): the definition of the routed-experts layer."""
    out = torch.zeros(x.shape[0], down.shape[1], device=x.device, dtype=torch.float32)
    for t in range(x.shape[0]):
        for s in range(idx.shape[1]):
            e = int(idx[t, s])
            gu = reference.dequantize_rows(gate_up[e], gu_fmt, torch.float32)
            dn = reference.dequantize_rows(down[e], d_fmt, torch.float32)
            gate, up = (x[t].float() @ gu.T).chunk(2)
            out[t] += float(w[t, s]) * (dn @ (torch.nn.functional.silu(gate) * up))
    return out


def check_experts(
    device: torch.device, dtype: torch.dtype, experts: int, hidden: int, width: int, top_k: int
) -> list[dict]:
    rows = []
    for gu_name, d_name in GATE_UP_DOWN:
        gu_fmt, d_fmt = FORMATS[gu_name], FORMATS[d_name]
        gate_up = packed_weights(gu_name, 2 * width, hidden, device, seed=3, lead=(experts,))
        down = packed_weights(d_name, hidden, width, device, seed=4, lead=(experts,))
        for tokens in (1, 5):
            g = torch.Generator(device="cpu").manual_seed(tokens)
            idx = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]).to(device)
            w = torch.softmax(torch.randn(tokens, top_k, generator=g), dim=-1).to(device)
            x = torch.randn(tokens, hidden, generator=g).to(device=device, dtype=dtype)
            got = kernels.grouped_experts(x, idx, w, [(gate_up, gu_fmt)], (down, d_fmt))
            rel = _rel(got, _experts_reference(x, idx, w, gate_up, down, gu_fmt, d_fmt))
            rows.append(
                {
                    "what": "experts",
                    "format": f"{gu_name}+{d_name}",
                    "dtype": str(dtype).split(".")[-1],
                    "M": tokens,
                    "rel_error": rel,
                    "ok": rel < 2 * TOLERANCE[dtype],
                }
            )
    return rows


def check_glue(device: torch.device, dtype: torch.dtype, hidden: int) -> list[dict]:
    g = torch.Generator(device="cpu").manual_seed(5)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    x, res, w = rand(3, hidden), rand(3, hidden), rand(hidden, scale=0.1)
    both, core, z, wn = rand(4, 2 * 384), rand(2, 8, 128), rand(2, 8, 128), rand(128, scale=0.1)
    conv_w, state = rand(256, 4), rand(3, 256)
    tok = rand(256)
    cases = {}
    for zc in (True, False):
        cases[f"add_rms_norm zero_centred={zc}"] = (
            kernels.add_rms_norm(x, res, w, 1e-6, zc),
            reference.add_rms_norm(x, res, w, 1e-6, zc),
        )
    gate, up = both[:, :384], both[:, 384:]
    cases["silu_mul"] = (kernels.silu_mul(gate, up), reference.silu_mul(gate, up))
    cases["gated_rms_norm"] = (kernels.gated_rms_norm(core, z, wn, 1e-6), reference.gated_rms_norm(core, z, wn, 1e-6))
    s1, s2 = state.clone(), state.clone()
    cases["conv_step"] = ((kernels.conv_step(tok, s1, conv_w), s1), (reference.conv_step(tok, s2, conv_w), s2))
    # a routed layer (256 experts, top-8) on a verify block: router top-k, pair sort, weighted sum + shared expert
    logits = rand(16, 257)[:, :256]
    got_i, got_w = kernels.top_k_softmax(logits, 8, dtype)
    want_i, want_w = reference.top_k_softmax(logits, 8, dtype)
    cases["router top-k"] = ((got_w, got_i.float()), (want_w, want_i.float()))
    r = kernels.route(want_i, 256)
    cases["route"] = (
        tuple(t.float() for t in (r.order, r.token_of, r.offsets, r.expert_of)),
        tuple(t.float() for t in reference.route(want_i, 256)),
    )
    y, shared = rand(16 * 8, hidden), (rand(16, hidden), rand(16, 1))
    cases["experts' sum + shared"] = (
        kernels.moe_combine(y, want_w, shared, dtype),
        reference.moe_combine(y, want_w, shared, dtype),
    )
    rows = []
    for name, (got, want) in cases.items():
        got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
        rel = max(_rel(a, b) for a, b in zip(got, want, strict=True))
        rows.append(
            {
                "what": "glue",
                "format": name,
                "dtype": str(dtype).split(".")[-1],
                "M": 0,
                "rel_error": rel,
                "ok": rel < TOLERANCE[dtype],
            }
        )
    return rows


# --- 2. bandwidth -------------------------------------------------------------------------------------------


def benchmark(device: torch.device, shapes: list, dtype: torch.dtype, sweep: bool) -> dict:
    copy_bw = copy_bandwidth(device, 1 << 30 if device.type == "cuda" else 1 << 22)
    out = {"copy_GBps": copy_bw / 1e9, "layers": []}
    for name, n, k, fmt_name in shapes:
        fmt = FORMATS[fmt_name]
        packed = packed_weights(fmt_name, n, k, device)
        nbytes = packed.numel()
        x1 = torch.randn(1, k, device=device, dtype=dtype)
        x16 = torch.randn(16, k, device=device, dtype=dtype)
        t1 = time_fn(partial(kernels.matmul, x1, packed, fmt, n), device)
        t16 = time_fn(partial(kernels.matmul, x16, packed, fmt, n), device)
        row = {
            "name": name,
            "format": fmt_name,
            "weight_MB": nbytes / 1e6,
            "t_M1_us": t1 * 1e6,
            "t_M16_us": t16 * 1e6,
            "GBps_M1": nbytes / t1 / 1e9,
            "frac_of_copy_M1": nbytes / t1 / copy_bw,
            "M16_over_M1": t16 / t1,
        }
        if device.type == "cuda":
            from dflash_chat.engine.kernels import triton_quant as tq

            row["launch_M1"] = str(tq.launch_for(fmt, 1, n, k, device))
            row["launch_M16"] = str(tq.launch_for(fmt, 16, n, k, device))
            if sweep:
                row["sweep"] = sweep_launches(device, packed, fmt, n, k, x1, x16, nbytes, copy_bw)
        out["layers"].append(row)
    total = sum(r["weight_MB"] for r in out["layers"]) * 1e6
    out["frac_of_copy_M1_overall"] = total / sum(r["t_M1_us"] * 1e-6 for r in out["layers"]) / copy_bw
    out["M16_over_M1_overall"] = sum(r["t_M16_us"] for r in out["layers"]) / sum(r["t_M1_us"] for r in out["layers"])
    return out


def sweep_launches(device, packed, fmt, n, k, x1, x16, nbytes, copy_bw) -> list[dict]:
    """A few (block_n, warps, split) around the table's choice, at M=1 and M=16: the data for configs.FAMILIES."""
    from dflash_chat.engine.kernels import triton_quant as tq

    rows = []
    for kernel, x in (("gemv", x1), ("gemm", x16)):
        auto = tq.launch_for(fmt, x.shape[0], n, k, device)
        for bn, warps in ((32, 4), (64, 4), (64, 8), (128, 8)):
            for split in sorted({1, auto.split, 2 * auto.split}):
                launch = configs.Launch(kernel, bn, auto.block_m, split, warps)
                try:
                    t = time_fn(partial(tq.matmul_small_m, x, packed, fmt, n, launch=launch), device)
                except Exception as exc:  # noqa: BLE001 - a configuration that does not compile is a data point
                    rows.append({"launch": str(launch), "error": f"{type(exc).__name__}: {exc}"[:200]})
                    continue
                rows.append({"launch": str(launch), "us": t * 1e6, "frac_of_copy": nbytes / t / copy_bw})
    return rows


# --- 3. routed experts ----------------------------------------------------------------------------------------


def _experts_one_by_one(x: torch.Tensor, idx: torch.Tensor, gate_up, down, width: int) -> torch.Tensor:
    """The routed experts as one torch matmul per active expert (the baseline the grouped launch beats)."""
    (gate_up_w, gu_fmt), (down_w, d_fmt) = gate_up, down
    y = torch.zeros_like(x)
    for e in idx.unique().tolist():
        rows = (idx == e).any(dim=1).nonzero()[:, 0]
        gate, up = reference.matmul(x[rows], gate_up_w[e], gu_fmt, 2 * width).chunk(2, dim=-1)
        y[rows] += reference.matmul(torch.nn.functional.silu(gate) * up, down_w[e], d_fmt, x.shape[-1])
    return y


def benchmark_experts(
    device: torch.device, dtype: torch.dtype, experts: int, hidden: int, width: int, top_k: int
) -> dict:
    """One MoE layer's routed experts: one launch per projection vs one torch matmul per active expert.
    GB/s counts the bytes of the experts a step really reads (the distinct experts its tokens picked)."""
    out = {"experts": experts, "top_k": top_k, "hidden": hidden, "width": width, "rows": []}
    for gu_name, d_name in GATE_UP_DOWN[:2]:
        gu_fmt, d_fmt = FORMATS[gu_name], FORMATS[d_name]
        gate_up = packed_weights(gu_name, 2 * width, hidden, device, seed=1, lead=(experts,))
        down = packed_weights(d_name, hidden, width, device, seed=2, lead=(experts,))
        per_expert_bytes = gate_up[0].numel() + down[0].numel()
        g = torch.Generator().manual_seed(0)
        for m in (1, 16):
            idx = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(m)]).to(device)
            w = torch.full((m, top_k), 1.0 / top_k, device=device, dtype=dtype)
            x = torch.randn(m, hidden, device=device, dtype=dtype)
            active = int(idx.unique().numel())
            t_grouped = time_fn(partial(kernels.grouped_experts, x, idx, w, [(gate_up, gu_fmt)], (down, d_fmt)), device)
            t_loop = time_fn(partial(_experts_one_by_one, x, idx, (gate_up, gu_fmt), (down, d_fmt), width), device)
            out["rows"].append(
                {
                    "formats": f"{gu_name}+{d_name}",
                    "M": m,
                    "active_experts": active,
                    "t_grouped_us": t_grouped * 1e6,
                    "t_per_expert_us": t_loop * 1e6,
                    "grouped_speedup": t_loop / t_grouped,
                    "GBps_grouped": active * per_expert_bytes / t_grouped / 1e9,
                }
            )
    return out


# --- 4. resident bytes ------------------------------------------------------------------------------------------


def resident_bytes(device: torch.device, shapes: list, n_layers: int) -> dict:
    """Write n_layers x shapes (Q4_K_M-mix) plus F32 norms to a GGUF, load as QuantLinear, compare bytes."""
    import gguf

    from dflash_chat.engine.weights.gguf import raw_tensor

    hidden = shapes[0][2]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "layers.gguf"
        writer = gguf.GGUFWriter(str(path), "qwen35")
        for layer in range(n_layers):
            for i, (_, n, k, fmt_name) in enumerate(shapes):
                packed = packed_weights(fmt_name, n, k, torch.device("cpu"), seed=layer * 10 + i).numpy()
                writer.add_tensor(
                    f"blk.{layer}.w{i}.weight",
                    packed,
                    raw_shape=packed.shape,
                    raw_dtype=gguf.GGMLQuantizationType(FORMATS[fmt_name].ggml_type),
                )
            writer.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        file_size = path.stat().st_size
        reader = gguf.GGUFReader(path)
        if device.type == "cuda":
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated(device)
        modules = []
        for t in reader.tensors:
            w = raw_tensor(t).to(device)
            modules.append(QuantLinear(w) if isinstance(w, QuantTensor) else w)
        if device.type == "cuda":
            torch.cuda.synchronize()
            resident = torch.cuda.memory_allocated(device) - before
        else:
            resident = sum(
                m.packed.numel() if isinstance(m, QuantLinear) else m.numel() * m.element_size() for m in modules
            )
        del modules, reader
    return {
        "layers": n_layers,
        "file_bytes": file_size,
        "resident_bytes": resident,
        "resident_over_file": resident / file_size,
    }


# --- compiling without a GPU, and compiling ahead on one ----------------------------------------------------------


def compile_only(arches: list[str], quick: bool) -> int:
    from dflash_chat.bench import compile_check

    cases = catalog_cases()
    if quick:  # the 27B's ffn_gate/up in its two files, both kernels, the 35B's experts and one glue kernel
        cases = [
            c
            for c in cases
            if c[0].startswith("qwen3.6-27b gate/up")
            or "experts 1024x2048 Q4_K" in c[0]
            or c[0] == "qwen3.6-27b add_rms_norm h=5120"
            or c[0] == "qwen3.6-27b attention verify d=256"
            or c[0] == "qwen3.6-27b attention prepare d=256"
            or c[0] == "qwen3.6-27b gdn prefill scan"
            or c[0] == "qwen3.6-27b gdn commit"
        ]
    start = time.perf_counter()
    print(
        f"{'arch':<6} {'kernel':<22} {'first case needing it':<44} registers, spilled bytes, global loads "
        "(count by width), main loop",
        flush=True,
    )
    reports = compile_check.compile_all(
        cases, arches, on_report=lambda r: print(compile_check.format_report(r), flush=True)
    )
    weight_kernels = ("_gemv_kernel", "_gemm_kernel", "_experts_gemv_kernel", "_experts_gemm_kernel", "_dequant_kernel")
    spilled = [r for r in reports if r.spill_bytes]
    narrow = [r for r in reports if r.kernel in weight_kernels and r.narrow_loads()]
    print(
        f"{len(reports)} kernel builds in {time.perf_counter() - start:.0f} s: {len(spilled)} spill, "
        f"{len(narrow)} quantized kernels with loads narrower than 32 bits"
    )
    return 1 if spilled or narrow else 0


def precompile(device: torch.device, n: int, k: int, dtype: torch.dtype) -> float:
    """Compile the kernels the check will launch, in parallel processes, before they run (Triton caches them;
    a build that fails here is simply built again by the JIT when it runs)."""
    import concurrent.futures
    import multiprocessing

    from dflash_chat.bench import compile_check
    from dflash_chat.engine.kernels import triton_quant

    start = time.perf_counter()
    fam = triton_quant._family(device)
    family = (fam.name, triton_quant._sms(device), fam.block_n, fam.programs_per_sm, fam.min_units_per_split)
    major, minor = torch.cuda.get_device_capability(device)
    cc = major * 10 + minor
    jobs, seen = [], set()
    for i, (_, run) in enumerate(_check_cases(n, k, dtype)):
        with compile_check.capture(configs.Family(*family)) as launches:
            run()
        for j, c in enumerate(launches):
            key = compile_check._key(c, f"sm_{cc}", cc)
            if key not in seen:
                seen.add(key)
                jobs.append((i, j))
    ctx = multiprocessing.get_context("spawn")  # the parent holds a CUDA context: no fork
    workers = min(16, os.cpu_count() or 4, len(jobs))
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(_precompile_job, i, j, n, k, str(dtype).split(".")[-1], family, cc) for i, j in jobs]
        for f in futures:
            try:
                f.result()
            except Exception as exc:  # noqa: BLE001
                print(f"precompile: {type(exc).__name__}: {exc}"[:300], file=sys.stderr)
    return time.perf_counter() - start


def _precompile_job(i: int, j: int, n: int, k: int, dtype: str, family: tuple, cc: int) -> None:
    from dflash_chat.bench import compile_check

    label, run = _check_cases(n, k, getattr(torch, dtype))[i]
    with compile_check.capture(configs.Family(*family)) as launches:
        run()
    compile_check.compile_one(launches[j], f"sm_{cc}", label, cc)


def _check_cases(n: int, k: int, dtype: torch.dtype) -> list:
    """The launches of the correctness section and the benchmark, as meta-tensor cases for precompile."""
    cases = []
    for fmt_name in QUANT_FORMATS:
        for dt in {dtype, torch.float16} if fmt_name == "Q4_K" else {dtype}:
            for m in M_VALUES:
                cases.append(matmul_case("check", fmt_name, n, k, m, dt))
        cases.append(dequant_case(fmt_name, n, k))
    for _, n2, k2, fmt_name in SHAPES_27B:
        for m in (1, 16):
            cases.append(matmul_case("bench", fmt_name, n2, k2, m, dtype))
    return cases


# --- main -------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes (Triton's interpreter when it is on)")
    ap.add_argument("--compile-only", action="store_true", help="compile for the GPU families, no GPU needed")
    ap.add_argument(
        "--arch",
        action="append",
        choices=["sm_86", "sm_89", "sm_90"],
        help="with --compile-only: the families to build for (default: all three)",
    )
    ap.add_argument("--quick", action="store_true", help="with --compile-only: a few configurations only")
    ap.add_argument("--sweep", action="store_true", help="also time a few launch configurations per shape")
    ap.add_argument("--no-sweep", action="store_true", help="no sweep (the default; kept for tools/gpu_run.sh)")
    ap.add_argument("--json", help="also write the report here")
    args = ap.parse_args(argv)
    if args.compile_only:
        return compile_only(args.arch or ["sm_86", "sm_89", "sm_90"], args.quick)
    if args.dry_run:
        device = torch.device("cpu")
        dtype = torch.float16  # (the interpreter's tl.dot mishandles bf16)
        shapes = [(name, n // 64, 512, f) for name, n, k, f in SHAPES_27B]
        n, k, n_layers = 64, 512, 1
        moe = dict(experts=4, top_k=2, hidden=256, width=256)  # (Q6_K rows of one block: the torch path)
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: run with --dry-run (CPU self-test) or --compile-only", file=sys.stderr)
            return 2
        device, dtype = torch.device("cuda"), torch.bfloat16
        shapes, n, k, n_layers, moe = SHAPES_27B, 256, 2048, 2, MOE_35B
    start = time.perf_counter()
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "triton": kernels.use_triton(torch.empty(0, device=device)),
        "dry_run": args.dry_run,
    }
    if device.type == "cuda" and report["triton"]:
        try:  # uses Triton internals (the JIT's specialisation): a Triton that differs only costs time
            report["precompile_s"] = precompile(device, n, k, dtype)
            print(f"precompiled in {report['precompile_s']:.0f} s", flush=True)
        except Exception as exc:  # noqa: BLE001
            report["precompile_error"] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"precompile skipped ({report['precompile_error']}); the JIT compiles as kernels run", flush=True)
    rows = check_matmuls(device, n, k, dtype)
    rows += check_experts(device, dtype, **(moe if args.dry_run else dict(experts=16, hidden=512, width=512, top_k=4)))
    rows += check_glue(device, dtype, hidden=shapes[0][2])
    # a kernel that failed its first-use check was replaced by the torch path: the comparison above would then
    # have checked the torch path against itself, so any disabled kernel is a failure here
    disabled = [" ".join(str(part) for part in key) for key, ok in first_use.checked.items() if not ok]
    report["correctness"] = {
        "all_ok": all(r["ok"] for r in rows) and not disabled,
        "disabled_kernels": disabled,
        "worst": max(rows, key=lambda r: r["rel_error"] / TOLERANCE[getattr(torch, r["dtype"])]),
        "failures": [r for r in rows if not r["ok"]],
        "checked": len(rows),
        "rows": rows,
    }
    print(f"correctness ({time.perf_counter() - start:.0f} s): all ok {report['correctness']['all_ok']}", flush=True)
    report["benchmark"] = benchmark(device, shapes, dtype, args.sweep and device.type == "cuda")
    print(f"benchmark ({time.perf_counter() - start:.0f} s)", flush=True)
    report["experts"] = benchmark_experts(device, dtype, moe["experts"], moe["hidden"], moe["width"], moe["top_k"])
    print(f"experts ({time.perf_counter() - start:.0f} s)", flush=True)
    report["resident"] = resident_bytes(device, shapes[:5], n_layers)
    b, r = report["benchmark"], report["resident"]
    report["goals"] = {
        "M1_frac_of_copy>=0.70": b["frac_of_copy_M1_overall"] >= 0.70,
        "M16_over_M1<=1.3": b["M16_over_M1_overall"] <= 1.3,
        "resident_within_5pct": abs(r["resident_over_file"] - 1) <= 0.05,
    }
    report["seconds"] = time.perf_counter() - start
    print_report(report)
    target = args.json or (os.path.join(os.environ["OUT"], "gpu_check.json") if os.environ.get("OUT") else None)
    if target:
        Path(target).write_text(json.dumps(report, indent=2, default=str))
    return 0 if report["correctness"]["all_ok"] else 1


def print_report(report: dict) -> None:
    c, b, r = report["correctness"], report["benchmark"], report["resident"]
    print(f"device: {report['device']}  triton: {report['triton']}  dry-run: {report['dry_run']}")
    w = c["worst"]
    print(
        f"correctness: {c['checked']} cases, all ok: {c['all_ok']}; worst (relative to its tolerance) "
        f"{w['what']} {w['format']} {w['dtype']} M={w['M']}: {w['rel_error']:.2e}"
    )
    for name in c["disabled_kernels"]:
        print(f"  DISABLED (fell back to torch): {name}")
    for f in c["failures"][:20]:
        print(f"  FAIL {f}")
    print(f"copy bandwidth: {b['copy_GBps']:.1f} GB/s")
    for row in b["layers"]:
        print(
            f"  {row['name']:<28} {row['format']:<5} {row['weight_MB']:8.1f} MB  M=1 {row['t_M1_us']:8.1f} us "
            f"{row['GBps_M1']:7.1f} GB/s ({row['frac_of_copy_M1']:.0%} of copy)  M=16/M=1 {row['M16_over_M1']:.2f}x"
            + (f"  [{row['launch_M1']}]" if "launch_M1" in row else "")
        )
        for s in row.get("sweep", []):
            timing = f"{s['us']:.1f} us ({s['frac_of_copy']:.0%})" if "us" in s else s["error"]
            print(f"      {s['launch']}: {timing}")
    print(
        f"overall: M=1 at {b['frac_of_copy_M1_overall']:.0%} of copy bandwidth (goal >= 70%), "
        f"M=16 takes {b['M16_over_M1_overall']:.2f}x M=1 (goal <= 1.3x)"
    )
    ex = report["experts"]
    print(f"routed experts ({ex['experts']} x {ex['width']}, top-{ex['top_k']}, hidden {ex['hidden']}):")
    for row in ex["rows"]:
        print(
            f"  {row['formats']:<10} M={row['M']:<3} {row['active_experts']:3d} experts  one launch "
            f"{row['t_grouped_us']:8.1f} us ({row['GBps_grouped']:.0f} GB/s)  per expert "
            f"{row['t_per_expert_us']:8.1f} us  -> {row['grouped_speedup']:.1f}x"
        )
    print(
        f"resident: {r['resident_bytes'] / 1e6:.1f} MB for a {r['file_bytes'] / 1e6:.1f} MB file "
        f"({r['resident_over_file']:.3f}x, goal within 5%)"
    )
    print(f"goals: {report['goals']}  ({report['seconds']:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
