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

from dflash_chat.train.common import seeded

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
    from dflash_chat.engine.models.dflash2 import DFlash2Drafter

    with seeded(seed):
        drafter = DFlash2Drafter(DrafterConfig.from_dict(config2), target.config.hidden_size, target.config.vocab_size)
    missing, unexpected = drafter.load_state_dict(dflash.state_dict(), strict=False)
    new = ("attention_conv.", "mlp_conv.", "candidate_selector.")
    if unexpected or any(not any(part in name for part in new) for name in missing):
        raise ValueError(f"not a DFlash drafter of the same shape: missing {missing}, unexpected {unexpected}")
    with torch.no_grad(), seeded(seed):
        for layer in drafter.layers:
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


def selector_loss(
    drafter,
    hidden: torch.Tensor,
    logits: torch.Tensor,
    anchors: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the selector's weighted cross-entropy, the teacher-forced acceptance length of each block).

    hidden [A, D, H] and logits [A, D, V] of the drafted positions, anchors [A] the blocks' first tokens,
    labels [A, D] (-100: none), weights [D]."""
    A, D = labels.shape
    selector = drafter.candidate_selector
    unary, ids, successors, projected = selector.candidates(logits.reshape(A * D, -1), hidden.reshape(A * D, -1))
    predecessors = torch.cat((anchors[:, None], labels[:, :-1]), dim=1).clamp(min=0).reshape(-1, 1)
    scores = selector.scores(unary, successors, projected, predecessors)[:, 0]  # [A * D, K]
    is_label = ids == labels.reshape(-1, 1)
    covered = is_label.any(dim=-1) & (labels.reshape(-1) != -100)
    ce = F.cross_entropy(scores, is_label.float().argmax(dim=-1), reduction="none")
    w = weights[None, :].expand(A, D).reshape(-1) * covered.float()
    loss = (ce * w).sum() / w.sum().clamp(min=1e-6)
    chosen = ids.gather(1, scores.argmax(dim=-1, keepdim=True)).view(A, D)
    accept = 1 + (chosen == labels).long().cumprod(dim=1).sum(dim=1)
    return loss, accept.float()


def dflash2_loss(
    drafter, hidden: torch.Tensor, tokens: torch.Tensor, labels: torch.Tensor, decay: float, block_loss
) -> tuple[torch.Tensor, torch.Tensor]:
    """The DFlash loss on the draft logits plus the selector's (`block_loss` is the DFlash drafter's)."""
    drafted = hidden[:, 1:]
    logits = drafter.logits(drafted)
    lm, _ = block_loss(logits, labels, decay)
    weights = torch.exp(-torch.arange(labels.shape[1], device=labels.device, dtype=torch.float32) / decay)
    sel, accept = selector_loss(drafter, drafted, logits, tokens[:, 0], labels, weights)
    return lm + SELECTOR_WEIGHT * sel, accept
