"""Training the demo's DFlash drafter against the frozen demo target.

The recipe (ours; no DFlash training recipe has been published):

1. Text. Only what the drafter meets at inference: the target's own greedy answers (mostly thinking
   off, some thinking on) to prompts of two kinds, half each: corpus training questions, and
   free-form questions about the same subjects (`corpus.free_form_prompts`), so the drafter also
   knows how the target answers questions phrased unlike its corpus. On its own output the target's
   greedy prediction at each position is the next token, so the labels of a whole block form one
   consistent greedy continuation. (On corpus text they do not: the label at block position j >= 2
   follows the true prefix, which the drafter never sees. Our CPU runs, teacher-forced acceptance
   length after 220 steps: a third corpus chats, lr 1e-3: 1.37; corpus-prompt answers only,
   lr 1.5e-3: 2.07; the shipped mix, lr 1.5e-3: 1.58, and 10.1 after 1200 steps. Measured with the
   engine, the corpus-prompt-only drafter reached 5.69 tokens per step on held-out corpus prompts but
   3.28 on general questions; the shipped one 4.25 and 5.10.)
2. Teacher. One no-grad forward of the frozen target over a whole sequence gives the context features
   (outputs of the `target_layer_ids` decoder layers, concatenated) and
   the greedy next token at every position, g[t] = argmax p(x[t+1] | x[<=t]).
3. Blocks. Anchors s are drawn in the answer part of the sequence (from the last prompt token on),
   uniformly, or a share of them where the engine's steps start (train/anchors.py, finetune --hard-anchors).
   Block a is [x[s], mask x (B-1)], embedded with the target's frozen embed_tokens; it sees the
   context features of positions < s and its whole block. The label of block position j >= 1 is
   g[s + j - 1]; positions past the end of the sequence are ignored. The frozen teacher runs once per
   sequence before training (batched, right-padded); a step packs a few sequences into one context
   stream and runs all their blocks in one `DFlashDrafter.forward_train` call.
4. Loss. Cross-entropy through the target's frozen lm_head, block position j weighted by
   exp(-(j - 1) / decay): acceptance is a prefix, so an early miss costs the whole rest of the block.
   With `DrafterSettings.distill` = lambda > 0, + lambda x the cross-entropy of q towards p, the target's
   distribution at T = 1 over its TEACHER_TOP_K best tokens (renormalised; train/losses.py), weighted
   the same way: a sampled draft is accepted with probability sum(min(p, q)), and hard labels alone make
   q nearly one-hot on the greedy token. The finetune stage uses it on the target's sampled answers too
   (stages/finetune.py), whose contexts the greedy answers never show the drafter.
5. Optimiser. AdamW, warmup then cosine decay, gradient clipping at 1. Only the drafter trains.

The figure printed while training, "acc-len", is the acceptance length the drafts would reach under
greedy verification with teacher forcing: 1 + the number of leading block positions whose argmax
equals the label.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from dflash_chat.train.common import Log, Schedule, autocast_for, run_steps, seeded
from dflash_chat.train.losses import Blocks, block_loss

BLOCK_SIZE = 16
TEACHER_TOP_K = 32  # the target's best next-token logits kept per position for the distillation term


@dataclass
class DrafterShape:
    num_layers: int = 1  # one layer is a sixth of the target's depth: cheap enough to pay off on a CPU
    intermediate_size: int = 768
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    target_layer_ids: tuple[int, ...] = (1, 3, 5)
    block_size: int = BLOCK_SIZE


def drafter_config_dict(shape: DrafterShape, target_config, mask_token_id: int) -> dict:
    """A z-lab style config.json for the drafter."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": shape.block_size,
        # the teacher taps each layer's own output, the last one too (see `teacher`)
        "dflash_config": {
            "mask_token_id": mask_token_id,
            "target_layer_ids": list(shape.target_layer_ids),
            "last_layer_tap": "raw",
        },
        "num_target_layers": target_config.num_hidden_layers,
        "hidden_size": target_config.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": target_config.max_position_embeddings,
        "layer_types": ["full_attention"] * shape.num_layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": target_config.vocab_size,
        "dtype": "bfloat16",
    }


