"""Kernels per layer at decode, with the GPU's kernel choices, counted without a GPU (bench/launch_count.py):
the goal of at most 12 per dense layer, every step free of host reads, and the counting itself."""

from __future__ import annotations

import pytest
import torch

from dflash_chat.bench import launch_count

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def dense():
    return launch_count.count_steps("qwen3.6-27b", layers=2)  # a GDN layer and an attention layer


def test_a_dense_layer_takes_at_most_12_kernels_at_decode(dense):
    kinds = dense.by_kind(dense.decode)
    assert set(kinds) == {"linear_attention", "full_attention"}
    assert all(n <= 12 for n in kinds.values()), kinds
    for layer in dense.decode.layers:  # every piece in a kernel of ours: no torch fallback, no stray cast
        assert all(name.startswith("triton:") for name in layer), dict(layer)
    gdn, attention = dense.decode.layers
    assert gdn["triton:recurrent_kernel"] == 1 and "triton:_reduce_kernel" not in gdn  # split-K finishes in place
    assert attention["triton:partial_kernel"] == attention["triton:merge_kernel"] == 1


def test_a_verify_block_takes_at_most_12_kernels_per_layer(dense):
    """The block's conv and what the commit needs are written by one kernel; no torch op is left in a layer
    but the copies of the two gate projections the commit re-reads."""
    assert all(n <= 12 for n in dense.by_kind(dense.verify).values()), dense.by_kind(dense.verify)
    gdn, attention = dense.verify.layers
    assert gdn["triton:_conv_block_kernel"] == 1 and gdn["triton:_gated_norm_kernel"] == 1
    assert {name for name in gdn if not name.startswith("triton:")} == {"copy_"}


def test_no_step_reads_a_value_back_and_the_commit_is_three_kernels_per_gdn_layer(dense):
    for tally in (dense.decode, dense.verify, dense.commit, dense.draft):
        assert tally.host_reads == 0 and tally.total > 0
    assert dense.commit.total == 3 * dense.layer_types.count("linear_attention")


def test_the_count_sees_torch_operators_and_launches_and_skips_views():
    layer = torch.nn.Linear(8, 8)

    def call():
        x = torch.randn(2, 8)
        y = layer(x).view(16).reshape(2, 8)[0]  # views: free
        torch.empty(3)  # an allocation: free
        return y.sum().item()  # a host read

    tally = launch_count.count(call, [layer])
    assert sum(tally.layers[0].values()) == 1  # the addmm of the Linear
    assert tally.outside["randn"] == 1 and tally.outside["sum"] == 1 and tally.host_reads == 1
