"""Run under TRITON_INTERPRET=1 by test_attention_kernel.py: the cache attention kernel vs SDPA."""

from __future__ import annotations

import contextlib
import os

import torch

from dflash_chat.engine.kernels import attention as kernel
from dflash_chat.engine.kernels import switches
from dflash_chat.engine.models.attention import attend_cache
from dflash_chat.engine.models.span import Span

CASES = [  # (rows allocated, used length end, T new rows, heads, kv heads, head dim, causal, window)
    (1100, 700, 1, 4, 2, 32, True, None),  # decode, two chunks used of three
    (1100, 530, 16, 6, 2, 32, True, None),  # verify: 16 rows * 3 heads per KV head, across a chunk edge
    (600, 40, 16, 4, 1, 16, False, None),  # the drafter's block: non-causal
    (1200, 1100, 16, 4, 2, 16, False, 300),  # windowed drafter layer: early chunks skipped
    (1200, 1100, 4, 4, 4, 16, True, 200),  # causal and windowed
    (600, 300, 16, 4, 2, 16, False, 5),  # a window narrower than the block: keys past the query drop out too
    (600, 300, 16, 4, 2, 16, True, 5),  # the drafter's causal sliding layer, a window narrower than the block
]


@contextlib.contextmanager
def torch_path():
    """attend_cache's torch reference (under the interpreter attend_cache itself would pick the kernel)."""
    os.environ["DFLASH_CHAT_NO_TRITON_ATTENTION"] = "1"
    switches.reload()
    try:
        yield
    finally:
        del os.environ["DFLASH_CHAT_NO_TRITON_ATTENTION"]
        switches.reload()


def check_gate(dtype):
    """The output gate applied in the merge kernel: o * sigmoid(gate), rounded as the torch path rounds."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(*s, generator=g).to(dtype) for s in ((3, 4, 32), (700, 2, 32), (700, 2, 32)))
    gate = torch.randn(3, 4 * 32, generator=g).to(dtype)
    span = Span.fixed(torch.tensor(697), torch.arange(3), 700)
    with torch_path():
        want = attend_cache(q.float(), k.float(), v.float(), span, 0.2).to(dtype) * torch.sigmoid(gate)
    got = kernel.attend(q, k, v, span.pos, span.end, 0.2, True, None, gate)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def check(alloc, end, T, heads, kv_heads, d, causal, window, dtype=torch.float32):
    g = torch.Generator().manual_seed(alloc + end + T)
    q = torch.randn(T, heads, d, generator=g).to(dtype)
    k = torch.randn(alloc, kv_heads, d, generator=g).to(dtype)
    v = torch.randn(alloc, kv_heads, d, generator=g).to(dtype)
    k[end:] = float("nan")  # rows past the used length must never be read
    v[end:] = float("nan")
    span = Span.fixed(torch.tensor(end - T), torch.arange(T), alloc)
    got = kernel.attend(q, k, v, span.pos, span.end, d**-0.5, causal, window)
    with torch_path():
        want = attend_cache(
            q.float(),
            k[:end].float(),
            v[:end].float(),
            Span.eager(end - T, T, q.device),
            d**-0.5,
            causal=causal,
            window=window,
        )
    assert got.dtype == dtype and not got.isnan().any(), (alloc, end, T)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


def check_ring(rows, end, T, window, causal):
    """A sliding layer's ring of `rows` rows (position j in row j mod rows) against the full cache."""
    g = torch.Generator().manual_seed(end)
    q = torch.randn(T, 4, 16, generator=g)
    full_k, full_v = torch.randn(end, 2, 16, generator=g), torch.randn(end, 2, 16, generator=g)
    ring_k, ring_v = torch.full((rows, 2, 16), float("nan")), torch.full((rows, 2, 16), float("nan"))
    held = torch.arange(end - rows, end)
    ring_k[held % rows], ring_v[held % rows] = full_k[held], full_v[held]
    span = Span.fixed(torch.tensor(end - T), torch.arange(T), end + 64)  # the allocated context is longer
    with torch_path():
        want = attend_cache(q, full_k, full_v, Span.eager(end - T, T, q.device), 0.25, causal=causal, window=window)
        ring = attend_cache(q, ring_k.nan_to_num(), ring_v.nan_to_num(), span, 0.25, causal=causal, window=window)
    for got in (kernel.attend(q, ring_k, ring_v, span.pos, span.end, 0.25, causal, window), ring):
        assert not got.isnan().any()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def check_prepare(gated, zero_centred, head_dim, rotary_dim, rows, dtype=torch.float32):
    """The fused norm + RoPE + cache-write kernel against the projections' torch path."""
    from dflash_chat.engine.models.attention import Projections
    from dflash_chat.engine.models.layers import Rotary

    torch.manual_seed(head_dim + rows)
    attn = Projections(32, 4, 2, head_dim, 1e-6, zero_centred, gated).to(dtype)
    with torch.no_grad():
        for norm in (attn.q_norm, attn.k_norm):
            norm.weight.normal_(0, 0.3)
    rotary = Rotary(rotary_dim, 10000.0)
    rotary.allocate(200, dtype)
    x = torch.randn(5, 32).to(dtype)
    pos = torch.tensor([60, 61, 62, 63, 64])
    cos, sin = rotary.at(pos, dtype)
    caches = [
        (torch.zeros(rows, 2, head_dim, dtype=dtype), torch.zeros(rows, 2, head_dim, dtype=dtype)) for _ in range(2)
    ]
    with torch.no_grad():
        for queries in (True, False):
            with torch_path():
                want = attn.into_cache(x, cos, sin, pos, *caches[0], queries=queries)
            got = attn.into_cache(x, cos, sin, pos, *caches[1], queries=queries)
            tol = 1e-5 if dtype == torch.float32 else 1e-2
            for a, b in zip(got, want, strict=True):
                if b is None:
                    assert a is None
                else:
                    torch.testing.assert_close(a.reshape(b.shape), b, rtol=tol, atol=tol)
            for a, b in zip(caches[1], caches[0], strict=True):
                torch.testing.assert_close(a, b, rtol=tol, atol=tol)


if __name__ == "__main__":
    assert kernel.available(torch.empty(0)), "the kernel must be selected under the interpreter"
    for case in CASES:
        check(*case)
    check(*CASES[1], dtype=torch.float16)
    check_ring(rows=300 + 16, end=1700, T=16, window=300, causal=False)  # the drafter's sliding layers
    check_ring(rows=40 + 16, end=90, T=16, window=40, causal=False)
    check_ring(rows=300 + 16, end=1700, T=16, window=300, causal=True)  # sliding layers as the drafters declare none
    check_ring(rows=6 + 16, end=90, T=16, window=6, causal=True)  # a window narrower than the block
    check_ring(rows=6 + 16, end=90, T=16, window=6, causal=False)
    check_gate(torch.float32)
    check_gate(torch.float16)
    check_prepare(gated=True, zero_centred=True, head_dim=64, rotary_dim=16, rows=100)  # a Qwen3.5/3.6 target layer
    check_prepare(gated=False, zero_centred=False, head_dim=32, rotary_dim=32, rows=8)  # a drafter's sliding ring
    check_prepare(gated=True, zero_centred=True, head_dim=64, rotary_dim=16, rows=100, dtype=torch.float16)
    print("attention kernel checks passed")
