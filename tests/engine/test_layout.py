"""CPU float matrices are laid out column-major for the BLAS, with the same values, sharing kept."""

from __future__ import annotations

import torch
from torch import nn

from dflash_chat.engine.layout import lay_out_for_cpu


def _column_major(w: torch.Tensor) -> bool:
    return w.stride(0) == 1 and w.stride(1) == w.shape[0]


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embed = nn.Embedding(50, 16)
        self.embed.weight = nn.Parameter(torch.randn(50, 16, generator=g))
        self.proj = nn.Linear(16, 24, bias=False)
        self.proj.weight = nn.Parameter(torch.randn(24, 16, generator=g))
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, ids):
        h = self.embed(ids)
        return self.proj(h), self.head(h)


def test_linears_turn_column_major_with_the_same_outputs_and_a_tied_head_stays_tied():
    model = _Tied()
    ids = torch.tensor([3, 1, 49, 7])
    want = model(ids)
    lay_out_for_cpu(model)
    assert _column_major(model.proj.weight) and _column_major(model.head.weight)
    assert model.head.weight is model.embed.weight  # one matrix, re-laid once
    assert len({id(p) for p in model.parameters()}) == 2
    for got, expected in zip(model(ids), want, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_matrices_off_the_cpu_stay_as_loaded():
    with torch.device("meta"):
        model = nn.Linear(8, 4, bias=False)
    lay_out_for_cpu(model)
    assert model.weight.is_contiguous()


def test_a_loaded_cpu_pair_reads_every_float_matrix_column_major(tiny_dirs):
    from dflash_chat.engine.load import load_drafter, load_target

    target_dir, drafter_dir, hf = tiny_dirs["qwen3_5"]
    target = load_target(target_dir, "cpu", torch.float32)
    drafter = load_drafter(drafter_dir, target)
    for model in (target, drafter):
        matrices = [m.weight for m in model.modules() if isinstance(m, nn.Linear) and m.weight.shape[0] > 1]
        assert matrices and all(w.stride(0) == 1 for w in matrices)
    ids = torch.tensor([5, 9, 2, 40, 11])
    logits, _ = target(ids, target.new_state(16), logits="all")
    torch.testing.assert_close(logits, hf(ids[None]).logits[0].float(), rtol=1e-4, atol=1e-4)
