"""A drafter that knows the answer: it proposes a reference continuation with errors injected.

Used to prove the loop lossless (every acceptance length and rollback offset occurs) and to
benchmark at a chosen acceptance: `dflash-chat bench` first decodes autoregressively to learn the
true continuation, then runs DFlash with this drafter.

Its errors are a function of the drafting position (tables drawn once per context), so any draft length
sees the same proposals for the same state, and a draft is a gather on the device.
"""

from __future__ import annotations

import torch

from dflash_chat.engine.sampling import draft_tokens


class OracleDrafter:
    def __init__(
        self,
        reference: list[int],
        vocab_size: int,
        *,
        block_size: int = 16,
        accept_prob: float = 0.8,
        mode: str = "geometric",
        seed: int = 0,
    ):
        """mode "geometric": each drafted token is right with probability accept_prob;
        mode "uniform": the first wrong position is uniform over 0..D (D = all right);
        mode "fixed": the first `round(accept_prob)` drafts are right and the next one wrong (a forced
        acceptance length, for benchmarks)."""
        self.reference = list(reference)
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.accept_prob = accept_prob
        self.mode = mode
        self.seed = seed
        self.target_layer_ids: list[int] = []
        self.ctx_len = 0
        # [positions, B-1]: what drafting at position p proposes (drawn by allocate)
        self.proposals = torch.empty(0, block_size - 1, dtype=torch.long)
        self._on: dict[torch.device, torch.Tensor] = {}

    def allocate(self, max_context: int) -> None:
        self.max_context = max_context
        self.proposals = self._draw_tables()
        self._on = {}
        self.ctx_len = 0

    def rebase(self, reference: list[int]) -> None:
        """A new true continuation; the tables stay where they are (a captured draft step keeps reading them)."""
        self.reference = list(reference)
        self.proposals = proposals = self._draw_tables()
        for table in self._on.values():
            table.copy_(proposals)

    def _draw_tables(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed)
        max_context = self.max_context
        rows, D = max_context + 1, self.block_size - 1
        truth = torch.randint(0, self.vocab_size, (rows + D + 1,), generator=g)
        known = torch.tensor(self.reference[: truth.shape[0]], dtype=torch.long)
        truth[: known.shape[0]] = known
        at = torch.arange(rows)[:, None] + 1 + torch.arange(D)[None, :]
        draft = truth[at]  # [rows, D]: the true continuation after each position
        if self.mode == "uniform":
            first_wrong = torch.randint(0, D + 1, (rows, 1), generator=g)
            wrong = torch.arange(D)[None, :] == first_wrong
        elif self.mode == "fixed":
            wrong = torch.arange(D)[None, :].expand(rows, D) == round(self.accept_prob)
        else:
            wrong = torch.rand(rows, D, generator=g) >= self.accept_prob
        shift = 1 + torch.randint(0, self.vocab_size - 1, (rows, D), generator=g)
        return torch.where(wrong, (draft + shift) % self.vocab_size, draft)

    def truncate(self, length: int) -> None:
        self.ctx_len = min(self.ctx_len, length)

    def append_context(self, features, start: int, rope=None) -> None:
        self.ctx_len = start  # it reads no target features

    ring_windows: list[int] = []  # it keeps no context rows

    def save_rings(self) -> list:
        return []

    def restore_rings(self, saved: list, length: int) -> None:
        self.ctx_len = length

    def row_caches(self) -> list:
        return []

    def store_context(self, features, positions, rope=None) -> None:
        pass

    def block_ids(self, device: torch.device) -> torch.Tensor:
        return torch.zeros(self.block_size, dtype=torch.long, device=device)

    def propose(
        self, ids: torch.Tensor, span, params, draws, q_out, drafts: int | None = None, guide=None
    ) -> torch.Tensor:
        """Its proposals (bench answers are never held to a grammar: `guide` is None)."""
        logits = self.draft_logits(ids, span)[:drafts]
        return draft_tokens(logits, params, draws, q_out[: logits.shape[0]] if q_out is not None else None)

    def draft_logits(self, ids: torch.Tensor, span) -> torch.Tensor:
        """One-hot logits [B-1, V] of the proposals for the block at span.pos[0]: a greedy verify takes their
        argmax, a sampled one a one-hot q (accept with p(d))."""
        table = self._on.get(ids.device)
        if table is None:
            table = self._on[ids.device] = self.proposals.to(ids.device)
        proposal = table.index_select(0, span.pos[:1]).reshape(-1, 1)
        logits = torch.full((proposal.shape[0], self.vocab_size), float("-inf"), device=ids.device)
        return logits.scatter_(1, proposal, 0.0)
