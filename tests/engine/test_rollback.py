"""After a verify that keeps k tokens, the state equals the state after running only those k tokens."""

import pytest
import torch

from dflash_chat.engine.load import load_target
from dflash_chat.engine.state import AttentionCache, GDNCache
from tests.engine.conftest import ARCHS

ATOL = 1e-5


def _assert_states_equal(a, b):
    assert a.length == b.length
    for ca, cb in zip(a.layers, b.layers, strict=True):
        if isinstance(ca, GDNCache):
            torch.testing.assert_close(ca.recurrent, cb.recurrent, atol=ATOL, rtol=0)
            torch.testing.assert_close(ca.conv, cb.conv, atol=ATOL, rtol=0)
        else:
            assert isinstance(ca, AttentionCache)
            torch.testing.assert_close(ca.k[: a.length], cb.k[: b.length], atol=ATOL, rtol=0)
            torch.testing.assert_close(ca.v[: a.length], cb.v[: b.length], atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_rollback_equals_running_only_the_kept_tokens(arch, tiny_dirs):
    target_dir, _, _ = tiny_dirs[arch]
    model = load_target(target_dir, "cpu", torch.float32)
    gen = torch.Generator().manual_seed(4)
    prefix = torch.randint(0, model.cfg.vocab_size, (11,), generator=gen)
    block = torch.randint(0, model.cfg.vocab_size, (16,), generator=gen)
    probe = torch.randint(0, model.cfg.vocab_size, (3,), generator=gen)
    for keep in range(0, 17):
        spec = model.new_state(64)
        model(prefix, spec, logits=None)
        model(block, spec, logits="all", speculative=True)
        model.rollback(spec, keep)

        plain = model.new_state(64)
        model(prefix, plain, logits=None)
        if keep:
            model(block[:keep], plain, logits=None)
        _assert_states_equal(spec, plain)
        # and the states behave the same from here on
        after_spec, _ = model(probe, spec, logits="all")
        after_plain, _ = model(probe, plain, logits="all")
        torch.testing.assert_close(after_spec, after_plain, atol=1e-4, rtol=0)


def test_rollback_needs_a_speculative_forward(tiny_dirs):
    model = load_target(tiny_dirs["qwen3_5"][0], "cpu", torch.float32)
    state = model.new_state(16)
    model(torch.tensor([1, 2, 3]), state, logits=None)
    with pytest.raises(RuntimeError):
        model.rollback(state, 1)
