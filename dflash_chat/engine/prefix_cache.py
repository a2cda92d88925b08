"""Checkpoints along prompts, so a request that branches from an earlier one resumes near the branch.

A hybrid target's Gated DeltaNet state cannot be rolled back: the state after n tokens is gone once more
tokens have run. The attention KV cache can (it is static: truncating is setting a length). So the engine
saves, at chosen positions of each prefill, a copy of what cannot be truncated:
- every GDN layer's recurrent and conv state;
- the drafter's sliding-window rings (a sliding layer keeps only its last window + B context rows, in a
  ring that later positions overwrite; its full-attention layers keep every row and truncate like the
  target's KV);
- at the end of a prompt, the last logits (so the same prompt again needs no forward at all).
Restoring a checkpoint of length L truncates the KV caches to L and copies these back: the state is then
exactly what a cold prefill of the first L tokens leaves, and the rest of the prompt is prefilled.

The positions (engine/spec.py): the end of the system and tools block (the caller marks it: the first
user turn's start, where agents' side requests and edited chats branch), every `every` tokens, and the
end of each prompt (the engine's snapshot, with the last logits; it joins the cache when the next prompt
extends past it: an edit of what followed resumes there). Like SGLang's MambaRadixCache (state kept only at chosen nodes, the KV for any prefix)
and vLLM's mamba_cache_mode="align" (state kept at block-aligned positions), but for one static sequence:
a checkpoint holds no KV, so it is usable only while the KV cache still holds its tokens. The engine keeps
that true (every checkpoint here is a prefix of the tokens its state holds) by dropping the checkpoints
past a position whenever it overwrites the rows from there on; a conversation that another prompt is about
to overwrite goes, checkpoints and all, to engine/parked.py's shelf.

They are kept least recently used first out, under a byte budget; marked ones (the system block's end)
go after every unmarked one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from dflash_chat.engine.rules import PREFIX_CACHE_MIB_DEFAULT

CHECKPOINT_EVERY = 4096  # tokens between two checkpoints along a prompt
DEFAULT_BUDGET = PREFIX_CACHE_MIB_DEFAULT * 2**20  # bytes of checkpoints kept (the `prefix_cache_mib` setting's)


@dataclass
class Checkpoint:
    length: int  # the tokens of the prompt it was taken after
    recurrent: list[tuple[torch.Tensor, torch.Tensor]]  # per GDN layer: (recurrent, conv) state copies
    rings: list[tuple[torch.Tensor, torch.Tensor] | None]  # per drafter layer: its ring's K and V (None: no ring)
    logits: torch.Tensor | None = None  # the last position's logits (only at the end of a prompt)
    marked: bool = False  # at a position the caller marked (the system block's end)
    mtp_last: torch.Tensor | None = None  # the target's MTP layer's newest hidden state there (when it has one)

    @property
    def nbytes(self) -> int:
        tensors = [t for pair in self.recurrent for t in pair]
        tensors += [t for pair in self.rings if pair is not None for t in pair]
        tensors += [t for t in (self.logits, self.mtp_last) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)


class CheckpointCache:
    """Checkpoints by length, least recently used first out under `budget` bytes (0: none kept)."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError(f"the checkpoint budget must be 0 or more bytes, not {budget}")
        self.budget = budget
        self._by_length: OrderedDict[int, Checkpoint] = OrderedDict()  # oldest use first
        self.evicted = 0  # checkpoints dropped for the budget (for tests and figures)

    def __len__(self) -> int:
        return len(self._by_length)

    def __iter__(self) -> Iterator[Checkpoint]:
        """The checkpoints, least recently used first."""
        return iter(list(self._by_length.values()))

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self._by_length.values())

    @property
    def lengths(self) -> list[int]:
        return sorted(self._by_length)

    def add(self, checkpoint: Checkpoint) -> bool:
        """Keep `checkpoint` (replacing one of the same length), evicting others past the budget; False when
        it alone is over the budget (nothing is kept then)."""
        size = checkpoint.nbytes
        if size > self.budget:
            return False
        old = self._by_length.pop(checkpoint.length, None)
        checkpoint.marked = checkpoint.marked or bool(old and old.marked)
        total = self.nbytes
        while total + size > self.budget:
            victim = next((n for n, c in self._by_length.items() if not c.marked), None)
            if victim is None:
                victim = next(iter(self._by_length))
            total -= self._by_length.pop(victim).nbytes
            self.evicted += 1
        self._by_length[checkpoint.length] = checkpoint
        return True

    def best(self, limit: int, *, with_logits_at: int | None = None) -> Checkpoint | None:
        """The longest checkpoint of at most `limit` tokens (one of exactly `with_logits_at` tokens only if it
        holds logits), marked as just used."""
        found = None
        for length, checkpoint in self._by_length.items():
            if length > limit or (length == with_logits_at and checkpoint.logits is None):
                continue
            if found is None or length > found.length:
                found = checkpoint
        if found is not None:
            self._by_length.move_to_end(found.length)
        return found

    def drop_past(self, length: int) -> None:
        """Forget every checkpoint longer than `length` (the rows past it are about to be overwritten)."""
        for n in [n for n in self._by_length if n > length]:
            del self._by_length[n]

    def clear(self) -> None:
        self._by_length.clear()