def new_drafter(config: dict, target, seed: int):
    from dflash_chat.engine.models.config import DrafterConfig
    from dflash_chat.engine.models.dflash import DFlashDrafter

    with seeded(seed):
        drafter = DFlashDrafter(DrafterConfig.from_dict(config), target.config.hidden_size)
        for module in drafter.modules():
            if isinstance(module, torch.nn.Linear):
                torch.nn.init.normal_(module.weight, std=0.02)
    drafter.bind(target.get_input_embeddings(), target.get_output_embeddings())
    return drafter


def load_for_training(folder: Path, target):
    """A saved drafter (config.json + model.safetensors as `save_drafter` writes them, DFlash or DFlash2) in
    float32, bound to `target`'s embeddings and head: (drafter, its config dict)."""
    from safetensors.torch import load_file

    from dflash_chat.engine.models.config import DrafterConfig
    from dflash_chat.engine.models.dflash2 import DFlash2Drafter

    config = json.loads((Path(folder) / "config.json").read_text())
    if "DFlash2DraftModel" in config.get("architectures", ()):
        cfg = DrafterConfig.from_dict(config)
        drafter = DFlash2Drafter(cfg, target.config.hidden_size, target.config.vocab_size)
        drafter.bind(target.get_input_embeddings(), target.get_output_embeddings())
    else:
        drafter = new_drafter(config, target, seed=0)
    state = load_file(str(Path(folder) / "model.safetensors"))
    drafter.load_state_dict({k: v.float() for k, v in state.items()})
    return drafter, config


@dataclass
class Sequence:
    """Token ids of one chat, and the first position an anchor may take (the last prompt token); `chances`,
    when set, each position's chance of being drawn as an anchor (train/anchors.py), else uniform."""

    ids: torch.Tensor
    start: int
    chances: torch.Tensor | None = None


@dataclass
class DrafterSettings(Schedule):
    lr: float = 1e-3
    warmup: int = 30
    seqs_per_step: int = 4
    anchors_per_seq: int = 16
    decay: float = 7.0
    distill: float = 0.0  # weight of the distillation term (module docstring, 4.): 0 is the hard labels alone
    accept: float = 0.0  # DFlash2: weight of the selector's expected sampled acceptance (train/dflash2.py)


class Taught(NamedTuple):
    """The frozen target's outputs over one sequence of S tokens, computed once for every step."""

    features: torch.Tensor  # [S, K*H] float32: the tap layers' outputs
    greedy: torch.Tensor  # [S]: the greedy next token
    top_logits: torch.Tensor  # [S, k] float16: the best next-token logits, best first
    top_ids: torch.Tensor  # [S, k] int32: their token ids


@torch.no_grad()
def teacher(target, seqs: list[torch.Tensor], layer_ids, top_k: int = TEACHER_TOP_K) -> list[Taught]:
    """Per sequence: features [S, K*H] after the tap layers, the greedy next token [S], and the target's
    `top_k` best next-token logits [S, k] with their ids (what the distillation term holds q to).

    One batched forward, right-padded: with causal attention and a forward recurrence, padding after
    a sequence does not change anything at its real positions. Features are read with hooks on the
    decoder layers, because HF's last `hidden_states` entry is taken after the final norm, while a
    tap is the layer's own output.
    """
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long, device=seqs[0].device)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = s
    captured: dict[int, torch.Tensor] = {}
    layers = target.model.layers
    hooks = [layers[i].register_forward_hook(_capture(captured, i)) for i in layer_ids]
    try:
        logits = target(input_ids=ids, use_cache=False).logits
    finally:
        for hook in hooks:
            hook.remove()
    feats = torch.cat([captured[i] for i in layer_ids], dim=-1).float()
    values, ids = torch.topk(logits.float(), min(top_k, logits.shape[-1]), dim=-1)  # sorted: [..., 0] is greedy
    values, ids = values.half(), ids.int()  # a logit to ~3 digits is plenty; ~0.2 KB a position at k = 32
    return [
        Taught(feats[row, : len(s)], ids[row, : len(s), 0].long(), values[row, : len(s)], ids[row, : len(s)])
        for row, s in enumerate(seqs)
    ]


