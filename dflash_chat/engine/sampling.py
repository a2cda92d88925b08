"""Sampling: greedy, temperature, top-k, top-p, and the exact speculative acceptance rule.

With a greedy (one-hot) draft token d and the target's processed distribution p, accepting d with
probability p(d) and otherwise sampling from p with d removed (renormalised) yields exactly p:
P(out = d) = p(d); P(out = x != d) = (1 - p(d)) * p(x) / (1 - p(d)) = p(x).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 512
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Target distribution after temperature, top-k and top-p; logits [..., V] -> probs [..., V] (float32).

    With top-k only the k best are softmaxed and sorted (not the ~250k-token vocabulary every step).
    """
    scores = logits.float() / params.temperature
    if 0 < params.top_k < scores.shape[-1]:
        best, order = torch.topk(scores, params.top_k, dim=-1)  # sorted, best first
        kept = _top_p(torch.softmax(best, dim=-1), params.top_p)
        return torch.zeros_like(scores).scatter(-1, order, kept)
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        probs = torch.zeros_like(probs).scatter(-1, order, _top_p(sorted_probs, params.top_p))
    return probs


def _top_p(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix of descending probabilities whose mass reaches top_p (at least one), renormalised."""
    if top_p >= 1.0:
        return sorted_probs
    drop = (sorted_probs.cumsum(-1) - sorted_probs) >= top_p
    kept = sorted_probs.masked_fill(drop, 0.0)
    return kept / kept.sum(-1, keepdim=True)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from probs [V]; drawn on the CPU so one seeded generator serves every device."""
    return int(torch.multinomial(probs.float().cpu(), 1, generator=generator).item())


def verify(
    draft: torch.Tensor, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> list[int]:
    """Accept a prefix of `draft` [D] against target `logits` [D+1, V]; the tokens to emit.

    That is the accepted drafts, then the target's own token: the correction at the first rejection,
    or the bonus after a full accept (so len - 1 drafts were accepted). Greedy: accept while the
    target's argmax equals the draft. Sampling: the exact rule above.
    """
    D = draft.shape[0]
    if params.greedy:
        both = torch.cat((logits.argmax(dim=-1), draft)).tolist()  # one device-to-host copy
        choice, drafted = both[: D + 1], both[D + 1 :]
        accepted = next((i for i in range(D) if choice[i] != drafted[i]), D)
        return drafted[:accepted] + [choice[accepted]]
    probs = probabilities(logits, params)
    p_draft = probs[torch.arange(D, device=probs.device), draft]
    # one device-to-host copy: float64 holds both the float32 probabilities and the token ids exactly
    p_draft, drafted = torch.stack((p_draft.double(), draft.double())).tolist()
    drafted = [int(d) for d in drafted]
    uniforms = torch.rand(D, generator=generator).tolist()
    for i in range(D):
        if uniforms[i] >= p_draft[i]:
            residual = probs[i].float().cpu()
            residual[drafted[i]] = 0.0
            total = float(residual.sum())
            if total <= 0:  # p(d) was 1 up to rounding: d is the only possible token
                return drafted[: i + 1]
            return drafted[:i] + [draw(residual / total, generator)]
    return drafted + [draw(probs[D], generator)]
