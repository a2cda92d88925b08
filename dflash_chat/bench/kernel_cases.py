"""The launches the engine makes for the catalog's models, as meta-tensor cases that compile_check builds.

A case is (label, run): run() calls the real host code of a kernel module on meta tensors (shapes and dtypes,
no memory), so under `compile_check.capture` every launch it would make is recorded with its exact arguments.
`catalog_cases` covers every configuration the engine picks for the shipped catalog's targets;
tools/gpu_check.py builds them for the GPU families (--compile-only) and, on a GPU, ahead of its checks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from dflash_chat.engine.ggml.formats import FORMATS
from dflash_chat.engine.kernels import configs
from dflash_chat.engine.kernels.pairs import Pairs

# Qwen3.6-35B-A3B's routed layer (docs/ARCHITECTURE.md, Targets and rollback)
MOE_35B = dict(experts=256, top_k=8, hidden=2048, width=512)


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def matmul_case(label: str, fmt_name: str, n: int, k: int, m: int, dtype=torch.bfloat16):
    from dflash_chat.engine.kernels import triton_quant as tq

    fmt = FORMATS[fmt_name]

    def run():
        tq.matmul_small_m(meta(m, k, dtype=dtype), meta(n, fmt.row_bytes(k), dtype=torch.uint8), fmt, n)

    return (f"{label} {fmt_name} M={m}", run)


def experts_case(label: str, fmt_name: str, experts: int, n: int, k: int, tokens: int, top_k: int):
    from dflash_chat.engine.kernels import triton_quant as tq

    fmt = FORMATS[fmt_name]

    def run():
        pairs = tokens * top_k
        packed = meta(
            experts,
            n,
            fmt.row_bytes(k) if fmt.quantized else k,
            dtype=torch.uint8 if fmt.quantized else fmt.float_dtype,
        )
        src, dst, expert_of = (meta(pairs, dtype=torch.int32) for _ in range(3))
        routed = Pairs(src, dst, meta(experts + 1, dtype=torch.int32), expert_of)
        tq.moe_matmul(meta(tokens, k), packed, fmt, n, routed, tokens=tokens)

    return (f"{label} {fmt_name} tokens={tokens}", run)


def dequant_case(fmt_name: str, n: int, k: int):
    from dflash_chat.engine.kernels import triton_quant as tq

    fmt = FORMATS[fmt_name]
    return (
        f"dequantize {fmt_name} {n}x{k}",
        lambda: tq.dequantize(meta(n, fmt.row_bytes(k), dtype=torch.uint8), fmt, k, torch.bfloat16),
    )


def glue_cases(label: str, hidden: int, width: int, conv: int, head_dim: int) -> list:
    from dflash_chat.engine.kernels import triton_glue as tg

    return [
        (
            f"{label} add_rms_norm h={hidden}",
            lambda: (
                tg.add_rms_norm(meta(16, hidden), meta(16, hidden), meta(hidden), 1e-6, True),
                tg.rms_norm(meta(16, hidden), meta(hidden), 1e-6, False),
            ),
        ),
        (f"{label} silu_mul {width}", lambda: tg.silu_mul(meta(16, width), meta(16, width))),
        (
            f"{label} gated_rms_norm d={head_dim}",
            lambda: tg.gated_rms_norm(meta(16, 8, head_dim), meta(16, 8, head_dim), meta(head_dim), 1e-6),
        ),
        (f"{label} conv_step C={conv}", lambda: tg.conv_step(meta(conv), meta(3, conv), meta(conv, 4))),
        (
            f"{label} conv_block C={conv}",
            lambda: tg.conv_block(
                meta(16, conv + 64)[:, :conv], meta(3, conv), meta(conv, 4), meta(19, conv), meta(16, conv)
            ),
        ),
    ]


def attention_cases(label: str, heads: int, kv_heads: int, head_dim: int, context: int = 32768) -> list:
    """The cache attention kernels at a model's shapes: decode (1 row), verify (16 rows, causal) and the
    drafter's block (16 rows): a sliding ring causal (the released drafters' default) or bidirectional (a
    checkpoint or GGUF saying not causal), a full layer bidirectional."""
    from dflash_chat.engine.kernels import attention

    def run(T, causal, window, rows):
        pos = meta(T, dtype=torch.int64)
        cache = meta(rows, kv_heads, head_dim)
        attention.attend(
            meta(T, heads, head_dim),
            cache,
            cache,
            pos,
            meta(1, dtype=torch.int64),
            head_dim**-0.5,
            causal,
            window,
            meta(T, heads * head_dim) if causal else None,
        )

    def prepare(T, gated, rotary_dim, rows):
        cache = meta(rows, kv_heads, head_dim)
        kv = meta(T, kv_heads * head_dim)
        attention.prepare(
            meta(T, heads * head_dim * (2 if gated else 1)),
            kv,
            kv,
            meta(head_dim),
            meta(head_dim),
            1e-6,
            gated,
            meta(T, rotary_dim),
            meta(T, rotary_dim),
            meta(T, dtype=torch.int64),
            cache,
            cache,
            heads,
            gated,
        )

    return [
        (
            f"{label} attention prepare d={head_dim}",
            lambda: prepare(16, head_dim == 256, head_dim // 4 if head_dim == 256 else head_dim, context + 16),
        ),
        (f"{label} attention decode d={head_dim}", lambda: run(1, True, None, context + 16)),
        (f"{label} attention verify d={head_dim}", lambda: run(16, True, None, context + 16)),
        (f"{label} attention draft ring d={head_dim}", lambda: run(16, False, 2048, 2048 + 16)),
        (f"{label} attention draft causal ring d={head_dim}", lambda: run(16, True, 2048, 2048 + 16)),
        (f"{label} attention draft full d={head_dim}", lambda: run(16, False, None, context + 16)),
    ]


def gdn_cases(label: str, key_heads: int, value_heads: int, key_dim: int, value_dim: int) -> list:
    """The GDN recurrence kernel: decode (update), verify (outputs only) and the masked commit."""
    from dflash_chat.engine.kernels import gdn

    heads = gdn.Heads(key_heads, value_heads, key_dim, value_dim)

    def run(T, update, outputs, keep):
        f32 = torch.float32
        width = 2 * key_heads * key_dim + value_heads * value_dim
        gdn._triton(
            meta(T, width),
            meta(T, value_heads),
            meta(T, value_heads),
            meta(value_heads, dtype=f32),
            meta(value_heads, dtype=f32),
            meta(value_heads, key_dim, value_dim, dtype=f32),
            heads,
            update,
            outputs,
            meta((), dtype=torch.int64) if keep else None,
        )

    def scan():
        n, c, f32 = 16, gdn.CHUNK, torch.float32
        q, k, w, u, attn = (meta(value_heads, n, c, d, dtype=f32) for d in (key_dim, key_dim, key_dim, value_dim, c))
        gdn._triton_scan(
            gdn.Chunks(q, k, w, u, attn, meta(value_heads, n, dtype=f32), n * c),
            meta(value_heads, key_dim, value_dim, dtype=f32),
        )

    return [
        (f"{label} gdn prefill scan", scan),
        (f"{label} gdn decode", lambda: run(1, True, True, False)),
        (f"{label} gdn verify", lambda: run(16, False, True, False)),
        (f"{label} gdn commit", lambda: run(16, True, False, True)),
    ]


def moe_glue_cases(label: str, experts: int, top_k: int, hidden: int) -> list:
    from dflash_chat.engine.kernels import triton_glue as tg

    cases: list[tuple[str, Callable[..., object]]] = []
    for tokens in (1, 16):  # decode and verify
        pairs = tokens * top_k
        cases += [
            (
                f"{label} router top-k of {experts} T={tokens}",
                lambda t=tokens: tg.top_k_softmax(meta(t, experts + 1)[:, :experts], top_k, torch.bfloat16),
            ),
            (f"{label} route {pairs} pairs", lambda t=tokens: tg.route(meta(t, top_k, dtype=torch.int64), experts)),
            (
                f"{label} experts' sum + shared T={tokens}",
                lambda t=tokens, p=pairs: tg.moe_combine(
                    meta(p, hidden),
                    meta(t, top_k),
                    (meta(t, hidden), meta(t, experts + 1)[:, experts:]),
                    torch.bfloat16,
                ),
            ),
        ]
    return cases


def catalog_cases() -> list:
    """Every kernel configuration the engine picks for the shipped catalog's targets (Q4_K_M and Q8_0 files,
    bf16 activations, decode M=1 and verify M=16), the other formats at one shape, routed experts at the
    35B-A3B's shapes, dequantize and the glue kernels. The attention q/o projections are left out: the catalog
    does not record the query head count (they compile like the other projections of the same K)."""
    from dflash_chat.models import catalog

    cases = []
    for pair in catalog.load_catalog(Path(os.devnull)).pairs:
        s = pair.target_shape
        value = s.linear_value_heads * s.linear_value_dim
        qkv = 2 * s.linear_key_heads * s.linear_key_dim + value
        moe = "a3b" in pair.name
        width = MOE_35B["width"] if moe else s.intermediate
        shapes = [
            ("qkv", qkv, s.hidden),
            ("z", value, s.hidden),
            ("a/b", s.linear_value_heads, s.hidden),
            ("out", s.hidden, value),
            ("k/v", s.kv_heads * s.head_dim, s.hidden),
            ("gate/up", width, s.hidden),
            ("down", s.hidden, width),
            ("lm_head", s.vocab, s.hidden),
        ]
        for part, n, k in shapes:
            bumped = part in ("down", "lm_head", "k/v")  # Q4_K_M: Q6_K for output, ffn_down and attn_v (some layers)
            for fmt_name in ("Q4_K", "Q6_K", "Q8_0") if bumped else ("Q4_K", "Q8_0"):
                for m in (1, 16):
                    cases.append(matmul_case(f"{pair.name} {part} {n}x{k}", fmt_name, n, k, m))
        if moe:
            e, top_k, h, w = MOE_35B["experts"], MOE_35B["top_k"], MOE_35B["hidden"], MOE_35B["width"]
            for fmt_name, n, k in (
                ("Q4_K", 2 * w, h),
                ("Q6_K", h, w),
                ("Q8_0", 2 * w, h),
                ("Q8_0", h, w),
                ("BF16", 2 * w, h),
                ("BF16", h, w),
            ):
                for tokens in (1, 16):
                    cases.append(experts_case(f"{pair.name} experts {n}x{k}", fmt_name, e, n, k, tokens, top_k))
            cases += moe_glue_cases(pair.name, e, top_k, h)
        cases += glue_cases(pair.name, s.hidden, width, qkv, s.linear_value_dim)
        cases += attention_cases(pair.name, s.kv_heads * 6, s.kv_heads, s.head_dim)  # 6 query heads per KV head
        cases += gdn_cases(pair.name, s.linear_key_heads, s.linear_value_heads, s.linear_key_dim, s.linear_value_dim)
        for version, d in pair.drafter_versions:
            cases += attention_cases(f"{pair.name} drafter {version}", d.kv_heads * 4, d.kv_heads, d.head_dim)
    for fmt_name in configs.TILINGS:
        if fmt_name not in ("Q4_K", "Q6_K", "Q8_0"):
            for m in (1, 16):
                cases.append(matmul_case("27b ffn_gate 17408x5120", fmt_name, 17408, 5120, m))
        cases.append(dequant_case(fmt_name, 5120, 17408))
    return cases
