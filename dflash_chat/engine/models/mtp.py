"""The target's own multi-token prediction layer (MTP): Qwen3.5/3.6's `mtp.*`, llama.cpp's `blk.N.nextn.*`.

Row p pairs the target's final-normed hidden state at position p with the embedding of the token at p + 1:
each is RMS-normed by its own norm (`pre_fc_norm_hidden`, `pre_fc_norm_embedding`), they are concatenated
embedding first and projected by `fc` (2H -> H); one Qwen3.5 full-attention decoder layer (gated attention,
q/k norms, the target's partial RoPE at position p; routed experts on the MoE target) and the layer's own
final norm follow, and the target's LM head turns that into logits for the token at p + 2. It borrows the
target's embedding, head and RoPE (`bind`). docs/ARCHITECTURE.md, *The MTP layer*, cites each rule.

Drafting k tokens chains the layer on its own output: the normed output of row p is the hidden state of
row p + 1, paired with the token that row drafted.

Its K/V cache is indexed by position like the target's. The pair of a committed position p needs the
token at p + 1, known one step later, so the layer keeps `last`, the normed target hidden state of the
newest committed position, and stores each pair when its token arrives (`append_context` after a
prefill, `commit_context` after a verify). A verify's rows past the accepted ones store wrong pairs at
positions past the newest committed one; the next draft's first row or the next commit rewrites each of
them before any query reads it (a query reads only positions up to its own, and writes its own first).

On a prompt with images each row rotates by the target's M-RoPE position of its own token, and a row whose next
token is an image's takes that token's image features as its embedding, as vLLM runs the Qwen3.5 MTP layer
(docs/ARCHITECTURE.md, *Drafting on prompts with images*); the rows after the prompt rotate at their index plus
the prompt's offset.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_chat.engine.models.config import TargetConfig
from dflash_chat.engine.models.image_prompt import mrope_axes, mrope_cos_sin
from dflash_chat.engine.models.layers import RMSNorm, Rotary
from dflash_chat.engine.models.span import Span
from dflash_chat.engine.models.target import DecoderLayer, add_norm
from dflash_chat.engine.sampling import Guide, draw_row, guided_draft, q_row
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.state import AttentionCache


class MTPHead(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        H, eps, centred = cfg.hidden_size, cfg.rms_norm_eps, cfg.zero_centred_norm
        self.hidden_size = H
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(H, eps, centred)
        self.pre_fc_norm_hidden = RMSNorm(H, eps, centred)
        self.layers = nn.ModuleList([DecoderLayer(cfg, "full_attention")])
        self.norm = RMSNorm(H, eps, centred)
        self.cache: AttentionCache | None = None
        self.last = torch.zeros(0)  # [1, H]: the normed target hidden state of the newest committed position
        self._embed: nn.Module | None = None
        self._lm_head: nn.Module | None = None
        self._final_norm: nn.Module | None = None
        self._rotary: Rotary | None = None
        self._mrope = (cfg.rotary_dim, cfg.mrope_section)  # which M-RoPE position each frequency reads

    @property
    def layer(self) -> DecoderLayer:
        return self.layers[0]  # type: ignore[return-value]

    @property
    def rotary(self) -> Rotary:
        """The target's RoPE (bound)."""
        if self._rotary is None:
            raise RuntimeError("the MTP layer is not bound to a target yet: bind() it first")
        return self._rotary

    # -- wiring -----------------------------------------------------------------
    def bind(self, target) -> None:
        """Borrow the target's embedding, LM head, final norm and RoPE (not registered: not our weights)."""
        object.__setattr__(self, "_embed", target.model.embed_tokens)
        object.__setattr__(self, "_lm_head", target.lm_head)
        object.__setattr__(self, "_final_norm", target.model.norm)
        object.__setattr__(self, "_rotary", target.rotary)

    def allocate(self, max_len: int) -> None:
        p = self.norm.weight
        self.cache = self.layer.self_attn.new_cache(max_len, p.device, p.dtype)
        self.last = torch.zeros(1, self.hidden_size, dtype=p.dtype, device=p.device)

    # -- the layer ----------------------------------------------------------------
    def rows(self, hidden: torch.Tensor, ids: torch.Tensor, embeds: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's input rows from normed target hidden states [n, H] and the next tokens' ids [n] (or their
        input embeddings [n, H], an image's features among them)."""
        dtype = self.norm.weight.dtype
        embedded = (_borrowed(self._embed)(ids) if embeds is None else embeds).to(dtype)
        joined = torch.cat((self.pre_fc_norm_embedding(embedded), self.pre_fc_norm_hidden(hidden.to(dtype))), dim=-1)
        return self.fc(joined)

    def forward(self, hidden: torch.Tensor, ids: torch.Tensor, span: Span) -> torch.Tensor:
        """The normed outputs [n, H] of the rows (hidden, ids) at `span`; their K/V go into the cache and each
        attends to the cached positions up to its own."""
        assert self.cache is not None, "allocate() the MTP layer first"
        cos, sin = self.rotary.at(span.rotated, self.norm.weight.dtype)
        x, mlp = self.layer(self.rows(hidden, ids), None, self.cache, span, cos, sin, False)
        return add_norm(self.norm, x, mlp)[1]

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return _borrowed(self._lm_head)(out).float()

    def normed(self, features: torch.Tensor) -> torch.Tensor:
        """The target's final norm of its last layer's output (the hidden state its LM head reads)."""
        return _borrowed(self._final_norm)(features.to(self.norm.weight.dtype))

    # -- context ------------------------------------------------------------------
    def _store(
        self,
        hidden: torch.Tensor,
        ids: torch.Tensor,
        positions: torch.Tensor,
        rope: torch.Tensor | None = None,
        embeds: torch.Tensor | None = None,
    ) -> None:
        """K/V of the rows (hidden, ids) at `positions`: the layer's attention input, no attention run. `rope`: the
        positions they rotate by where not these, [n] or M-RoPE's [3, n]; `embeds`: the ids' input embeddings."""
        assert self.cache is not None, "allocate() the MTP layer first"
        dtype = self.norm.weight.dtype
        if rope is not None and rope.dim() == 2:
            cos, sin = mrope_cos_sin(self.rotary, rope, mrope_axes(*self._mrope), dtype)
        else:
            cos, sin = self.rotary.at(positions if rope is None else rope, dtype)
        x = self.layer.input_layernorm(self.rows(hidden, ids, embeds))
        self.layer.self_attn.into_cache(x, cos, sin, positions, self.cache.k, self.cache.v, queries=False)

    @torch.no_grad()
    def append_context(
        self,
        features: torch.Tensor,
        ids: torch.Tensor,
        start: int,
        embeds: torch.Tensor | None = None,
        rope: torch.Tensor | None = None,
    ) -> None:
        """A prefill's n tokens `ids` at positions start.. and the target's last-layer output there
        [n, H]: the pairs of positions start-1 .. start+n-2 are stored, `last` becomes position start+n-1's.
        A prompt with images gives the tokens' input embeddings `embeds` [n, H] and `rope` [3, n], the M-RoPE
        positions of start-1 .. start+n-2 (the first any when start is 0)."""
        normed = self.normed(features)
        hidden, first = torch.cat((self.last, normed[:-1])), start - 1
        if first < 0:  # nothing precedes position 0
            hidden, ids, first = hidden[1:], ids[1:], 0
            embeds = None if embeds is None else embeds[1:]
            rope = None if rope is None else rope[:, 1:]
        if ids.shape[0]:
            self._store(hidden, ids, torch.arange(first, first + ids.shape[0], device=ids.device), rope, embeds)
        self.last.copy_(normed[-1:])

    @torch.no_grad()
    def commit_context(
        self,
        features: torch.Tensor,
        ids: torch.Tensor,
        positions: torch.Tensor,
        newest: torch.Tensor,
        rope: torch.Tensor | None = None,
    ) -> None:
        """A verify of ids [T] = [last, d1 ..] at `positions` (rotated at `rope`, where given) committed its first
        n rows: the pairs of positions - 1 are stored and `last` becomes the normed row `newest` (n - 1, a device
        index) of the target's last-layer output `features` [T, H]. Reads no host value."""
        normed = self.normed(features)
        self._store(torch.cat((self.last, normed[:-1])), ids, positions - 1, None if rope is None else rope - 1)
        self.last.copy_(normed.index_select(0, newest.reshape(1)))

    # -- drafting -----------------------------------------------------------------
    @torch.no_grad()
    def propose(
        self,
        last_id: torch.Tensor,
        start: torch.Tensor,
        bound: int,
        params: SamplingParams,
        draws,
        q_out: torch.Tensor | None,
        drafts: int,
        shift: torch.Tensor | None = None,
        guide: Guide | None = None,
    ) -> torch.Tensor:
        """`drafts` tokens after `last_id` [1] (the token at the committed length `start`, a device scalar),
        the layer chained on its own output from `last`; sampled from their processed distributions at T > 0,
        which go to q_out [drafts, V]. Reads no host value, unless a `guide` holds the drafts to a grammar (it
        reads each as it is drawn); `bound`: cache rows an uncaptured
        query reads; `shift`: the rows rotate at their positions plus it (a 0-d device tensor: the prompt's
        M-RoPE offset)."""
        offsets = torch.zeros(1, dtype=torch.long, device=start.device)
        hidden, token, out = self.last, last_id.reshape(1), []
        for j in range(drafts):
            span = Span.fixed(start + (j - 1), offsets, bound, shift)
            hidden = self.forward(hidden, token, span)
            logits = self.logits(hidden)
            q = q_row(q_out, j)
            token = (
                draw_row(logits, j, params, draws, q)
                if guide is None
                else guided_draft(logits, j, params, draws, q, guide)
            )
            out.append(token)
        return torch.cat(out)


def _borrowed(module: nn.Module | None) -> nn.Module:
    if module is None:
        raise RuntimeError("the MTP layer is not bound to a target yet: bind() it first")
    return module
