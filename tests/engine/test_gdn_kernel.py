"""The GDN recurrence kernel (decode, verify outputs, masked commit) against the torch reference, under
Triton's interpreter in a child process (TRITON_INTERPRET must be set before triton is imported); and the
reference's masked commit against a plain run of the kept tokens."""

from __future__ import annotations

import pytest
import torch

from dflash_chat.engine.kernels import gdn
from tests.engine._gdn_check import HEADS, close, expected, inputs
from tests.engine.helpers import run_in_interpreter


@pytest.mark.slow(seconds=10)
def test_kernel_equals_the_reference_in_the_interpreter():
    assert "gdn kernel checks passed" in run_in_interpreter("_gdn_check.py", "GDN")


@pytest.mark.parametrize("keep", [1, 4, 9])
def test_a_masked_commit_runs_only_the_kept_tokens(keep):
    x, state = inputs(9, seed=keep)
    plain = state.clone()
    expected(x, plain, keep=keep)
    masked = state.clone()
    assert gdn.mix(*x, masked, HEADS, update=True, outputs=False, keep=torch.tensor(keep)) is None
    close(masked, plain)


@pytest.mark.parametrize("T", [2, 3, 4, 9, 16])
def test_a_commit_from_the_verifys_kept_solve_equals_running_only_the_kept_tokens(T):
    """On the CPU a speculative block's one-chunk solve is kept (a block of 2 or 3 tokens too, which mix would
    otherwise run token by token): its commit to any `keep` (0 leaves the state) equals the token-by-token
    recurrence over the kept tokens, without a second solve."""
    x, state = inputs(T, seed=T)
    solved: list = []
    gdn.mix(*x, state, HEADS, update=False, solved=solved)
    assert len(solved) == 1
    for keep in range(T + 1):
        plain = state.clone()
        if keep:
            expected(x, plain, keep=keep)
        fast = state.clone()
        solved[0].commit(fast, torch.tensor(keep))
        close(fast, plain, 1e-4)


def test_only_a_speculative_one_chunk_solve_is_kept():
    for T, update in ((1, False), (3, True), (16, True), (70, False)):  # one token, state updates, two chunks
        x, state = inputs(T, seed=T)
        solved: list = []
        gdn.mix(*x, state, HEADS, update=update, solved=solved)
        assert solved == []


@pytest.mark.parametrize("T", [2, 16, 70])
def test_every_torch_path_computes_the_recurrence(T):
    """mix's torch paths (token by token, one solve, chunks; update or not) against the token-by-token reference."""
    x, state = inputs(T, seed=T)
    want_state = state.clone()
    want = expected(x, want_state)
    kept = state.clone()
    close(gdn.mix(*x, kept, HEADS, update=False), want, 1e-4)
    assert torch.equal(kept, state)
    got_state = state.clone()
    close(gdn.mix(*x, got_state, HEADS, update=True), want, 1e-4)
    close(got_state, want_state, 1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_conv_is_conv1d_and_a_block_equals_its_tokens_one_at_a_time(dtype):
    """The CPU path's depthwise causal conv (windows times the weight) against conv1d's definition; and a
    block through conv_block gives what conv_step gives for its tokens in turn (to rounding: the sums over
    K run in another order for another shape)."""
    import torch.nn.functional as F

    from dflash_chat.engine.kernels import reference

    g = torch.Generator().manual_seed(0)
    C, K, T = 48, 4, 7
    weight = torch.randn(C, K, generator=g).to(dtype)
    state = torch.randn(K - 1, C, generator=g).to(dtype)
    x = torch.randn(T, C, generator=g).to(dtype)
    window = torch.cat((state, x))
    want = F.conv1d(window.float().t()[None], weight.float()[:, None, :], groups=C)[0].t().to(dtype)
    torch.testing.assert_close(reference.causal_conv(window, weight), want, rtol=1e-5, atol=1e-6)  # sum order

    block = reference.conv_block(
        x, state, weight, torch.zeros(K - 1 + T, C, dtype=dtype), torch.zeros(T, C, dtype=dtype)
    )
    rolling = state.clone()
    one_by_one = torch.stack([reference.conv_step(x[t], rolling, weight) for t in range(T)])
    torch.testing.assert_close(block, one_by_one, **({} if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-6)))
    assert torch.equal(rolling, x[T - K + 1 :])  # the steps shifted the state to the block's last K-1 rows