def _capture(store: dict, index: int):
    def hook(module, args, output):
        store[index] = output[0] if isinstance(output, tuple) else output

    return hook


def make_blocks(ids: torch.Tensor, taught: Taught, anchors: torch.Tensor, block: int, mask_id: int) -> Blocks:
    """The blocks at `anchors` [A] of one sequence `ids` [S] (see `Blocks`)."""
    S = ids.shape[0]
    offsets = torch.arange(block, device=ids.device)
    tokens = torch.full((len(anchors), block), mask_id, dtype=torch.long, device=ids.device)
    tokens[:, 0] = ids[anchors]
    label_pos = anchors[:, None] + offsets[None, 1:] - 1
    at = label_pos.clamp(max=S - 1)
    labels = taught.greedy.to(ids.device)[at]
    labels[label_pos > S - 1] = -100
    top_logits = taught.top_logits.to(ids.device)[at].float()
    return Blocks(tokens, labels, ids[at], top_logits, taught.top_ids.to(ids.device)[at].long())


def sample_anchors(seq: Sequence, count: int, rng: random.Random) -> list[int]:
    last = seq.ids.shape[0] - 2
    if last < seq.start:
        return []
    span = range(seq.start, last + 1)
    if seq.chances is None:
        return sorted(rng.sample(span, min(count, len(span))))
    return [seq.start + i for i in draw_anchors(seq.chances[seq.start : last + 1].tolist(), count, rng)]


def draw_anchors(chances: list[float], count: int, rng: random.Random) -> list[int]:
    """Up to `count` distinct indices drawn without replacement in proportion to `chances` (keys u^(1/c),
    Efraimidis and Spirakis), ascending."""
    keys = [(rng.random() ** (1.0 / c), i) for i, c in enumerate(chances) if c > 0]
    keys.sort(reverse=True)
    return sorted(i for _, i in keys[:count])


def pack_blocks(
    seqs: list[Sequence], taught: list[Taught], anchors: list[list[int]], block: int, mask_id: int, device
) -> tuple[torch.Tensor, Blocks, torch.Tensor]:
    """Several sequences packed into one context stream for `forward_train`.

    Returns (features [sum S, K*H], the blocks of all of them, their anchors in the packed stream [A]).
    Labels never cross into the next sequence; a block may see earlier sequences of the pack as context
    (as in packed pretraining), which does not change its own labels.
    """
    feats, blocks, packed = [], [], []
    offset = 0
    for seq, t, a in zip(seqs, taught, anchors, strict=True):
        ids = seq.ids.to(device)
        a_t = torch.tensor(a, dtype=torch.long, device=device)
        blocks.append(make_blocks(ids, t, a_t, block, mask_id))
        feats.append(t.features.to(device))
        packed.append(a_t + offset)
        offset += len(ids)
    return torch.cat(feats), Blocks(*(torch.cat(parts) for parts in zip(*blocks, strict=True))), torch.cat(packed)


