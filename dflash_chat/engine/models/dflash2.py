"""The DFlash2 draft model: DFlash's layers with a grouped dynamic convolution around each attention and
MLP, and a candidate selector that walks a coherent path through each position's best tokens.

As z-lab/dflash 07ebd93 defines them (`GroupedDynamicCausalConv`, `CandidateSelector`, `DFlash2DraftModel`):

- Convolution over the block's rows, per channel c of group g(c): out[i, c] = sum_t (base[t, c] +
  dyn[i, t, g(c)]) * x[i - t, c], rows before the block's first counting as zero. `kernel_projection`
  predicts both sides' dynamic parts from the sublayer's (normed) input: side 0 convolves that input,
  side 1 the sublayer's output.
- The selector: the draft logits' top-K candidates per position; walking from the anchor (the block's
  first token), a candidate b after predecessor a scores unary(b) + <A[a] * P h, B[b]>, A and B the
  predecessor and successor codebooks, P the hidden projection. Greedy takes the best; at temperature
  T > 0 the step draws from softmax(scores / T), which is the proposal q the exact verify needs (its
  support is the K candidates).
- The draft logits are the target head's, times `output_multiplier`, then soft-capped (cap * tanh(x / cap))
  when the config names a cap; the block's input embeddings are scaled by `input_embedding_scale`.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_chat.engine.models.config import DFlash2Config, DrafterConfig
from dflash_chat.engine.models.dflash import DFlashDrafter, DraftLayer
from dflash_chat.engine.sampling import Draws, Guide, draw_row, q_row
from dflash_chat.engine.sampling_params import SamplingParams


def shifted(x: torch.Tensor, t: int) -> torch.Tensor:
    """x [A, B, ...] moved t rows down inside each block, zeros entering at the block's start."""
    if t == 0:
        return x
    return torch.cat((torch.zeros_like(x[:, :t]), x[:, :-t]), dim=1)


