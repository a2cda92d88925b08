"""Run under TRITON_INTERPRET=1 by test_gdn_kernel.py: the GDN recurrence kernel vs the torch reference."""

from __future__ import annotations

import torch

from dflash_chat.engine.kernels import gdn


def inputs(T, Hk=2, H=4, K=16, V=64, seed=0, v_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(T, Hk, K, generator=g), dim=-1) * K**-0.5
    k = torch.nn.functional.normalize(torch.randn(T, Hk, K, generator=g), dim=-1)
    v = torch.randn(T, H, V, generator=g).to(v_dtype)
    decay = -torch.rand(T, H, generator=g) * 0.5
    beta = torch.rand(T, H, generator=g)
    state = torch.randn(H, K, V, generator=g)
    return (q, k, v, decay, beta), state


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    assert gdn.available(torch.empty(0)), "the kernel must be selected under the interpreter"
    for T, v_dtype in ((1, torch.float32), (16, torch.float32), (5, torch.float16)):
        x, state = inputs(T, v_dtype=v_dtype, seed=T)
        # decode / prefill: outputs and the state written
        want_state = state.clone()
        want = gdn.reference(*x, want_state, update=True)
        got_state = state.clone()
        close(gdn.recurrent(*x, got_state, update=True), want)
        close(got_state, want_state)
        # verify: outputs, the state left as it was
        kept = state.clone()
        close(gdn.recurrent(*x, kept, update=False), want)
        assert torch.equal(kept, state)
        # commit: the first `keep` tokens only, keep on the device
        for keep in sorted({1, T // 2 or 1, T}):
            want_state = state.clone()
            gdn.reference(*(t[:keep] for t in x), want_state, update=True, outputs=False)
            got_state = state.clone()
            assert gdn.recurrent(*x, got_state, update=True, outputs=False, keep=torch.tensor(keep)) is None
            close(got_state, want_state)
    print("gdn kernel checks passed")
