"""A torch reference of Qwen3.5/3.6's MTP layer, written from the published rules (docs/ARCHITECTURE.md, The MTP
layer: vLLM's qwen3_5_mtp.py, llama.cpp's qwen35 MTP graph and converter), independent of the engine's module.

Row i pairs the target's final-normed hidden state h_i with the embedding of the token after it:
x_i = fc([enorm(embed(t_{i+1})) ; hnorm(h_i)]); the decoder layer is transformers' own Qwen3.5 full-attention
layer (its MoE twin for the MoE target) at position i, causal over the rows; out_i = norm(layer(x)_i); the
logits are the target's head applied to out_i. Norms are transformers' zero-centred RMSNorm. On a prompt with
images (vLLM's rule, docs/ARCHITECTURE.md *Drafting on prompts with images*) a row takes its next token's input
embedding as the target got it (an image's features) and the target's M-RoPE position of its own token.
"""

from __future__ import annotations

import copy

import torch


def _layer_class(config):
    if config.model_type.startswith("qwen3_5_moe"):
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer, Qwen3_5MoeRMSNorm

        return Qwen3_5MoeDecoderLayer, Qwen3_5MoeRMSNorm
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

    return Qwen3_5DecoderLayer, Qwen3_5RMSNorm


class ReferenceMTP(torch.nn.Module):
    def __init__(self, config, weights: dict[str, torch.Tensor], embed: torch.Tensor, head: torch.Tensor):
        """`config`: the target's transformers text config; `weights`: the MTP layer's float tensors under the
        checkpoints' names (`mtp.*`); `embed`, `head`: the target's embedding and LM head matrices [V, H]."""
        super().__init__()
        config = copy.deepcopy(config)
        config.layer_types = ["full_attention"] + list(config.layer_types[1:])
        config._attn_implementation = "eager"
        layer_class, norm_class = _layer_class(config)
        H = config.hidden_size
        self.layer = layer_class(config, 0)
        self.enorm, self.hnorm, self.norm = (norm_class(H, eps=config.rms_norm_eps) for _ in range(3))
        self.fc = torch.nn.Linear(2 * H, H, bias=False)
        state = {k.removeprefix("mtp.").replace("layers.0.", "layer.", 1): v.float() for k, v in weights.items()}
        renamed = {"pre_fc_norm_embedding.weight": "enorm.weight", "pre_fc_norm_hidden.weight": "hnorm.weight"}
        self.load_state_dict({renamed.get(k, k): v for k, v in state.items()}, strict=True)
        self.embed, self.head = embed.float(), head.float()
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

        self.rotary = Qwen3_5TextRotaryEmbedding(config=config)

    @torch.no_grad()
    def forward(
        self,
        hidden: torch.Tensor,
        next_ids: torch.Tensor,
        start: int = 0,
        embeds: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ):
        """(normed outputs [n, H], logits [n, V]) of the rows (hidden [n, H], next_ids [n]) at positions
        start..start+n-1 (or M-RoPE `positions` [3, n]), each row attending to the rows up to its own;
        `embeds` [n, H]: the next tokens' input embeddings, where not their ids' own."""
        n = hidden.shape[0]
        embedded = self.embed[next_ids] if embeds is None else embeds.float()
        x = self.fc(torch.cat((self.enorm(embedded), self.hnorm(hidden.float())), dim=-1))[None]
        if positions is None:
            positions = torch.arange(start, start + n).expand(3, n)
        cos_sin = self.rotary(x, positions.reshape(3, 1, n))
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        out = self.norm(self.layer(x, cos_sin, attention_mask=mask, position_ids=positions[:1])[0])
        return out, out @ self.head.T

    def chain(
        self,
        hidden: torch.Tensor,
        tokens: list[int],
        drafts: int,
        embeds: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> list[int]:
        """Greedy drafts after tokens t_0..t_P whose target hidden states h_0..h_{P-1} are `hidden`: the rows
        (h_i, t_{i+1}), then the layer chained on its own output, each draft the argmax of the newest row. A
        prompt with images gives the input embeddings of t_1..t_{P-1} (`embeds` [P - 1, H]) and the M-RoPE
        positions of t_0..t_{P-1} (`positions` [3, P]); the rows after them move on from the last one by one."""
        rows, ids, out = list(hidden), list(tokens[1:]), []
        n = len(rows)
        if positions is None:
            positions = torch.arange(n).expand(3, n)
        for _ in range(drafts):
            k = len(rows)
            given = 0 if embeds is None else embeds.shape[0]
            embedded = self.embed[torch.tensor(ids[given:], dtype=torch.long)]
            if embeds is not None:
                embedded = torch.cat((embeds.float(), embedded))
            later = positions[:, -1:] + torch.arange(1, k - n + 1)
            normed, logits = self(
                torch.stack(rows), torch.tensor(ids), embeds=embedded, positions=torch.cat((positions, later), dim=1)
            )
            out.append(int(logits[-1].argmax()))
            rows.append(normed[-1])
            ids.append(out[-1])
        return out
