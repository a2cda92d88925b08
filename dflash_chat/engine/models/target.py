"""Target models: Qwen3.5/3.6 dense and MoE (Gated DeltaNet + gated attention) and Qwen3 (attention only).

One file, read top to bottom. Parameter names follow the HF checkpoints (`model.layers.N...`,
`lm_head.weight`) so their safetensors load directly. Batch size 1; tokens along dim 0.

`forward(ids, state, ...)` runs new tokens at positions state.length.. (or at a `Span` of device
positions, for fixed-shape steps) against the preallocated state, returns logits for the positions
asked for and the context features (hidden states after the given 0-based layers, concatenated) that
the DFlash drafter reads. A prompt with images comes with its input embeddings (the image features spliced in)
and its M-RoPE positions (engine/models/image_prompt.py); a prompt without them rotates by its cache positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from dflash_chat.engine.errors import ContextLengthError
from dflash_chat.engine.models.attention import Projections, attend_cache
from dflash_chat.engine.models.config import TargetConfig
from dflash_chat.engine.models.gdn import GatedDeltaNet
from dflash_chat.engine.models.image_prompt import mrope_axes, mrope_cos_sin
from dflash_chat.engine.models.layers import MLP, RMSNorm, Rotary, SparseMoE, ops
from dflash_chat.engine.models.span import Span
from dflash_chat.engine.state import AttentionCache, GDNCache, ModelState


class Attention(Projections):
    """Full attention; Qwen3.5/3.6 add a per-head output gate packed into q_proj (q then gate per head)."""

    def __init__(self, cfg: TargetConfig):
        super().__init__(
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.rms_norm_eps,
            cfg.zero_centred_norm,
            cfg.gated_attention,
        )

    def new_cache(self, max_len: int, device, dtype) -> AttentionCache:
        shape = (max_len, self.num_kv_heads, self.head_dim)
        return AttentionCache(
            torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)
        )

    def forward(self, x, cache: AttentionCache, span: Span, cos, sin) -> torch.Tensor:
        q, gate = self.into_cache(x, cos, sin, span.pos, cache.k, cache.v)
        return self.o_proj(attend_cache(q, cache.k, cache.v, span, self.scale, gate=gate))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TargetConfig, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = Attention(cfg)
        self.mlp: nn.Module
        if cfg.is_moe:
            self.mlp = SparseMoE(
                cfg.hidden_size,
                cfg.num_experts,
                cfg.num_experts_per_tok,
                cfg.moe_intermediate_size,
                cfg.shared_expert_intermediate_size,
            )
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.zero_centred_norm)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.zero_centred_norm)

    def new_cache(self, max_len: int, device, dtype, block: int):
        if self.layer_type == "linear_attention":
            return self.linear_attn.new_cache(device, dtype, block)
        return self.self_attn.new_cache(max_len, device, dtype)

    def forward(self, x, pending, cache, span: Span, cos, sin, speculative):
        """(residual, the MLP output still to add to it): the previous layer's last add happens here, in one
        kernel with this layer's input norm (pending is None for the first layer)."""
        x, h = add_norm(self.input_layernorm, x, pending)
        if self.layer_type == "linear_attention":
            h = self.linear_attn(h, cache, speculative)
        else:
            h = self.self_attn(h, cache, span, cos, sin)
        x, h = add_norm(self.post_attention_layernorm, x, h)
        return x, self.mlp(h)


