"""Training the demo's DFlash2 drafter: the shipped DFlash drafter with DFlash2's modules added.

Recipe (ours, after vLLM speculators PR #1006, which starts DFlash2 from a DFlash drafter):

1. Start. The DFlash drafter's weights, and the new modules at identity: each convolution's base kernel
   passes its input through (tap 0 = 1, later taps 0) with a zero kernel projection, and the selector's
   successor codebook is zero, so every score is the drafter's own logit. The new drafter drafts exactly
   as the old one at step 0 (a test holds this); the predecessor codebook and the hidden projection start
   small and random, so they receive gradient once the successor codebook moves.
2. Data and blocks. As the DFlash drafter's (train/drafter.py): the target's greedy answers, blocks
   [x[s], mask x (B-1)] labelled with the target's greedy continuation.
3. Loss. The DFlash loss on the draft logits (position-weighted cross-entropy through the target's head),
   plus the selector's: at block position j, teacher-forced on the label of position j-1 (the anchor for
   j = 1) as predecessor, cross-entropy of its scores over the K candidates towards the label, where the
   label is one of them; the same position weights. The walk at inference is right exactly while its
   predecessors are the labels, which is the prefix acceptance counts.
4. "acc-len" while training: 1 + the leading positions where the selector's choice (teacher-forced
   predecessors) equals the label.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.train.common import seeded
from dflash_chat.train.losses import (
    Blocks,
    block_loss,
    candidate_probs,
    expected_accepted,
    position_weights,
    soft_cross_entropy,
)

# Sizes for the demo's drafter (hidden 256): a codebook of 64 per token is ~1.6 MB at bf16 for 6146 tokens.
DEMO_SIZES = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 64, "selector_top_k": 8}
SELECTOR_WEIGHT = 1.0


def dflash2_config_dict(config: dict, sizes: dict | None = None) -> dict:
    """The DFlash drafter's config.json as a DFlash2DraftModel's (same backbone, block and taps)."""
    out = dict(config, architectures=["DFlash2DraftModel"])
    out["dflash_config"] = {**config.get("dflash_config", {}), **(sizes or DEMO_SIZES)}
    return out


def from_dflash(dflash, config2: dict, target, seed: int):
    """A DFlash2 drafter with `dflash`'s weights and its new modules at identity (see the module docstring)."""
    from dflash_chat.engine.models.config import DrafterConfig
    from dflash_chat.engine.models.dflash2 import DFlash2Drafter, DFlash2Layer

    with seeded(seed):
        drafter = DFlash2Drafter(DrafterConfig.from_dict(config2), target.config.hidden_size, target.config.vocab_size)
    missing, unexpected = drafter.load_state_dict(dflash.state_dict(), strict=False)
    new = ("attention_conv.", "mlp_conv.", "candidate_selector.")
    if unexpected or any(not any(part in name for part in new) for name in missing):
        raise ValueError(f"not a DFlash drafter of the same shape: missing {missing}, unexpected {unexpected}")
    with torch.no_grad(), seeded(seed):
        for layer in drafter.layers:
            assert isinstance(layer, DFlash2Layer)
            for conv in (layer.attention_conv, layer.mlp_conv):
                conv.base_kernel.zero_()
                conv.base_kernel[:, 0] = 1.0
                conv.kernel_projection.weight.zero_()
        selector = drafter.candidate_selector
        selector.successor_codebook.zero_()
        torch.nn.init.normal_(selector.predecessor_codebook, std=0.02)
        torch.nn.init.normal_(selector.hidden_projection.weight, std=0.02)
    drafter.bind(target.get_input_embeddings(), target.get_output_embeddings())
    return drafter


def forced_scores(drafter, hidden: torch.Tensor, logits: torch.Tensor, blocks: Blocks) -> tuple[torch.Tensor, ...]:
    """(candidate ids, scores) [A * D, K] of the drafted positions (hidden [A, D, H], logits [A, D, V]), each
    teacher-forced on its label's predecessor in the sequence."""
    A, D = blocks.labels.shape
    selector = drafter.candidate_selector
    unary, ids, successors, projected = selector.candidates(logits.reshape(A * D, -1), hidden.reshape(A * D, -1))
    return ids, selector.scores(unary, successors, projected, blocks.before.reshape(-1, 1))[:, 0]


