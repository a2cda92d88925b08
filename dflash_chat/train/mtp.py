"""Training the demo target's MTP layer (engine/models/mtp.py) against the frozen demo target.

The recipe (ours, in the spirit of the drafter's, train/drafter.py):

1. Text: the target's own answers (greedy, and a share drawn at the app's sampling settings) to training
   prompts, the same data the drafter stages answer (stages/answers.py).
2. Teacher: one no-grad forward of the frozen target (the engine's own module) over a sequence gives what
   the layer reads, the final-normed hidden state h_i at every position, and what it is held to: the
   target's greedy next token g[i + 1] after position i + 1, and its best logits there (distillation).
3. Rows: row i pairs h_i with the token x[i + 1] at position i, as the layer drafts (the token after the
   one the target just wrote); its label is g[i + 1], the token after that. All rows of a sequence run in
   one causal forward; the loss counts the rows from the answer's first token on.
4. Loss: cross-entropy through the target's frozen LM head, plus `distill` x the cross-entropy of the
   layer's distribution towards the target's at T = 1 over its best tokens (train/losses.py): a sampled
   draft lands with probability sum(min(p, q)).
5. Start: the layer's decoder layer starts as a copy of the target's last full-attention layer (its norms
   and projections already fit the target's hidden states); `fc` and the layer's own norms start fresh.
   AdamW, warmup then cosine decay (train/common.py). Only the MTP layer trains.

`teacher_forced_agreement` is the held-out check: the share of answer rows whose top draft is the target's
greedy token, a chained depth-1 draft's acceptance.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from dflash_chat.engine.models.mtp import MTPHead
from dflash_chat.engine.models.span import Span
from dflash_chat.train.common import Log, Schedule, run_steps, seeded
from dflash_chat.train.drafter import TEACHER_TOP_K, Sequence

MTP_STEPS = 1500


@dataclass
class MTPSettings(Schedule):
    lr: float = 1e-3
    warmup: int = 30
    seqs_per_step: int = 4
    distill: float = 1.0


@dataclass(frozen=True)
class Taught:
    """The frozen target over one sequence: its final-normed hidden states [S, H], greedy next tokens [S], and
    its best next-token logits [S, k] with their ids."""

    hidden: torch.Tensor
    greedy: torch.Tensor
    top_logits: torch.Tensor
    top_ids: torch.Tensor


@torch.no_grad()
def teach(target, ids: torch.Tensor) -> Taught:
    """What the engine's target hands the MTP layer (and predicts) over `ids`."""
    state = target.new_state(ids.shape[0])
    logits, feats = target(ids, state, logits="all", taps=[target.cfg.num_layers - 1])
    values, top = torch.topk(logits, min(TEACHER_TOP_K, logits.shape[-1]), dim=-1)
    return Taught(target.model.norm(feats), top[:, 0], values, top)


def new_head(target, target_dir: Path, seed: int) -> MTPHead:
    """An MTP layer for `target` (the engine's module, loaded from `target_dir`), bound to it, its decoder layer
    a copy of the target's last full-attention one as its file holds it (the loaded module's projections are
    fused for the CPU, the head's are not)."""
    from dflash_chat.engine.checkpoint import normalise_target_names
    from dflash_chat.engine.weights.safetensors import read_safetensors

    with seeded(seed):
        head = MTPHead(target.cfg).to(target.model.norm.weight.device)
    last = max(i for i, kind in enumerate(target.cfg.layer_types) if kind == "full_attention")
    prefix = f"model.layers.{last}."
    tensors = normalise_target_names(read_safetensors(target_dir).tensors)
    layer = {name.removeprefix(prefix): tensors[name] for name in tensors if name.startswith(prefix)}
    head.layers[0].load_state_dict({k: v.float() for k, v in layer.items()})
    head.bind(target)
    return head


def _rows(head: MTPHead, taught: Taught, ids: torch.Tensor) -> torch.Tensor:
    """The layer's logits [S - 1, V] for the rows (h_i, x[i + 1]) at positions 0 .. S - 2, in one forward."""
    S = ids.shape[0]
    head.allocate(S)
    out = head(taught.hidden[:-1], ids[1:], Span.eager(0, S - 1, ids.device))
    return head.logits(out)


def _loss(head: MTPHead, seq: Sequence, taught: Taught, distill: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, agreement) over the rows from the answer on: row i is held to g[i + 1]."""
    logits = _rows(head, taught, seq.ids)
    first = max(seq.start - 1, 0)
    logits, labels = logits[first:], taught.greedy[first + 1 :]
    loss = F.cross_entropy(logits, labels)
    if distill:
        log_q = torch.log_softmax(logits, dim=-1).gather(-1, taught.top_ids[first + 1 :])
        loss = loss - distill * (torch.softmax(taught.top_logits[first + 1 :], dim=-1) * log_q).sum(-1).mean()
    return loss, (logits.argmax(-1) == labels).float().mean()


def train_mtp(
    head: MTPHead, target, sequences: list[Sequence], settings: MTPSettings, *, seed: int, log: Log
) -> list[float]:
    """Train `head` on the target's answers `sequences` (the recipe in the module docstring)."""
    for p in target.parameters():
        p.requires_grad_(False)
    head.train()
    taught = [teach(target, s.ids) for s in sequences]
    rng = random.Random(seed)

    def step(_: int):
        picked = rng.sample(range(len(sequences)), min(settings.seqs_per_step, len(sequences)))
        losses, agreement = zip(*(_loss(head, sequences[i], taught[i], settings.distill) for i in picked), strict=True)
        return torch.stack(losses).mean(), {"agree": torch.stack(agreement).mean()}

    losses = run_steps("mtp", head.parameters(), settings, step, log)
    head.eval()
    return losses


@torch.no_grad()
def teacher_forced_agreement(head: MTPHead, target, sequences: list[Sequence]) -> float:
    """The share of answer rows whose top draft is the target's greedy token (held-out check)."""
    hits = total = 0
    for seq in sequences:
        taught = teach(target, seq.ids)
        first = max(seq.start - 1, 0)
        drafts = _rows(head, taught, seq.ids)[first:].argmax(-1)
        hits += int((drafts == taught.greedy[first + 1 :]).sum())
        total += drafts.shape[0]
    return hits / total if total else float("nan")


def ship_head(head: MTPHead, target_dir: Path, out: Path) -> None:
    """The target in `target_dir` copied to `out` (unless it is there already) with the MTP layer inside its
    safetensors under the checkpoints' names (`mtp.*`, bf16 like the rest), as the Qwen checkpoints ship theirs."""
    import shutil

    from dflash_chat.bench.tiny_target import add_mtp

    if out.resolve() != target_dir.resolve():
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(target_dir, out)
    state = {f"mtp.{k}": v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in head.state_dict().items()}
    add_mtp(out, state)
