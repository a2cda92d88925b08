"""Sampling: greedy, temperature, top-k, top-p, min-p, and the exact speculative acceptance rule, all on
the model's device (no distribution is copied to the host).

The processed distribution is transformers' order: softmax(logits / temperature), the top-k kept, then
the smallest prefix whose mass reaches top-p, then those at least min-p times the likeliest (which both
keep), renormalised.

At temperature > 0 the draft logits are processed like the target's (temperature, top-k, top-p, min-p) into q,
each draft token d is drawn from its row of q, and the verify accepts d with probability
min(1, p(d) / q(d)), p being the target's processed distribution; at the first rejection the token is
drawn from norm(max(0, p - q)), after a full accept the bonus from p. The output is distributed exactly
as p: P(out = x) = min(p(x), q(x)) + (1 - sum min(p, q)) * max(0, p(x) - q(x)) / sum max(0, p - q) = p(x),
and a draft is accepted with probability sum min(p, q) (z-lab's dflash 07ebd93, vLLM, SGLang). A drafter
that proposes fixed tokens (one-hot q) is the special case: accept with p(d), else sample p without d.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from dflash_chat.engine.sampling_params import SamplingParams


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Target distribution after temperature, top-k, top-p and min-p; logits [..., V] -> probs [..., V] (float32)."""
    if narrows(params, logits.shape[-1]):
        ids, kept = candidates(logits, params)
        return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter(-1, ids, kept)
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0 or params.min_p > 0.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        probs = torch.zeros_like(probs).scatter(-1, order, _narrowed(sorted_probs, params))
    return probs


def narrows(params: SamplingParams, vocab: int) -> bool:
    """Whether top-k leaves fewer tokens than the vocabulary: then sampling works on the k candidates only."""
    return 0 < params.top_k < vocab