def sampled_accepts(
    ids: torch.Tensor, scores: torch.Tensor, blocks: Blocks, sampling: SamplingParams, scale: float = 1.0
) -> torch.Tensor:
    """[A]: each block's expected accepted drafts when the walk draws from softmax(scale x scores / T) over its
    candidates and the target's p is processed with `sampling` (the chance a draft lands is sum(min(p, q)))."""
    A, D = blocks.labels.shape
    p_at = candidate_probs(ids, blocks.top_ids.reshape(A * D, -1), blocks.top_logits.reshape(A * D, -1), sampling)
    q = torch.softmax(scores.float() * scale / sampling.temperature, dim=-1)
    valid = (blocks.labels != -100).float()
    return expected_accepted(p_at.view(A, D, -1), q.view(A, D, -1), valid)


def selector_loss(
    drafter,
    hidden: torch.Tensor,
    logits: torch.Tensor,
    blocks: Blocks,
    weights: torch.Tensor,
    distill: float = 0.0,
    accept: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the selector's weighted loss, the teacher-forced acceptance length of each block).

    hidden [A, D, H] and logits [A, D, V] of the drafted positions, `blocks` their labels [A, D] (-100:
    none) and predecessors, weights [D]. The loss: cross-entropy of the scores over the K candidates
    towards the label (where it is one of them), + `distill` x cross-entropy towards the target's own
    distribution over the candidates (its best-k probabilities at T = 1, renormalised over the candidates
    it gives mass to), so that the sampled walk's softmax(scores / T) follows the target's, - `accept` x the
    blocks' mean expected accepted drafts at the app's sampling settings (`sampled_accepts`): the quantity
    sampled drafts live by, whose gradient raises q where it is below p and lowers it where it is above."""
    labels = blocks.labels
    A, D = labels.shape
    ids, scores = forced_scores(drafter, hidden, logits, blocks)
    is_label = ids == labels.reshape(-1, 1)
    valid = labels.reshape(-1) != -100
    covered = is_label.any(dim=-1) & valid
    loss = F.cross_entropy(scores, is_label.float().argmax(dim=-1), reduction="none") * covered.float()
    if distill:
        loss = loss + distill * _candidate_distill(scores, ids, blocks, valid)
    w = weights[None, :].expand(A, D).reshape(-1)
    loss = (loss * w).sum() / (w * valid.float()).sum().clamp(min=1e-6)
    if accept:
        loss = loss - accept * sampled_accepts(ids, scores, blocks, app_params()).mean()
    chosen = ids.gather(1, scores.argmax(dim=-1, keepdim=True)).view(A, D)
    return loss, (1 + (chosen == labels).long().cumprod(dim=1).sum(dim=1)).float()


def app_params() -> SamplingParams:
    """The app's default sampling settings (settings.py): what the sampled training answers are drawn with."""
    from dflash_chat.settings import Settings

    return Settings().sampling()


def _candidate_distill(scores: torch.Tensor, ids: torch.Tensor, blocks: Blocks, valid: torch.Tensor) -> torch.Tensor:
    """[N]: cross-entropy of the scores [N, K] towards the target's probabilities of the candidates `ids`
    [N, K]; 0 where the target gives none of them mass (or the position is past the sequence)."""
    k = blocks.top_ids.shape[-1]
    top_ids = blocks.top_ids.reshape(-1, k)
    p = torch.softmax(blocks.top_logits.reshape(-1, k), dim=-1)
    mass = ((ids[:, :, None] == top_ids[:, None, :]).float() * p[:, None, :]).sum(dim=-1)  # [N, K]
    total = mass.sum(dim=-1, keepdim=True)
    has = (total[:, 0] > 0) & valid
    target = mass / total.clamp(min=1e-12)
    return soft_cross_entropy(scores, target) * has.float()


def dflash2_loss(
    drafter, hidden: torch.Tensor, blocks: Blocks, decay: float, distill: float = 0.0, accept: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The DFlash loss on the draft logits plus the selector's."""
    drafted = hidden[:, 1:]
    logits = drafter.logits(drafted)
    lm, _ = block_loss(logits, blocks, decay, distill)
    weights = position_weights(blocks.labels.shape[1], decay, blocks.labels.device)
    sel, lengths = selector_loss(drafter, drafted, logits, blocks, weights, distill, accept)
    return lm + SELECTOR_WEIGHT * sel, lengths
