"""GDN rollback: the one-chunk closed form against the token-by-token recurrence, a single layer's commit
against running only the kept tokens for every block length, and the recurrence kernel's masked commit."""

import pytest
import torch

from dflash_chat.engine.kernels.gdn import CHUNK, chunked, reference
from dflash_chat.engine.models.config import TargetConfig
from dflash_chat.engine.models.gdn import GatedDeltaNet


def recurrence(q, k, v, g, beta, state):
    return reference(q, k, v, g, beta, state, update=True)


H, K, V = 3, 8, 6


def _inputs(T: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(T, H, K, generator=gen), dim=-1) * K**-0.5
    k = torch.nn.functional.normalize(torch.randn(T, H, K, generator=gen), dim=-1)
    v = torch.randn(T, H, V, generator=gen)
    g = -torch.rand(T, H, generator=gen) * 0.5
    beta = torch.rand(T, H, generator=gen)
    state = torch.randn(H, K, V, generator=gen)
    return (q, k, v, g, beta), state


@pytest.mark.parametrize(("T", "chunk"), [(1, 4), (7, 4), (16, 16), (45, 8), (64, 64), (130, 64)])
def test_the_chunked_recurrence_equals_the_token_by_token_one(T, chunk):
    """Every chunk's triangular system solved at once, then one pass carrying the state: the same outputs and
    the same final state as running the tokens one by one, for padded last chunks too."""
    inputs, start = _inputs(T, seed=T)
    stepped = start.clone()
    want = recurrence(*inputs, stepped)
    got_state = start.clone()
    got = chunked(*inputs, got_state, chunk)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_state, stepped, atol=1e-5, rtol=1e-5)


def _layer(dtype) -> GatedDeltaNet:
    cfg = TargetConfig(
        arch="qwen3_5", vocab_size=16, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
        intermediate_size=64, rms_norm_eps=1e-6, rope_theta=1e6, partial_rotary_factor=0.25,
        layer_types=["linear_attention"], linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=8,
    )  # fmt: skip
    torch.manual_seed(0)
    layer = GatedDeltaNet(cfg)
    with torch.no_grad():
        layer.A_log.uniform_(-1, 1)
        layer.dt_bias.uniform_(-1, 1)
    return layer.to(dtype)


def _rolled_back_and_plain(layer, dtype, T: int, keep: int):
    """(cache after a speculative T-token block committed to `keep`, cache after only the kept tokens)."""
    gen = torch.Generator().manual_seed(T)
    prefix, block = (torch.randn(n, 32, generator=gen).to(dtype) for n in (5, T))
    spec = layer.new_cache("cpu", dtype)
    plain = layer.new_cache("cpu", dtype)
    with torch.no_grad():
        for cache in (spec, plain):
            layer(prefix, cache)
        layer(block, spec, speculative=True)
        layer.commit(spec, torch.tensor(keep))
        if keep:
            layer(block[:keep], plain)
    return spec, plain


@pytest.mark.parametrize("T", [1, 3, 5, 16, CHUNK, CHUNK + 6])
def test_layer_rollback_equals_running_only_the_kept_tokens(T):
    layer = _layer(torch.float32)
    keeps = sorted({0, 1, 2, 3, 4, T // 2, CHUNK - 1, CHUNK, CHUNK + 1, T - 1, T} & set(range(T + 1)))
    for keep in keeps:
        spec, plain = _rolled_back_and_plain(layer, torch.float32, T, keep)
        torch.testing.assert_close(spec.recurrent, plain.recurrent, atol=1e-5, rtol=0)
        torch.testing.assert_close(spec.conv, plain.conv, atol=1e-5, rtol=0)


def test_speculative_forward_leaves_the_state_as_it_was():
    layer = _layer(torch.float32)
    cache = layer.new_cache("cpu", torch.float32, block=16)
    with torch.no_grad():
        layer(torch.randn(5, 32), cache)
        before = (cache.recurrent.clone(), cache.conv.clone())
        layer(torch.randn(16, 32), cache, speculative=True)
    assert torch.equal(cache.recurrent, before[0]) and torch.equal(cache.conv, before[1])


def test_bf16_layer_rollback_stays_close_to_running_only_the_kept_tokens():
    # bf16 projections and conv feed an fp32 recurrence and the closed form adds only fp32 rounding; the
    # kept tokens' projections may round differently in a shorter batch, so allow one bf16 ulp (2^-8) of
    # the state's scale.
    layer = _layer(torch.bfloat16)
    for keep in range(1, 17):
        spec, plain = _rolled_back_and_plain(layer, torch.bfloat16, 16, keep)
        scale = plain.recurrent.abs().max().item()
        torch.testing.assert_close(spec.recurrent, plain.recurrent, atol=2**-8 * scale, rtol=0)
        torch.testing.assert_close(spec.conv, plain.conv, atol=1e-3, rtol=2**-7)
