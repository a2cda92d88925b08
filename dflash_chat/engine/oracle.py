"""A drafter that knows the answer: it proposes a reference continuation with errors injected.

Used to prove the loop lossless (every acceptance length and rollback offset occurs) and to
benchmark at a chosen acceptance: `dflash-chat bench` first decodes autoregressively to learn the
true continuation, then runs DFlash with this drafter.
"""

from __future__ import annotations

import random

import torch


class OracleDrafter:
    def __init__(self, reference: list[int], vocab_size: int, *, block_size: int = 16,
                 accept_prob: float = 0.8, mode: str = "geometric", seed: int = 0):
        """mode "geometric": each drafted token is right with probability accept_prob;
        mode "uniform": the first wrong position is uniform over 0..D (D = all right)."""
        self.reference = list(reference)
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.accept_prob = accept_prob
        self.mode = mode
        self.rng = random.Random(seed)
        self.target_layer_ids: list[int] = []

    def allocate(self, max_context: int) -> None:
        pass

    def truncate(self, length: int) -> None:
        pass

    def append_context(self, features, start: int) -> None:
        pass  # it reads no target features

    def _truth(self, position: int) -> int:
        if position < len(self.reference):
            return self.reference[position]
        return self.rng.randrange(self.vocab_size)

    def _wrong(self, token: int) -> int:
        return (token + 1 + self.rng.randrange(self.vocab_size - 1)) % self.vocab_size

    def propose(self, last_token: int, start: int, length: int) -> torch.Tensor:
        draft = [self._truth(start + 1 + i) for i in range(length)]
        if self.mode == "uniform":
            first_wrong = self.rng.randint(0, length)
            wrong = [i == first_wrong for i in range(length)]
        else:
            wrong = [self.rng.random() >= self.accept_prob for _ in range(length)]
        return torch.tensor([last_token] + [self._wrong(t) if w else t for t, w in zip(draft, wrong)], dtype=torch.long)
