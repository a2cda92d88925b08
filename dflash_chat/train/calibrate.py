"""The DFlash2 selector's temperature, fitted to the target's sampled answers.

At T > 0 the selector's walk draws each draft from softmax(scores / T) over its K candidates, and a draft
lands with probability sum(min(p, q)) (docs/ARCHITECTURE.md, DFlash drafters). Trained with hard labels, the scores come out sharper
than the target's log-probabilities, so q is more peaked than p and overlaps it less. A scale s on the scores
(s < 1 flattens q) is fitted here on teacher-forced blocks of sampled answers: the one with the most expected
accepted drafts per block, sum_j prod_{i<=j} sum(min(p_i, q_i)) with p the target's distribution after the
app's temperature, top-k and top-p, and q the walk's. It is written into the checkpoint, not the engine: the
config's `output_multiplier` and `final_logit_softcapping` and the selector's `hidden_projection` scale the
unary and pairwise parts of every score alike, so scores become s x scores; the greedy walk (an argmax) and
the candidates (a top-k) are unchanged, and the engine keeps processing q exactly as it does the target's.
"""

from __future__ import annotations

import random
from dataclasses import replace

import torch

from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.train.dflash2 import forced_scores, sampled_accepts
from dflash_chat.train.drafter import Sequence, draft_blocks, teach_all

SCALES = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)  # tried, no flattening first


@torch.no_grad()
def expected_accepts(
    drafter,
    target,
    sequences: list[Sequence],
    sampling: SamplingParams,
    scales=SCALES,
    *,
    anchors_per_seq: int = 32,
    seed: int = 0,
    device: str = "cpu",
    batch: int = 8,
    taught: list | None = None,
) -> dict[float, float]:
    """Per scale: the mean expected accepted drafts per teacher-forced block (the same blocks for every scale)."""
    if taught is None:
        taught = teach_all(target, sequences, drafter.target_layer_ids, device)
    rng = random.Random(seed)
    totals: dict[float, list[torch.Tensor]] = {s: [] for s in scales}
    for i in range(0, len(sequences), batch):
        drafted = draft_blocks(
            drafter, target, sequences[i : i + batch], taught[i : i + batch], anchors_per_seq, rng, device
        )
        if drafted is None:
            continue
        hidden, blocks = drafted[0][:, 1:].float(), drafted[1]
        ids, scores = forced_scores(drafter, hidden, drafter.logits(hidden), blocks)
        for s in scales:
            totals[s].append(sampled_accepts(ids, scores, blocks, sampling, s))
    return {s: torch.cat(v).mean().item() if v else 0.0 for s, v in totals.items()}


def best_scale(accepts: dict[float, float]) -> float:
    return max(accepts, key=lambda s: accepts[s])


@torch.no_grad()
def apply_scale(drafter, config: dict, scale: float) -> None:
    """Scale every selector score by `scale`, in the drafter's weights and its config dict (as saved)."""
    d2 = config.setdefault("dflash_config", {})
    d2["output_multiplier"] = d2.get("output_multiplier", 1.0) * scale
    if d2.get("final_logit_softcapping") is not None:
        d2["final_logit_softcapping"] *= scale
    drafter.cfg.dflash2 = replace(
        drafter.cfg.dflash2,
        output_multiplier=d2["output_multiplier"],
        final_logit_softcapping=d2.get("final_logit_softcapping"),
    )
    drafter.candidate_selector.hidden_projection.weight.mul_(scale)
