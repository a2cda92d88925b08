"""The distillation term that makes sampled drafts land: the drafter's q held to the target's p (T = 1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dflash_chat.train.dflash2 import _candidate_distill
from dflash_chat.train.losses import Blocks, distill_loss


def _blocks(top_logits: torch.Tensor, top_ids: torch.Tensor) -> Blocks:
    A, D = top_ids.shape[:2]
    labels = top_ids[..., 0].clone()
    return Blocks(torch.zeros(A, D + 1, dtype=torch.long), labels, labels.clone(), top_logits, top_ids)


def test_over_the_whole_vocabulary_it_is_kl_plus_the_targets_entropy():
    gen = torch.Generator().manual_seed(0)
    A, D, V = 3, 4, 50
    p_logits = torch.randn(A, D, V, generator=gen) * 2
    top_logits, top_ids = p_logits.topk(V, dim=-1)
    q_logits = torch.randn(A, D, V, generator=gen)
    got = distill_loss(q_logits, _blocks(top_logits, top_ids))
    p = torch.softmax(p_logits, dim=-1)
    kl = F.kl_div(torch.log_softmax(q_logits, dim=-1), p, reduction="none").sum(dim=-1)
    entropy = -(p * p.log()).sum(dim=-1)
    torch.testing.assert_close(got, kl + entropy)


def test_its_gradient_vanishes_where_q_is_p_on_the_kept_tokens():
    gen = torch.Generator().manual_seed(1)
    V, k = 40, 6
    p_logits = torch.randn(1, 2, V, generator=gen) * 3
    top_logits, top_ids = p_logits.topk(k, dim=-1)
    # q: the same logits on the kept tokens, and nothing elsewhere
    q_logits = torch.full((1, 2, V), -1e4).scatter(-1, top_ids, top_logits).requires_grad_()
    distill_loss(q_logits, _blocks(top_logits, top_ids)).sum().backward()
    assert q_logits.grad.abs().max() < 1e-5
    moved = q_logits.detach().clone()
    moved[0, 0, top_ids[0, 0, 0]] += 1.0  # too sure of the best token: the loss rises
    assert (
        distill_loss(moved, _blocks(top_logits, top_ids))[0, 0]
        > distill_loss(q_logits, _blocks(top_logits, top_ids))[0, 0]
    )


def test_the_selector_is_held_to_the_targets_probabilities_of_its_candidates():
    # the target's best 3 tokens 7, 2, 9 with probabilities (0.5, 0.3, 0.2); candidates 2, 7, 5, 9
    top_logits = torch.tensor([[[0.5, 0.3, 0.2]]]).log()
    top_ids = torch.tensor([[[7, 2, 9]]])
    blocks = _blocks(top_logits, top_ids)
    ids = torch.tensor([[2, 7, 5, 9]])
    want = torch.tensor([[0.3, 0.5, 0.0, 0.2]])
    at_target = _candidate_distill(want.clamp(min=1e-30).log(), ids, blocks, torch.tensor([True]))
    entropy = -(want[want > 0] * want[want > 0].log()).sum()
    torch.testing.assert_close(at_target, entropy.reshape(1))
    other = _candidate_distill(torch.zeros(1, 4), ids, blocks, torch.tensor([True]))
    assert other > at_target
    # no candidate the target gives mass to, or a position past the sequence: nothing to learn
    none = _candidate_distill(torch.zeros(1, 4), torch.tensor([[1, 3, 4, 5]]), blocks, torch.tensor([True]))
    past = _candidate_distill(torch.zeros(1, 4), ids, blocks, torch.tensor([False]))
    assert none.item() == 0 and past.item() == 0