class GroupedDynamicConv(nn.Module):
    """The two-sided convolution around one sublayer: `base_kernel` [2, taps, H], `kernel_projection` H ->
    2 * taps * groups (checkpoint names)."""

    def __init__(self, hidden: int, taps: int, group_size: int):
        super().__init__()
        self.taps, self.group_size, self.groups = taps, group_size, hidden // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, taps, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * taps * self.groups, bias=False)

    def prepare(self, x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x convolved with side 0, the dynamic kernel of side 1 [n, taps, groups]) for rows x [n, H] in
        blocks of `block` rows."""
        dynamic = self.kernel_projection(x).view(x.shape[0], 2, self.taps, self.groups)
        return self._convolve(x, dynamic[:, 0], 0, block), dynamic[:, 1]

    def finish(self, x: torch.Tensor, dynamic: torch.Tensor, block: int) -> torch.Tensor:
        """The sublayer's output x [n, H] convolved with side 1."""
        return self._convolve(x, dynamic, 1, block)

    def _convolve(self, x: torch.Tensor, dynamic: torch.Tensor, side: int, block: int) -> torch.Tensor:
        n, H = x.shape
        grouped = x.view(n // block, block, self.groups, self.group_size)
        dyn = dynamic.to(x.dtype).view(n // block, block, self.taps, self.groups, 1)
        base = self.base_kernel[side].to(x.dtype).view(self.taps, self.groups, self.group_size)
        out = torch.zeros_like(grouped)
        for t in range(self.taps):
            out = out + (base[t] + dyn[:, :, t]) * shifted(grouped, t)
        return out.view(n, H)


class DFlash2Layer(DraftLayer):
    def __init__(self, cfg: DrafterConfig, layer_type: str, causal: bool):
        super().__init__(cfg, layer_type, causal)
        d2 = dflash2_part(cfg)
        self.attention_conv = GroupedDynamicConv(cfg.hidden_size, d2.conv_kernel_size, d2.conv_group_size)
        self.mlp_conv = GroupedDynamicConv(cfg.hidden_size, d2.conv_kernel_size, d2.conv_group_size)

    def attention_input(self, x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.attention_conv.prepare(self.input_layernorm(x), block)

    def after_attention(self, x: torch.Tensor, out: torch.Tensor, carried: torch.Tensor, block: int) -> torch.Tensor:
        x = x + self.attention_conv.finish(out, carried, block)
        h, dynamic = self.mlp_conv.prepare(self.post_attention_layernorm(x), block)
        return x + self.mlp_conv.finish(self.mlp(h), dynamic, block)


class CandidateSelector(nn.Module):
    """`predecessor_codebook` and `successor_codebook` [V, rank], `hidden_projection` H -> rank."""

    def __init__(self, vocab: int, hidden: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab, rank))
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)

    def candidates(self, logits: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(unary [D, K] float32, candidate ids [D, K], their successor codes [D, K, rank], projected hidden
        [D, rank]) for draft logits [D, V] and hidden states [D, H]."""
        unary, ids = torch.topk(logits.float(), self.top_k, dim=-1)
        successors = self.successor_codebook.index_select(0, ids.reshape(-1)).view(*ids.shape, -1).float()
        return unary, ids, successors, self.hidden_projection(hidden).float()

    def scores(
        self, unary: torch.Tensor, successors: torch.Tensor, projected: torch.Tensor, predecessors: torch.Tensor
    ) -> torch.Tensor:
        """Scores [N, P, K] of each position's K candidates after each of its P predecessor token ids [N, P]:
        unary + <A[a] * P h, B[b]> (the walk scores every predecessor at once, training the true one)."""
        gates = self.predecessor_codebook.index_select(0, predecessors.reshape(-1)).view(*predecessors.shape, -1)
        gates = gates.float() * projected[:, None, :]
        return unary[:, None, :] + gates @ successors.transpose(1, 2)

    def walk(
        self,
        logits: torch.Tensor,
        hidden: torch.Tensor,
        anchor: torch.Tensor,
        params: SamplingParams,
        draws: Draws | None,
        q_out: torch.Tensor | None,
        guide: Guide | None = None,
    ) -> torch.Tensor:
        """The path [D] from the anchor (a 1-element id tensor), on the device: each step's best candidate when
        greedy, else one drawn from softmax(scores / T) (exponential race on the step's draft noise), whose
        distribution over the vocabulary goes to q_out [D, V]. The scores are computed for every step and
        predecessor first; the walk itself only gathers. With a `guide`, `guided_walk`."""
        if guide is not None:
            return self.guided_walk(logits, hidden, anchor, params, draws, q_out, guide)
        unary, ids, successors, projected = self.candidates(logits, hidden)
        # step t's predecessors: the anchor for t = 0 (every row alike), else position t - 1's candidates
        predecessors = torch.cat((anchor.reshape(1, 1).expand(1, ids.shape[1]), ids[:-1]))
        scores = self.scores(unary, successors, projected, predecessors)  # [D, K, K]
        at = torch.zeros(1, dtype=torch.long, device=ids.device)  # the predecessor's index (any row for t = 0)
        path = []
        if q_out is not None and not params.greedy:
            q_out[: ids.shape[0]].zero_()  # once for every row (`_choose` writes into zeroed rows)
        for t in range(ids.shape[0]):
            at = self._choose(scores[t].index_select(0, at), ids[t], t, params, draws, q_row(q_out, t))
            path.append(ids[t].index_select(0, at))
        return torch.cat(path)

    def guided_walk(
        self,
        logits: torch.Tensor,
        hidden: torch.Tensor,
        anchor: torch.Tensor,
        params: SamplingParams,
        draws: Draws | None,
        q_out: torch.Tensor | None,
        guide: Guide,
    ) -> torch.Tensor:
        """The walk held to a grammar, one step after another: each step's candidates are the top K of its logits
        the grammar allows there, scored after the token actually drafted before it; where nothing it allows is
        among the K, the step draws from the masked logits as a DFlash drafter does. Where the grammar allows
        everything, the same path as `walk`."""
        path, before = [], anchor.reshape(1)
        for t in range(logits.shape[0]):
            q, allowed = q_row(q_out, t), guide.allowed(t)
            row = logits[t : t + 1] if allowed is None else logits[t : t + 1].masked_fill(~allowed, float("-inf"))
            found = self.candidates(row, hidden[t : t + 1])
            if bool(found[0][0, 0].isfinite()):
                token = self._step(found, before, t, params, draws, q)
            else:
                token = draw_row(row, t, params, draws, q)
            guide.take(t, token)
            path.append(token)
            before = token
        return torch.cat(path)

    def _step(self, found, before, t: int, params: SamplingParams, draws: Draws | None, q) -> torch.Tensor:
        """One position's draft [1] among its candidates `found` (`candidates` of one row) after the token `before`
        [1] (`_choose`)."""
        unary, ids, successors, projected = found
        scores = self.scores(unary, successors, projected, before.reshape(1, 1))[:, 0]  # [1, K]
        if q is not None and not params.greedy:
            q.zero_()
        return ids[0].index_select(0, self._choose(scores, ids[0], t, params, draws, q))

    def _choose(
        self,
        scores: torch.Tensor,
        ids: torch.Tensor,
        t: int,
        params: SamplingParams,
        draws: Draws | None,
        q: torch.Tensor | None,
    ) -> torch.Tensor:
        """The index [1] of step t's draft among its candidates `ids` [K] scored `scores` [1, K]: the best, or one
        drawn from softmax(scores / T) (an exponential race on the step's draft noise), whose distribution over
        the vocabulary goes into q [1, V], zeroed by the caller (the walk zeroes every row with one kernel)."""
        if params.greedy:
            return scores.argmax(dim=-1)
        assert draws is not None and q is not None, "a sampled walk needs the step's draws and q_out"
        weights = torch.softmax(scores / params.temperature, dim=-1)
        q[0].scatter_(0, ids, weights[0])
        return (weights / draws.draft_noise[t : t + 1, : self.top_k]).argmax(dim=-1)


class DFlash2Drafter(DFlashDrafter):
    layer_class = DFlash2Layer

    def __init__(self, cfg: DrafterConfig, target_hidden_size: int | None = None, vocab_size: int | None = None):
        d2 = dflash2_part(cfg)
        super().__init__(cfg, target_hidden_size)
        self.embedding_scale = d2.input_embedding_scale
        self.candidate_selector = CandidateSelector(
            vocab_size or 0, cfg.hidden_size, d2.selector_rank, d2.selector_top_k
        )

    @property
    def draft_noise_columns(self) -> int:
        """The sampled walk draws each step among the top K candidates: it reads K columns of draft noise."""
        return self.candidate_selector.top_k

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        d2 = dflash2_part(self.cfg)
        logits = super().logits(hidden)
        if d2.output_multiplier != 1.0:
            logits = logits * d2.output_multiplier
        if d2.final_logit_softcapping is not None:
            logits = d2.final_logit_softcapping * torch.tanh(logits / d2.final_logit_softcapping)
        return logits


def dflash2_part(cfg: DrafterConfig) -> DFlash2Config:
    """What a DFlash2 drafter's config adds to DFlash's (a DFlash config has none)."""
    if cfg.dflash2 is None:
        raise ValueError("a DFlash2 drafter needs the config's DFlash2 part")
    return cfg.dflash2


def build_drafter(cfg: DrafterConfig, target_hidden_size: int, vocab_size: int) -> DFlashDrafter:
    """The drafter a config describes: DFlash2 when its architectures say so, else DFlash."""
    if cfg.dflash2 is not None:
        return DFlash2Drafter(cfg, target_hidden_size, vocab_size)
    return DFlashDrafter(cfg, target_hidden_size)