def teach_all(target, sequences: list[Sequence], layer_ids, device, batch: int = 16) -> list[Taught]:
    """Teacher outputs for every sequence, computed once (the target is frozen), in length-sorted batches."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i].ids))
    out: list = [None] * len(sequences)
    for i in range(0, len(order), batch):
        idx = order[i : i + batch]
        with autocast_for(device):
            taught = teacher(target, [sequences[j].ids.to(device) for j in idx], layer_ids)
        for j, pair in zip(idx, taught, strict=True):
            out[j] = pair
    return out


def draft_blocks(drafter, target, seqs: list[Sequence], taught, anchors_per_seq: int, rng: random.Random, device):
    """(the drafter's hidden states [A, B, H], the `Blocks`) at up to `anchors_per_seq` random anchors of each
    sequence, packed into one forward; None when no sequence has room for a block."""
    chosen = [(s, t, sample_anchors(s, anchors_per_seq, rng)) for s, t in zip(seqs, taught, strict=True)]
    chosen = [c for c in chosen if c[2]]
    if not chosen:
        return None
    feats, blocks, packed = pack_blocks(
        [c[0] for c in chosen],
        [c[1] for c in chosen],
        [c[2] for c in chosen],
        drafter.block_size,
        drafter.mask_token_id,
        device,
    )
    embedded = target.get_input_embeddings()(blocks.tokens).detach()
    return drafter.forward_train(feats, embedded, packed), blocks


def _draft_batch(
    drafter, target, seqs: list[Sequence], taught, settings: "DrafterSettings", rng: random.Random, device
):
    """(loss, acceptance lengths) of one packed batch, or None when no sequence has room for a block."""
    drafted = draft_blocks(drafter, target, seqs, taught, settings.anchors_per_seq, rng, device)
    if drafted is None:
        return None
    hidden, blocks = drafted
    if getattr(drafter.cfg, "dflash2", None) is not None:
        from dflash_chat.train.dflash2 import dflash2_loss

        return dflash2_loss(drafter, hidden, blocks, settings.decay, settings.distill, settings.accept)
    return block_loss(drafter.logits(hidden[:, 1:]), blocks, settings.decay, settings.distill)


def train_drafter(
    drafter,
    target,
    sequences: list[Sequence],
    settings: DrafterSettings,
    *,
    seed: int,
    device: str = "cpu",
    log: Log = print,
    taught: list | None = None,
) -> list[float]:
    """Train `drafter` against the frozen `target`; `taught` is teach_all's output when already computed."""
    target.to(device).eval().requires_grad_(False)
    drafter.to(device).train()
    rng = random.Random(seed)
    if taught is None:
        started = time.perf_counter()
        taught = teach_all(target, sequences, drafter.target_layer_ids, device)
        log(f"drafter: teacher outputs for {len(sequences)} sequences ({time.perf_counter() - started:.0f}s)")

    def step(_: int):
        picked = rng.sample(range(len(sequences)), min(settings.seqs_per_step, len(sequences)))
        with autocast_for(device):
            result = _draft_batch(
                drafter, target, [sequences[i] for i in picked], [taught[i] for i in picked], settings, rng, device
            )
        if result is None:
            return None
        loss, accept = result
        return loss, {"acc-len": accept.mean()}

    losses = run_steps("drafter", (p for p in drafter.parameters() if p.requires_grad), settings, step, log)
    drafter.eval()
    return losses


@torch.no_grad()
def teacher_forced_acceptance(
    drafter,
    target,
    sequences: list[Sequence],
    *,
    anchors_per_seq: int = 32,
    seed: int = 0,
    device: str = "cpu",
    batch: int = 8,
) -> float:
    """Mean teacher-forced acceptance length over sequences (a quick held-out check)."""
    rng = random.Random(seed)
    settings = DrafterSettings(steps=0, anchors_per_seq=anchors_per_seq)
    taught = teach_all(target, sequences, drafter.target_layer_ids, device)
    total = []
    for i in range(0, len(sequences), batch):
        with autocast_for(device):
            result = _draft_batch(
                drafter, target, sequences[i : i + batch], taught[i : i + batch], settings, rng, device
            )
        if result is not None:
            total.append(result[1])
    return torch.cat(total).mean().item() if total else math.nan


def save_drafter(drafter, config: dict, out_dir: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in drafter.state_dict().items()}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
