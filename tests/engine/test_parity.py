"""Our target models against transformers' own classes on the same safetensors."""

import pytest
import torch

from dflash_chat.engine.load import load_target
from tests.engine.conftest import ARCHS

TOL = 1e-4


@pytest.fixture(params=ARCHS)
def pair(request, tiny_dirs):
    target_dir, _, hf = tiny_dirs[request.param]
    return load_target(target_dir, "cpu", torch.float32), hf


def _reference(hf, ids):
    with torch.no_grad():
        out = hf(ids[None], output_hidden_states=True)
    return out.logits[0], out.hidden_states


def test_full_forward_matches_transformers(pair):
    ours, hf = pair
    ids = torch.randint(0, hf.config.vocab_size, (48,), generator=torch.Generator().manual_seed(1))
    ref, _ = _reference(hf, ids)
    logits, _ = ours(ids, ours.new_state(64), logits="all")
    assert (logits - ref).abs().max().item() <= TOL


def test_incremental_forward_matches_transformers(pair):
    """Prefill, then one token, then a 16-token block, against one full forward."""
    ours, hf = pair
    ids = torch.randint(0, hf.config.vocab_size, (37,), generator=torch.Generator().manual_seed(2))
    ref, _ = _reference(hf, ids)
    state = ours.new_state(64)
    parts = [ours(chunk, state, logits="all")[0] for chunk in (ids[:20], ids[20:21], ids[21:37])]
    assert state.length == 37
    assert (torch.cat(parts) - ref).abs().max().item() <= TOL


def test_context_features_are_the_tapped_hidden_states(pair):
    ours, hf = pair
    ids = torch.randint(0, hf.config.vocab_size, (12,), generator=torch.Generator().manual_seed(3))
    _, hidden = _reference(hf, ids)
    taps = [0, 2]
    _, feats = ours(ids, ours.new_state(16), logits=None, taps=taps)
    expected = torch.cat([hidden[i + 1][0] for i in taps], dim=-1)
    assert feats.shape == expected.shape
    assert (feats - expected).abs().max().item() <= TOL


def test_precomputed_rotary_tables_equal_the_formula():
    from dflash_chat.engine.models.layers import Rotary

    rotary = Rotary(16, 10000.0)
    rotary.allocate(300, torch.bfloat16)
    for positions in (torch.arange(0, 1), torch.arange(5, 21), torch.arange(283, 300), torch.tensor([7, 3, 299])):
        got = rotary.at(positions, torch.bfloat16)
        want = rotary.cos_sin(positions, torch.bfloat16)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # in another dtype it computes them
    assert torch.equal(
        rotary.at(torch.arange(9, 20), torch.float32)[1], rotary.cos_sin(torch.arange(9, 20), torch.float32)[1]
    )