def candidates(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """The processed distribution's support when top-k narrows it: the k best ids [..., k], best first, and
    their probabilities after temperature, top-p and min-p (0 where one drops it). Only the k best are
    scaled, softmaxed and sorted, not the whole vocabulary (temperature keeps the order)."""
    best, ids = torch.topk(logits, params.top_k, dim=-1)
    return ids, _narrowed(torch.softmax(best.float() / params.temperature, dim=-1), params)


def noise_columns(params: SamplingParams, vocab: int) -> int | None:
    """Columns of exponential noise a draw from the processed distribution reads (None: every column)."""
    return params.top_k if narrows(params, vocab) else None


def _narrowed(sorted_probs: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Descending probabilities after top-p (the smallest prefix whose mass reaches it, at least one) and min-p
    (those at least min_p times the first, which is always kept), renormalised."""
    if params.top_p >= 1.0 and params.min_p <= 0.0:
        return sorted_probs
    drop = torch.zeros_like(sorted_probs, dtype=torch.bool)
    if params.top_p < 1.0:
        drop |= (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
    if params.min_p > 0.0:
        drop |= sorted_probs < params.min_p * sorted_probs[..., :1]
    kept = sorted_probs.masked_fill(drop, 0.0)
    return kept / kept.sum(-1, keepdim=True)


@dataclass
class Draws:
    """A step's randomness, drawn on the device into buffers made once: uniforms [B-1] that accept drafts,
    exponential noise [B, V] that samples the verify's own token from each row and [B-1, V] that samples
    the drafts (the exponential race: argmax p/E is distributed as p)."""

    uniform: torch.Tensor
    noise: torch.Tensor
    draft_noise: torch.Tensor

    @classmethod
    def empty(cls, rows: int, vocab: int, device: torch.device) -> Draws:
        drafts = max(rows - 1, 0)
        return cls(
            torch.empty(drafts, device=device),
            torch.empty(rows, vocab, device=device),
            torch.empty(drafts, vocab, device=device),
        )

    def fill(self, generator: torch.Generator, rows: int | None = None, columns: int | None = None) -> Draws:
        """New randomness in place for a verify of `rows` tokens (default: all) whose draws read `columns` of
        noise (`noise_columns`; default: all)."""
        rows = self.noise.shape[0] if rows is None else rows
        self.uniform[: rows - 1].uniform_(generator=generator)
        self.noise[:rows, :columns].exponential_(generator=generator)
        return self

    def fill_drafts(self, generator: torch.Generator, columns: int | None = None, rows: int | None = None) -> Draws:
        """New noise for the drafts: every row and column, or the first `rows` (the drafts a verify reads) and
        `columns` (a drafter that draws among its top candidates reads no more)."""
        self.draft_noise[:rows, :columns].exponential_(generator=generator)
        return self


def sample(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """One token per row of probs [..., V] (noise: exponential draws of the same shape), on the device."""
    return (probs / noise).argmax(dim=-1)


def sample_processed(
    logits: torch.Tensor, params: SamplingParams, noise: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Tokens drawn from the processed distribution of logits [..., V] (noise [..., >= its columns]); that
    distribution over the whole vocabulary goes to `out` [..., V] when given."""
    if not narrows(params, logits.shape[-1]):
        probs = probabilities(logits, params)
        if out is not None:
            out.copy_(probs)
        return sample(probs, noise)
    ids, kept = candidates(logits, params)
    if out is not None:
        out.zero_().scatter_(-1, ids, kept)
    return ids.gather(-1, sample(kept, noise[..., : ids.shape[-1]]).unsqueeze(-1)).squeeze(-1)


def first_token(logits: torch.Tensor, params: SamplingParams, draws: Draws | None) -> torch.Tensor:
    """The token after a prefill, from its last logits [V]: a 0-d device tensor."""
    if params.greedy:
        return logits.argmax(dim=-1)
    assert draws is not None, "sampling needs the step's draws"
    return sample_processed(logits, params, draws.noise[0])


def draft_tokens(
    logits: torch.Tensor, params: SamplingParams, draws: Draws | None, q_out: torch.Tensor | None = None
) -> torch.Tensor:
    """Draft tokens from draft logits [D, V]: the argmax when greedy; otherwise drawn from q, the logits
    processed like the target's, which is written into `q_out` [D, V] for the verify."""
    if params.greedy:
        return logits.argmax(dim=-1)
    assert draws is not None and q_out is not None, "sampled drafts need the step's draws and q_out"
    return sample_processed(logits, params, draws.draft_noise[: logits.shape[0]], q_out)


class Guide(Protocol):
    """A step's drafts held to a grammar as they are drawn, row after row (engine/structured.py's): each row's
    proposal is masked to what the grammar allows after the drafts before it and renormalised, so q is the
    distribution the draft was drawn from and no draft is one the grammar refuses (where it allows one token
    only, that is the draft: the grammar's forced tokens come as they are drawn)."""

    def allowed(self, row: int) -> torch.Tensor | None:
        """Bools [V] on the device: the tokens the grammar allows at draft `row`; None: any (it no longer holds)."""

    def take(self, row: int, token: torch.Tensor) -> None:
        """The draft drawn at `row` (a 1-element device tensor, read on the host): the grammar moves past it."""


def guided_draft(
    logits: torch.Tensor,
    row: int,
    params: SamplingParams,
    draws: Draws | None,
    q_out: torch.Tensor | None,
    guide: Guide,
) -> torch.Tensor:
    """Draft `row` [1] from its logits [1, V] held to `guide`: the argmax or a draw from q, the processed
    distribution of the logits the grammar allows (written to `q_out` [1, V])."""
    allowed = guide.allowed(row)
    masked = logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))
    token = draw_row(masked, row, params, draws, q_out)
    guide.take(row, token)
    return token


