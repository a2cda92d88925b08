"""Run under TRITON_INTERPRET=1 by test_gdn_kernel.py: the GDN recurrence kernel vs the torch reference."""

from __future__ import annotations

import torch

from dflash_chat.engine.kernels import gdn

HEADS = gdn.Heads(key_heads=2, value_heads=4, key_dim=16, value_dim=64)


def inputs(T, heads=HEADS, seed=0, dtype=torch.float32):
    """(conv output, b, a, A_log, dt_bias) and a state."""
    g = torch.Generator().manual_seed(seed)
    width = 2 * heads.key_total + heads.value_heads * heads.value_dim
    qkv = torch.randn(T, width, generator=g).to(dtype)
    b, a = (
        torch.randn(T, heads.value_heads, generator=g).to(dtype),
        torch.randn(T, heads.value_heads, generator=g).to(dtype),
    )
    a_log, dt_bias = torch.rand(heads.value_heads, generator=g) - 0.5, torch.rand(heads.value_heads, generator=g)
    state = torch.randn(heads.value_heads, heads.key_dim, heads.value_dim, generator=g)
    return (qkv, b, a, a_log, dt_bias), state


def expected(x, state, keep=None, update=True):
    """The torch reference, token by token on prepared inputs."""
    prepared = gdn.prepare(*x, HEADS)
    if keep is not None:
        prepared = tuple(t[:keep] for t in prepared)
    return gdn.reference(*prepared, state, update=update)


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


if __name__ == "__main__":
    assert gdn.available(torch.empty(0)), "the kernel must be selected under the interpreter"
    for T, dtype in ((1, torch.float32), (16, torch.float32), (5, torch.float16)):
        x, state = inputs(T, dtype=dtype, seed=T)
        tol = 1e-5 if dtype == torch.float32 else 1e-3
        # decode / prefill: outputs and the state written
        want_state = state.clone()
        want = expected(x, want_state)
        got_state = state.clone()
        close(gdn.mix(*x, got_state, HEADS, update=True), want, tol)
        close(got_state, want_state, tol)
        # outputs rounded by the kernel to the model's dtype, as a cast of the fp32 outputs would round them
        rounded = gdn.mix(*x, state.clone(), HEADS, update=True, out_dtype=dtype)
        assert rounded.dtype == dtype
        close(rounded.float(), want.to(dtype).float(), tol)
        # verify: outputs, the state left as it was
        kept = state.clone()
        close(gdn.mix(*x, kept, HEADS, update=False), want, tol)
        assert torch.equal(kept, state)
        # commit: the first `keep` tokens only, keep on the device
        for keep in sorted({1, T // 2 or 1, T}):
            want_state = state.clone()
            expected(x, want_state, keep=keep)
            got_state = state.clone()
            assert gdn.mix(*x, got_state, HEADS, update=True, outputs=False, keep=torch.tensor(keep)) is None
            close(got_state, want_state, tol)
    # prefill: the chunked form, its state pass in the scan kernel (a padded last chunk)
    x, state = inputs(gdn.PREFILL_TOKENS + 9, seed=7)
    want_state = state.clone()
    want = expected(x, want_state)
    got_state = state.clone()
    close(gdn.mix(*x, got_state, HEADS, update=True), want, 1e-4)
    close(got_state, want_state, 1e-4)
    # b and a as columns of one fused projection (strided, not copied)
    (qkv, b, a, a_log, dt), state = inputs(3, seed=4)
    ba = torch.cat((b, a), dim=1)
    close(
        gdn.mix(qkv, ba[:, :4], ba[:, 4:], a_log, dt, state.clone(), HEADS, update=True),
        expected((qkv, b, a, a_log, dt), state.clone()),
    )
    print("gdn kernel checks passed")
