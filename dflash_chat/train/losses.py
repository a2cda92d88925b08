"""The drafters' training losses over blocks (train/drafter.py's recipe, 4.; DFlash2's selector adds its own
in train/dflash2.py)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class Blocks(NamedTuple):
    """Training blocks [A, B] with what each drafted position j >= 1 is held to, [A, B-1] (or [A, B-1, k])."""

    tokens: torch.Tensor  # [x[s], mask x (B-1)]
    labels: torch.Tensor  # g[s + j - 1]; -100 past the sequence end
    before: torch.Tensor  # x[s + j - 1]: the sequence's token the label follows (the selector's predecessor)
    top_logits: torch.Tensor  # the target's best logits at s + j - 1 (float32)
    top_ids: torch.Tensor  # and their token ids


def position_weights(positions: int, decay: float, device) -> torch.Tensor:
    """exp(-(j - 1) / decay) for block positions j = 1 .. positions."""
    return torch.exp(-torch.arange(positions, device=device, dtype=torch.float32) / decay)


def soft_cross_entropy(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """-sum target * log_softmax(scores) over the last dim: KL(target || softmax(scores)) + target's entropy."""
    return -(target * torch.log_softmax(scores.float(), dim=-1)).sum(dim=-1)


def distill_loss(logits: torch.Tensor, blocks: Blocks) -> torch.Tensor:
    """[A, B-1]: cross-entropy of the draft logits [A, B-1, V] towards the target's distribution at T = 1
    over its best k tokens (renormalised): the gradient of KL(p || q) restricted to where p has its mass."""
    log_q = torch.log_softmax(logits.float(), dim=-1).gather(-1, blocks.top_ids)
    return -(torch.softmax(blocks.top_logits, dim=-1) * log_q).sum(dim=-1)


def block_loss(
    logits: torch.Tensor, blocks: Blocks, decay: float, distill: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Position-weighted cross-entropy (+ `distill` x the distillation term), and the teacher-forced
    acceptance length of each block."""
    labels = blocks.labels
    weights = position_weights(labels.shape[1], decay, labels.device)
    ce = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="none"
    ).view_as(labels.float())
    if distill:
        ce = ce + distill * distill_loss(logits, blocks)
    valid = (labels != -100).float()
    w = weights[None, :] * valid
    loss = (ce * w).sum() / w.sum().clamp(min=1e-6)
    hits = (logits.argmax(dim=-1) == labels).long()
    accept = 1 + hits.cumprod(dim=1).sum(dim=1)
    return loss, accept.float()


def candidate_probs(ids: torch.Tensor, top_ids: torch.Tensor, top_logits: torch.Tensor, sampling) -> torch.Tensor:
    """[N, K]: the target's probability of each of N positions' K candidate ids, its best logits [N, k] with
    their ids processed like the engine's target (`sampling`: temperature, top-k, top-p; 0 outside them)."""
    from dflash_chat.engine.sampling import probabilities

    p = probabilities(top_logits, sampling)
    return ((ids[:, :, None] == top_ids[:, None, :]).float() * p[:, None, :]).sum(dim=-1)


def expected_accepted(p_at: torch.Tensor, q: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[A]: expected accepted drafts of each block when its drafts are drawn from q: sum_j prod_{i<=j} of the
    chance sum(min(p, q)) that draft i lands (p_at, q [A, D, K] over the candidates; valid [A, D])."""
    landed = torch.minimum(p_at, q).sum(dim=-1) * valid
    return landed.cumprod(dim=1).sum(dim=1)