def draw_row(
    logits: torch.Tensor, row: int, params: SamplingParams, draws: Draws | None, q_out: torch.Tensor | None
) -> torch.Tensor:
    """Draft `row` [1] from its logits [1, V]: the argmax, or a draw (on the row's draft noise) from q, their
    processed distribution, written to `q_out` [1, V]."""
    if params.greedy:
        return logits.argmax(dim=-1)
    assert draws is not None and q_out is not None, "sampled drafts need the step's draws and q_out"
    return sample_processed(logits, params, draws.draft_noise[row : row + 1], q_out)


def q_row(q: torch.Tensor | None, row: int) -> torch.Tensor | None:
    """Row `row` of a q [D, V] as [1, V] (None for greedy drafts, which have none)."""
    return None if q is None else q[row : row + 1]


def accept(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    params: SamplingParams,
    draws: Draws | None,
    remaining: torch.Tensor,
    stop_ids: torch.Tensor,
    q: torch.Tensor | None = None,
) -> torch.Tensor:
    """The verify rule, on the device, with no host read: logits [T, V] of [last, d1..d(T-1)], drafts [T-1]
    and, when sampling, the drafter's processed distributions q [T-1, V] they were drawn from.

    Returns [T + 2] int64: tokens [T], whose first n are emitted, then n, then the accepted drafts.
    tokens[:accepted] are the accepted drafts, tokens[accepted] the target's own token (the correction at
    the first rejection, or the bonus after a full accept). Greedy: accept while the target's argmax equals
    the draft. Sampling: the exact rule in this module's docstring, every row's resample drawn at once.
    n = accepted + 1, cut after the first stop token (stop_ids, padded with -1) and to `remaining` (>= 1).
    """
    T = logits.shape[0]
    rows = torch.arange(T, device=logits.device)
    if params.greedy:
        tokens = logits.argmax(dim=-1)
        accepted = (tokens[: T - 1] == drafts).long().cumprod(0).sum()
    else:
        assert draws is not None, "sampling needs the step's draws"
        ok, resampled = _sampled_rule(logits, drafts, params, draws, q)
        accepted = ok.long().cumprod(0).sum()
        tokens = torch.where(rows < accepted, torch.cat((drafts, drafts.new_zeros(1))), resampled)
    stops = (tokens[:, None] == stop_ids[None, :]).any(dim=-1) & (rows <= accepted)
    first_stop = torch.where(stops, rows, T).min()
    n = torch.minimum(torch.minimum(accepted + 1, first_stop + 1), remaining)
    return torch.cat((tokens, n.reshape(1), accepted.reshape(1)))


def _sampled_rule(
    logits: torch.Tensor, drafts: torch.Tensor, params: SamplingParams, draws: Draws, q: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ok [T-1]: each draft passes u < p(d) / q(d), resampled [T]: each row's token drawn from
    norm(max(0, p - q)), the last row's from p). With top-k on, p lives on its k candidates and so does
    the residual: only those columns are compared, and drawn among."""
    T, V = logits.shape
    if T == 1:  # nothing was drafted (a plain step): the target's own token from p
        return drafts.new_zeros(0, dtype=torch.bool), sample_processed(logits, params, draws.noise[:1])
    assert q is not None, "sampled drafts need the q they were drawn from"
    if narrows(params, V):
        ids, p = candidates(logits, params)  # [T, k]
        p_d = (p[: T - 1] * (ids[: T - 1] == drafts[:, None])).sum(dim=-1)
        q_at = q[: T - 1].gather(1, ids[: T - 1])
    else:
        ids, p = None, probabilities(logits, params)
        p_d = p[: T - 1].gather(1, drafts[:, None])[:, 0]
        q_at = q[: T - 1]
    q_d = q[: T - 1].gather(1, drafts[:, None])[:, 0]
    ok = draws.uniform[: T - 1] * q_d < p_d  # u < p(d) / q(d)
    residual = torch.cat(((p[: T - 1] - q_at).clamp_(min=0.0), p[T - 1 :]))
    picked = sample(residual, draws.noise[:T, : residual.shape[1]])
    return ok, picked if ids is None else ids.gather(1, picked[:, None])[:, 0]
