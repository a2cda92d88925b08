"""The DFlash draft model: a few Qwen3-style layers drafting a whole block in one forward.

It has no embedding or LM head of its own: `bind()` borrows the target's. Context comes from the
target's hidden states after the layers in `target_layer_ids`, concatenated, projected by `fc` and
normed by `hidden_norm`; every draft layer turns those rows into extra keys/values (its own k_proj,
v_proj, k_norm, RoPE at the context positions). Queries come only from the block
[last committed token, mask x (B-1)]; keys are [context ; block] at their positions. Causality per layer,
as z-lab trained the released drafters (z-lab/dflash 07ebd93): unless the checkpoint states one for all
layers (`DrafterConfig.causal`), a sliding layer is causal (a block query sees the context and the block
up to its own position, and only keys less than `sliding_window` positions back) and a full layer sees
the whole block both ways. A bidirectional sliding layer's window reaches `sliding_window` both ways.

Inference keeps the context K/V of committed positions only (`append_context` adds the newly
committed rows; `draft_logits` drafts after them); `forward_train` runs many blocks over one sequence at once, for training.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import nn

from dflash_chat.engine.models.attention import Projections, attend, attend_cache, causal_mask
from dflash_chat.engine.models.config import DrafterConfig, RopeScaling
from dflash_chat.engine.models.layers import MLP, PreNormBlock, RMSNorm, Rotary
from dflash_chat.engine.models.span import Span
from dflash_chat.engine.sampling import Draws, Guide, draft_tokens, guided_draft, q_row
from dflash_chat.engine.sampling_params import SamplingParams


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim / 2], attention factor on cos/sin) as transformers computes them."""
    base = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)
    if scaling.kind == "default":
        return 1.0 / base, 1.0
    if scaling.kind == "linear":
        return 1.0 / (scaling.factor * base), 1.0
    return _yarn(head_dim, theta, base, scaling)


def _yarn(dim: int, theta: float, base: torch.Tensor, s: RopeScaling) -> tuple[torch.Tensor, float]:
    """YaRN: interpolated frequencies below a ramp, extrapolated above it, and an attention factor."""

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    factor = s.attention_factor
    if factor is None:
        factor = (
            mscale(s.factor, s.mscale) / mscale(s.factor, s.mscale_all_dim)
            if s.mscale and s.mscale_all_dim
            else mscale(s.factor)
        )

    def correction_dim(rotations: float) -> float:
        return dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float) - low) / (high - low)).clamp(0, 1)
    extrapolated = 1 - ramp
    inv_freq = 1.0 / (s.factor * base) * (1 - extrapolated) + 1.0 / base * extrapolated
    return inv_freq, float(factor)


def drafter_rotary(cfg: DrafterConfig) -> Rotary:
    inv_freq, factor = rope_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    return Rotary(cfg.head_dim, cfg.rope_theta, inv_freq=inv_freq, attention_factor=factor)


