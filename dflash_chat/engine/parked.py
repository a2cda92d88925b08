"""Conversations set aside in host memory while another one holds the model, so two chats at once (or an
agent's side requests with their own system prompt) do not make each other prefill again.

The engine's state holds one token sequence: the attention caches' rows, the GDN states and the drafters'
context (engine/spec.py), with checkpoints along it (engine/prefix_cache.py). A prompt that shares little of
it overwrites it from near the start. Before that happens, the held conversation is parked here: the rows of
every cache whose row j holds position j (the target's KV, the drafter's full-attention layers, the MTP
layer's), what truncating cannot bring back at its end (a Checkpoint: GDN states, rings, the MTP layer's
hidden state), and its own checkpoints and end-of-prompt snapshot, all copied to host memory. A later prompt
that a parked conversation serves better than the held one brings it back (the held one is parked in turn):
the rows are copied into the caches and the end checkpoint restored, which leaves exactly the state the
conversation had, and its checkpoints serve branches as before.

Like llama.cpp's server prompt cache in host RAM (`--cache-ram`), with the hybrid model's states and the
drafters' context kept beside the KV. Kept least recently used first out under a byte budget (the
`prefix_cache_ram_mib` setting); a conversation shorter than PARK_MIN tokens is not worth a copy (it
prefills again in a moment).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch

from dflash_chat.engine.prefix_cache import Checkpoint
from dflash_chat.engine.rules import PREFIX_CACHE_RAM_MIB_DEFAULT

PARK_MIN = 512  # tokens a conversation must hold to be parked
DEFAULT_PARK_BUDGET = PREFIX_CACHE_RAM_MIB_DEFAULT * 2**20  # bytes (the `prefix_cache_ram_mib` setting's)


@dataclass
class Parked:
    tokens: list[int]  # every token the state held
    rows: list[torch.Tensor]  # per row cache: its first len(tokens) rows, on the host
    end: Checkpoint  # the state at len(tokens), on the host
    checkpoints: list[Checkpoint]  # its checkpoints along its prompts (every one a prefix of tokens)
    snapshot: Checkpoint | None = None  # its last prompt's end, with the logits there

    @property
    def nbytes(self) -> int:
        rows = sum(t.numel() * t.element_size() for t in self.rows)
        return rows + sum(c.nbytes for c in (self.end, *self.checkpoints, *self._snapshot()))

    def _snapshot(self) -> list[Checkpoint]:
        return [self.snapshot] if self.snapshot is not None else []

    def reusable(self, prompt: list[int], any_length: bool) -> int:
        """Tokens of `prompt` this conversation's state can serve (`reusable`)."""
        held = (*self.checkpoints, *self._snapshot())
        return reusable(self.tokens, [c.length for c in held], prompt, any_length, ends_of(held))


def ends_of(checkpoints: Iterable[Checkpoint]) -> list[int]:
    """The lengths of those of `checkpoints` that hold their prompt's last logits (end-of-prompt snapshots)."""
    return [c.length for c in checkpoints if c.logits is not None]


def reusable(
    tokens: list[int], checkpoints: Iterable[int], prompt: list[int], any_length: bool = False, ends: Iterable[int] = ()
) -> int:
    """Tokens of `prompt` a state holding `tokens`, with checkpoints at the lengths `checkpoints`, serves without
    running them: all it holds when the prompt extends it, all of it when it is a prompt that ended at one of
    `ends` (a checkpoint with that prompt's last logits: the same prompt sent again), else the longest
    checkpoint within the shared prefix, or the whole shared prefix when the caches truncate to `any_length`
    (leaving at least the prompt's last token to run, as the engine does)."""
    common = common_prefix(tokens, prompt)
    if common == len(tokens) and common < len(prompt):
        return common
    if common >= len(prompt) and len(prompt) in set(ends):
        return len(prompt)
    within = min(common, len(prompt) - 1)
    return within if any_length else max((n for n in checkpoints if n <= within), default=0)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])


class Shelf:
    """Parked conversations, least recently parked first out under `budget` bytes (0: none kept), each of at
    least `min_tokens` tokens."""

    def __init__(self, budget: int, min_tokens: int = PARK_MIN) -> None:
        if budget < 0:
            raise ValueError(f"the parked conversations' budget must be 0 or more bytes, not {budget}")
        self.budget = budget
        self.min_tokens = min_tokens  # the fewest tokens worth parking
        self._parked: list[Parked] = []  # oldest first
        self.evicted = 0  # conversations dropped for the budget (for tests and figures)

    def __len__(self) -> int:
        return len(self._parked)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self._parked)

    def add(self, parked: Parked) -> bool:
        """Keep `parked`, dropping the oldest past the budget; False when it alone is over it."""
        size = parked.nbytes
        if size > self.budget:
            return False
        total = self.nbytes
        while self._parked and total + size > self.budget:
            total -= self._parked.pop(0).nbytes
            self.evicted += 1
        self._parked.append(parked)
        return True

    def take(self, prompt: list[int], better_than: int, any_length: bool = False) -> Parked | None:
        """The parked conversation that serves the most of `prompt`, if more than `better_than` tokens (and at
        least `min_tokens`), off the shelf; `any_length`: the engine's caches truncate to any length."""
        best, found = max(better_than, self.min_tokens - 1), None
        for parked in self._parked:
            n = parked.reusable(prompt, any_length)
            if n > best:
                best, found = n, parked
        if found is not None:
            self._parked.remove(found)
        return found

    def clear(self) -> None:
        self._parked.clear()


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` in host memory (pinned when it comes from a GPU, so the copies run at full speed): for
    the rows of live caches, which later positions overwrite."""
    if t.device.type == "cpu":
        return t.clone()
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return out.copy_(t)


def on_host(t: torch.Tensor) -> torch.Tensor:
    """A checkpoint's tensor in host memory: itself when it is there already (a checkpoint's tensors are copies
    that nothing writes in place, so the shelf may share them), else a pinned copy."""
    return t if t.device.type == "cpu" else to_host(t)


def checkpoint_to(checkpoint: Checkpoint, move) -> Checkpoint:
    """`checkpoint` with every tensor passed through `move` (on_host, or back to the device)."""
    return replace(
        checkpoint,
        recurrent=[(move(r), move(c)) for r, c in checkpoint.recurrent],
        rings=[None if ring is None else (move(ring[0]), move(ring[1])) for ring in checkpoint.rings],
        logits=None if checkpoint.logits is None else move(checkpoint.logits),
        mtp_last=None if checkpoint.mtp_last is None else move(checkpoint.mtp_last),
    )