def add_norm(norm: RMSNorm, x: torch.Tensor, pending: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + pending, norm(x + pending)) in one kernel; (x, norm(x)) when nothing is pending."""
    if pending is None:
        return x, norm(x)
    return ops().add_rms_norm(pending, x, norm.weight, norm.eps, norm.zero_centred)


class Backbone(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, t) for t in cfg.layer_types)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.zero_centred_norm)

    @property
    def decoder_layers(self) -> Sequence[DecoderLayer]:
        """`layers` as the layers they are (an nn.ModuleList's items are typed as plain Modules)."""
        return cast("Sequence[DecoderLayer]", self.layers)


class TargetModel(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = Rotary(cfg.rotary_dim, cfg.rope_theta)

    @property
    def embed_tokens(self) -> nn.Module:
        return self.model.embed_tokens

    def new_state(self, max_len: int, block: int = 1) -> ModelState:
        """Caches for `max_len` positions; GDN layers keep room for a speculative forward of `block` tokens."""
        p = self.model.norm.weight
        dtype = p.dtype
        caches = [layer.new_cache(max_len, p.device, dtype, block) for layer in self.model.decoder_layers]
        self.rotary.allocate(max_len, dtype)
        return ModelState(caches, max_len)

    @torch.no_grad()
    def forward(
        self,
        ids: torch.Tensor,
        state: ModelState,
        *,
        logits: str | None = "last",
        taps: list[int] | None = None,
        speculative: bool = False,
        span: Span | None = None,
        embeds: torch.Tensor | None = None,
        rope_positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Run `ids` [T] at positions state.length..; advance the state by T.

        logits: "last" -> [V] for the last token, "all" -> [T, V], None -> no LM head.
        taps: 0-based layer ids whose outputs are concatenated into features [T, len(taps) * H].
        speculative: keep what `rollback` needs to keep only part of this forward (GDN state stays as it was).
        span: device positions for a fixed-shape step; then the caller keeps the length (state.length is
        neither read nor changed) and no host value is read.
        embeds: the input embeddings [T, H] to run instead of `ids`' own (a prompt with images).
        rope_positions: [3, T] M-RoPE positions (temporal, height, width) the attention layers rotate by instead of
        the cache positions (a prompt with images, or a token after one).
        """
        T = ids.shape[0]
        eager = span is None
        if span is None:
            start = state.length
            if start + T > state.max_len:
                raise ContextLengthError(
                    f"context full: {start + T} tokens do not fit the {state.max_len}-token context; start a new chat or raise the context length"
                )
            span = Span.eager(start, T, ids.device)
        dtype = self.model.norm.weight.dtype
        x = (self.model.embed_tokens(ids) if embeds is None else embeds).to(dtype)
        if rope_positions is None:
            cos, sin = self.rotary.at(span.rotated, dtype)
        else:
            axes = mrope_axes(self.cfg.rotary_dim, self.cfg.mrope_section)
            cos, sin = mrope_cos_sin(self.rotary, rope_positions, axes, dtype)
        wanted = set(taps or ())
        tapped: dict[int, torch.Tensor] = {}
        pending: torch.Tensor | None = None
        for i, (layer, cache) in enumerate(zip(self.model.decoder_layers, state.layers, strict=True)):
            x, pending = layer(x, pending, cache, span, cos, sin, speculative)
            if i in wanted:
                tapped[i] = x + pending
        assert pending is not None, "a target has layers"
        if eager:
            state.length = start + T
            state.pending = T if speculative else 0
        feats = torch.cat([tapped[i] for i in taps], dim=-1) if taps else None
        out = None
        if logits is not None:
            rows = slice(-1, None) if logits == "last" else slice(None)
            _, h = add_norm(self.model.norm, x[rows], pending[rows])
            out = self.lm_head(h).float()
            if logits == "last":
                out = out[0]
        return out, feats

    def rollback(self, state: ModelState, keep: int) -> None:
        """Keep only the first `keep` tokens of the last speculative forward that advanced state.length."""
        if not state.pending:
            raise RuntimeError("rollback without a speculative forward")
        state.length = state.length - state.pending + keep
        self.commit(state, torch.tensor(keep, device=self.model.norm.weight.device))
        state.pending = 0

    @torch.no_grad()
    def commit(self, state: ModelState, keep: torch.Tensor) -> None:
        """Bring every GDN layer to the state after the first `keep` (a 0-d device tensor) tokens of the last
        speculative forward (attention needs nothing: its rows past the length are ignored)."""
        for layer, cache in zip(self.model.decoder_layers, state.layers, strict=True):
            if isinstance(cache, GDNCache):
                layer.linear_attn.commit(cache, keep)