class DraftAttention(Projections):
    def __init__(self, cfg: DrafterConfig, layer_type: str, causal: bool):
        super().__init__(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps)
        self.window = cfg.sliding_window if layer_type == "sliding_attention" else None
        self.causal = causal

    def mask(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, same_block: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Visibility [Q, K], or None when every key is visible.

        `same_block` [Q, K] is True where key and query belong to the same block (or the key is context
        that precedes the query's block); None: the queries are one block over its own context.
        Inside that, sliding layers see only the window and causal layers only positions up to the query's.
        """
        if not (self.causal or self.window):
            return same_block
        visible = causal_mask(q_pos, k_pos, self.window, self.causal)
        return visible if same_block is None else visible & same_block


class DraftLayer(PreNormBlock):
    def __init__(self, cfg: DrafterConfig, layer_type: str, causal: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg, layer_type, causal)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def attention_input(self, x: torch.Tensor, block: int) -> tuple[torch.Tensor, Any]:
        """(what attention reads, what `after_attention` needs) for rows x [n, H] laid out in blocks of `block`."""
        return self.input_layernorm(x), None

    def after_attention(self, x: torch.Tensor, out: torch.Tensor, carried: Any, block: int) -> torch.Tensor:
        """The residual stream after the attention output `out` [n, H] and the MLP; `carried` is what this
        layer's own `attention_input` returned (its type is the subclass's business)."""
        return self.finish(x, out)


class DFlashDrafter(nn.Module):
    layer_class = DraftLayer
    embedding_scale = 1.0  # on the block's input embeddings

    def __init__(self, cfg: DrafterConfig, target_hidden_size: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.block_size = cfg.block_size
        self.mask_token_id = cfg.mask_token_id
        self.target_layer_ids = list(cfg.target_layer_ids)
        target_hidden = target_hidden_size or cfg.hidden_size
        self.fc = nn.Linear(len(cfg.target_layer_ids) * target_hidden, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(
            self.layer_class(cfg, t, c) for t, c in zip(cfg.layer_types, cfg.layer_causal, strict=True)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = drafter_rotary(cfg)
        self._embed: nn.Module | None = None
        self._lm_head: nn.Module | None = None
        self._final_norm: nn.Module | None = None
        self._normed_slice: slice | None = None
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer: K and V [rows, kv_heads, head_dim]
        self.ctx_len = 0
        self.context_rows = 0

    @property
    def draft_layers(self) -> Sequence[DraftLayer]:
        """`layers` as the layers they are (an nn.ModuleList's items are typed as plain Modules)."""
        return cast("Sequence[DraftLayer]", self.layers)

    # -- wiring -----------------------------------------------------------------
    def bind(
        self,
        embed_tokens: nn.Module,
        lm_head: nn.Module,
        final_norm: nn.Module | None = None,
        target_layers: int | None = None,
    ) -> None:
        """Borrow the target's embedding and LM head (not registered: they are not our weights).

        With `final_norm` and the target's layer count, a tap of its last layer is final-normed here
        (the target hands over every tap as the layer's own output), as in z-lab's reference, unless
        the config says the drafter was trained on the raw output.
        """
        object.__setattr__(self, "_embed", embed_tokens)
        object.__setattr__(self, "_lm_head", lm_head)
        last = target_layers - 1 if target_layers else None
        if final_norm is not None and self.cfg.last_layer_tap == "normed" and last in self.target_layer_ids:
            k = self.target_layer_ids.index(last)
            width = self.fc.in_features // len(self.target_layer_ids)
            object.__setattr__(self, "_final_norm", final_norm)
            self._normed_slice = slice(k * width, (k + 1) * width)

    def allocate(self, max_context: int) -> None:
        """Preallocate the context K/V caches for `max_context` positions. A sliding-window layer never looks
        further back than its window from the block it drafts, so it keeps a ring of window + B rows
        (position j in row j mod rows); full layers keep every position."""
        p = self.norm.weight  # fc may be a quantized module: the norm holds the compute dtype
        self.cache = []
        for layer in self.draft_layers:
            window = layer.self_attn.window
            rows = min(max_context, window + self.block_size) if window else max_context
            shape = (rows, self.cfg.num_kv_heads, self.cfg.head_dim)
            self.cache.append(
                (torch.zeros(shape, dtype=p.dtype, device=p.device), torch.zeros(shape, dtype=p.dtype, device=p.device))
            )
        self.rotary.allocate(max_context, p.dtype)
        self.context_rows = max_context  # a full layer's rows; a sliding layer's ring has fewer
        self.ctx_len = 0

    def truncate(self, length: int) -> None:
        """Forget context positions >= length (prefix reuse after the prompt diverged). A sliding layer's ring
        may no longer hold the window before `length` (see `ring_window`): restore its rings with it."""
        self.ctx_len = min(self.ctx_len, length)

    @property
    def ring_windows(self) -> list[int]:
        """The windows of the layers that keep their context in a ring (a sliding layer whose window + B rows
        are fewer than the context). Truncating from a length past a window to a shorter one leaves stale
        rows in its ring (later positions overwrote them): restore the rings saved at the shorter length."""
        return [
            layer.self_attn.window or 0
            for layer, (k, _) in zip(self.draft_layers, self.cache, strict=True)
            if layer.self_attn.window and k.shape[0] < self.context_rows
        ]

    def save_rings(self) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """Copies of the sliding layers' rings (None for a layer that keeps every row): with the context
        length they belong to, what `restore_rings` needs to draft from that length again."""
        return [(k.clone(), v.clone()) if k.shape[0] < self.context_rows else None for k, v in self.cache]

    def row_caches(self) -> list[torch.Tensor]:
        """The full layers' K and V (row j: position j); the rings are the checkpoints' (`save_rings`)."""
        return [t for k, v in self.cache if k.shape[0] >= self.context_rows for t in (k, v)]

    def restore_rings(self, saved: list[tuple[torch.Tensor, torch.Tensor] | None], length: int) -> None:
        """Back to the context of `length` positions whose rings `save_rings` copied."""
        for (k, v), ring in zip(self.cache, saved, strict=True):
            if ring is not None:
                k.copy_(ring[0])
                v.copy_(ring[1])
        self.ctx_len = length

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        if self._final_norm is not None:
            features = features.clone()
            features[..., self._normed_slice] = self._final_norm(features[..., self._normed_slice])
        return self.hidden_norm(self.fc(features))

    # -- inference --------------------------------------------------------------
    @torch.no_grad()
    def draft_logits(self, ids: torch.Tensor, span: Span, drafts: int | None = None) -> torch.Tensor:
        """Draft logits [drafts, V] (all B-1 by default) for the block `ids` [B] = [last token, mask x (B-1)]
        at device positions `span`; the context is every committed row below span.pos[0]. Reads no host
        value. The whole block runs (its rows attend to each other), the LM head only on the rows asked for."""
        return self.logits(self._draft(ids, span)[:drafts])

    @torch.no_grad()
    def propose(
        self,
        ids: torch.Tensor,
        span: Span,
        params: SamplingParams,
        draws: Draws | None,
        q_out: torch.Tensor | None,
        drafts: int | None = None,
        guide: Guide | None = None,
    ) -> torch.Tensor:
        """The first `drafts` drafts (all B-1 by default) after ids[0] (the step seam's call), from the block's
        hidden states of those rows (see `pick`). Reads no host value, unless a `guide` holds the drafts to a
        grammar (it reads each draft as it is drawn)."""
        return self.pick(self._draft(ids, span)[:drafts], ids[:1], params, draws, q_out, guide)

    def pick(
        self,
        hidden: torch.Tensor,
        anchor: torch.Tensor,
        params: SamplingParams,
        draws: Draws | None,
        q_out: torch.Tensor | None,
        guide: Guide | None = None,
    ) -> torch.Tensor:
        """Drafts from the drafted rows' hidden states [D, H]: the draft logits' argmax when greedy, else drawn
        from their processed distribution, written to `q_out` [D, V] for the verify. A DFlash2 drafter walks
        its candidate selector instead (`CandidateSelector.walk`: each step depends only on the steps before
        it, so the first k are the same for any number of rows). With a `guide`, row after row held to it."""
        logits, q = self.logits(hidden), (q_out[: hidden.shape[0]] if q_out is not None else None)
        selector = getattr(self, "candidate_selector", None)  # a submodule only DFlash2 registers
        if selector is not None:
            return selector.walk(logits, hidden, anchor, params, draws, q, guide)
        if guide is not None:
            rows = range(logits.shape[0])
            return torch.cat([guided_draft(logits[t : t + 1], t, params, draws, q_row(q, t), guide) for t in rows])
        return draft_tokens(logits, params, draws, q)

    @torch.no_grad()
    def append_context(self, features: torch.Tensor, start: int, rope: torch.Tensor | None = None) -> None:
        """Cache context K/V for committed positions start-n .. start-1 (features [n, K*H]); `rope` [n]: the
        positions their keys rotate by, where not these (a prompt with images: the target's temporal ones)."""
        n = features.shape[0]
        if self.ctx_len + n != start:
            raise RuntimeError(f"drafter context out of sync: have {self.ctx_len} + {n} rows for position {start}")
        if n:
            self.store_context(features, torch.arange(start - n, start, device=features.device), rope)
        self.ctx_len = start

    @torch.no_grad()
    def store_context(self, features: torch.Tensor, positions: torch.Tensor, rope: torch.Tensor | None = None) -> None:
        """Context K/V of the target features [n, K*H] at `positions` [n] (a fixed-shape step stores a whole
        verify block; the rows past the accepted ones are overwritten before anything reads them), their keys
        rotated by `rope` [n] where it is given."""
        dtype = self.norm.weight.dtype
        h = self.project_context(features.to(dtype))
        cos, sin = self.rotary.at(positions if rope is None else rope, dtype)
        for layer, (cache_k, cache_v) in zip(self.draft_layers, self.cache, strict=True):
            layer.self_attn.into_cache(h, cos, sin, positions, cache_k, cache_v, queries=False)

    @torch.no_grad()
    def draft_hidden(self, last_token: int, start: int, length: int | None = None) -> torch.Tensor:
        """Final-normed hidden states [length, H] for the drafted positions after `last_token` at `start`
        (length defaults to B-1), the context as appended: an eager view of what `draft_logits` computes."""
        ids = self._block_ids(last_token, start, length)
        return self._draft(ids, Span.eager(start, ids.shape[0], ids.device))

    def block_ids(self, device: torch.device) -> torch.Tensor:
        """[0, mask x (B-1)]: a fixed-shape step writes the last token into row 0."""
        ids = torch.full((self.block_size,), self.mask_token_id, dtype=torch.long, device=device)
        ids[0] = 0
        return ids

    def _block_ids(self, last_token: int, start: int, length: int | None) -> torch.Tensor:
        if self.ctx_len != start:
            raise RuntimeError(f"drafter context out of sync: have {self.ctx_len} positions, drafting at {start}")
        B = self.block_size if length is None else length + 1
        ids = torch.full((B,), self.mask_token_id, dtype=torch.long, device=self.norm.weight.device)
        ids[0] = last_token
        return ids

    def _draft(self, ids: torch.Tensor, span: Span) -> torch.Tensor:
        """The final-normed hidden states of the drafted positions (block rows 1..), the block's own K/V
        written to the cache rows past the context (the next block or context rows overwrite them)."""
        dtype = self.norm.weight.dtype
        x = self.embed(ids, dtype)
        cos, sin = self.rotary.at(span.rotated, dtype)
        block = x.shape[0]
        for layer, (cache_k, cache_v) in zip(self.draft_layers, self.cache, strict=True):
            attn = layer.self_attn
            xn, carried = layer.attention_input(x, block)
            q, _ = attn.into_cache(xn, cos, sin, span.pos, cache_k, cache_v)
            out = attend_cache(q, cache_k, cache_v, span, attn.scale, causal=attn.causal, window=attn.window)
            x = layer.after_attention(x, attn.o_proj(out), carried, block)
        return self.norm(x[1:])

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The block's input rows: the target's embeddings of `ids`."""
        x = _bound(self._embed)(ids).to(dtype)
        return x * self.embedding_scale if self.embedding_scale != 1.0 else x

    # -- training ---------------------------------------------------------------
    def forward_train(
        self, features: torch.Tensor, block_embeddings: torch.Tensor, anchors: torch.Tensor
    ) -> torch.Tensor:
        """Many blocks over one sequence, differentiable.

        features: [S, K*H] target features at positions 0..S-1; block_embeddings: [A, B, H] embeddings of
        [token at anchor, mask x (B-1)]; anchors: [A] positions of each block's first token. Block a sees
        context positions < anchors[a] and its own block. Returns final-normed hidden states [A, B, H].
        """
        S = features.shape[0]
        A, B, H = block_embeddings.shape
        device = features.device
        dtype = block_embeddings.dtype
        h_ctx = self.project_context(features)
        ctx_pos = torch.arange(S, device=device)
        blk_pos = (anchors[:, None] + torch.arange(B, device=device)[None, :]).reshape(-1)
        k_pos = torch.cat((ctx_pos, blk_pos))
        block_of_q = torch.arange(A, device=device).repeat_interleave(B)
        sees_ctx = ctx_pos[None, :] < anchors[block_of_q][:, None]
        sees_blk = block_of_q[:, None] == block_of_q[None, :]
        base = torch.cat((sees_ctx, sees_blk), dim=1)
        cos_c, sin_c = self.rotary.cos_sin(ctx_pos, dtype)
        cos_b, sin_b = self.rotary.cos_sin(blk_pos, dtype)
        x = block_embeddings.reshape(A * B, H)
        if self.embedding_scale != 1.0:
            x = x * self.embedding_scale
        for layer in self.draft_layers:
            attn = layer.self_attn
            k_c, v_c = attn.keys_values(h_ctx, cos_c, sin_c)
            xn, carried = layer.attention_input(x, B)
            q, _ = attn.queries(xn, cos_b, sin_b)
            k_b, v_b = attn.keys_values(xn, cos_b, sin_b)
            mask = attn.mask(blk_pos, k_pos, base)
            out = attend(q, torch.cat((k_c, k_b)), torch.cat((v_c, v_b)), mask, attn.scale)
            x = layer.after_attention(x, attn.o_proj(out), carried, B)
        return self.norm(x).view(A, B, H)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits of final-normed hidden states, through the target's LM head."""
        return _bound(self._lm_head)(hidden)


def _bound(module: nn.Module | None) -> nn.Module:
    """A module of the target's that `bind` lent the drafter (its embedding, its LM head)."""
    if module is None:
        raise RuntimeError("the drafter is not bound to a target yet: bind() it first")
    return module
