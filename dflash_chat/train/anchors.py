"""Where training blocks start: uniformly over an answer, or leaning towards where the engine's blocks start.

In the engine a block starts right after the step before it ended: mostly at a token resampled after a
rejected draft, drawn from norm(max(0, p - q)), a token the drafter gave less chance than the target did.
Teacher-forced at random anchors the demo's DFlash2 drafter lands its first sampled draft 0.65 of the time
on held-out code at T 0.7, at the anchors the engine's own steps start from 0.53-0.57 (the engine itself:
0.53): the engine's blocks start where drafting is harder, which is most of the gap between teacher-forced
tau (3.06) and the engine's (2.69).

A sampled answer's token x[s] is drawn from p; at the engine's anchors its density is max(0, p - q1)
instead (q1: the drafter's first draft from the block before, anchored at s - 1), so a position's weight
as an anchor is max(0, 1 - q1(x[s]) / p(x[s])), the importance ratio up to a constant. Training draws a
`share` of its anchors by those weights and the rest uniformly (so easy positions, where greedy drafts
mostly start, keep their weight).

Tried once on the demo's DFlash2 drafter (finetune, seed 7, 1024 answers 3/4 sampled, share 0.5, 1400 steps)
against the same run with uniform anchors (1500 steps), engine tau at fixed 16 on the bench's held-out
classes, 8 prompts (x 3 seeds at T 0.7): T 0.7 code 2.46 and 2.57 (shipped 2.46), prose 3.12 and 2.99 (2.72),
raw code 1.89 and 2.66 (2.35); greedy code 7.58 and 7.81 (9.26). No gain over uniform anchors; not shipped.
"""

from __future__ import annotations

import torch

from dflash_chat.engine.sampling import probabilities
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.train.drafter import pack_blocks
from dflash_chat.train.losses import Blocks, candidate_probs


def mixed_chances(weights: torch.Tensor, valid: torch.Tensor, share: float) -> torch.Tensor:
    """[S]: each anchor position's chance, (1 - share) uniformly over `valid` and `share` by `weights` (uniform
    where no position has weight); 0 outside `valid`."""
    valid_f = valid.float()
    uniform = valid_f / valid_f.sum().clamp(min=1.0)
    w = weights.clamp(min=0.0) * valid_f
    by_weight = w / w.sum() if w.sum() > 0 else uniform
    return (1.0 - share) * uniform + share * by_weight


@torch.no_grad()
def residual_weights(drafter, target, seq, taught, sampling: SamplingParams, device: str = "cpu") -> torch.Tensor:
    """[S]: max(0, 1 - q1(x[s]) / p(x[s])) at each position s after the sequence's first anchor position (0
    elsewhere), q1 the drafter's first sampled draft in the block anchored at s - 1 (DFlash2: its walk's
    softmax(scores / T) over the candidates; DFlash: its processed logits) and p the target's processed
    distribution (its best teacher logits), both at `sampling`; 0 where p is (the engine never draws it)."""
    ids = seq.ids.to(device)
    S = ids.shape[0]
    out = torch.zeros(S)
    anchors = list(range(seq.start, S - 2))
    if not anchors:
        return out
    feats, blocks, packed = pack_blocks([seq], [taught], [anchors], drafter.block_size, drafter.mask_token_id, device)
    hidden = drafter.forward_train(feats, target.get_input_embeddings()(blocks.tokens), packed)[:, 1:2].float()
    logits = drafter.logits(hidden)  # [A, 1, V]
    nxt = ids[torch.tensor(anchors, device=device) + 1]
    if getattr(drafter.cfg, "dflash2", None) is not None:
        from dflash_chat.train.dflash2 import forced_scores

        first = Blocks(*(part[:, :1] for part in blocks))  # block position 1 only
        cand, scores = forced_scores(drafter, hidden, logits, first)
        q_all = torch.softmax(scores.float() / sampling.temperature, dim=-1)
        q = (q_all * (cand == nxt[:, None]).float()).sum(dim=-1)
    else:
        q = probabilities(logits[:, 0], sampling).gather(1, nxt[:, None])[:, 0]
    p = candidate_probs(nxt[:, None], blocks.top_ids[:, 0], blocks.top_logits[:, 0], sampling)[:, 0]
    ratio = torch.where(p > 0, 1.0 - q / p.clamp(min=1e-12), torch.zeros_like(p))  # p = 0: the engine never draws it
    out[torch.tensor(anchors) + 1] = ratio.clamp(min=0.0).cpu()
    return out


def lean_to_engine_anchors(drafter, target, sequences, taught, sampling: SamplingParams, share: float, device="cpu"):
    """Set every sequence's anchor chances: `share` by `residual_weights` from `drafter` as it is now."""
    drafter.eval()
    for seq, t in zip(sequences, taught, strict=True):
        S = seq.ids.shape[0]
        valid = torch.zeros(S, dtype=torch.bool)
        valid[seq.start : S - 1] = True  # sample_anchors' span: start .. S - 2
        seq.chances = mixed_chances(residual_weights(drafter, target, seq, t, sampling, device), valid, share)
