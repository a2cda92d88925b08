"""HF <-> GGUF tensor names and the llama.cpp converter's transforms (docs/ARCHITECTURE.md, GGUF layouts).

A `Rule` names one tensor both ways plus the transform the converter applied on
the way into GGUF. `{bid}` stands for the layer index. The transforms are pure
functions on float tensors; gguf.py applies the inverses (row permutations also
on packed blocks, since rows are whole blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TARGET_ARCHS = ("qwen35", "qwen35moe", "qwen3")
DRAFTER_ARCHS = ("dflash-draft", "dflash")
ZERO_CENTRED_ARCHS = ("qwen35", "qwen35moe")  # HF norm computes x*(1+w); GGUF stores 1+w

# transforms
NORM = "norm+1"  # zero-centred norm: gguf = hf + 1
A_LOG = "a_log"  # ssm_a = -exp(A_log)
CONV = "conv"  # [C,1,K] -> [C,K], V channels head-reordered
QKV_V = "qkv_v"  # V rows of the fused qkv head-reordered
V_ROWS = "v_rows"  # rows in V-head order, head_dim = linear_value_head_dim
V_HEADS = "v_heads"  # one row/value per V head
OUT_COLS = "out_cols"  # input columns in V-head order


@dataclass(frozen=True)
class Rule:
    hf: str
    gguf: str
    transform: str | None = None

    def hf_name(self, bid: int | None = None) -> str:
        return self.hf.format(bid=bid)

    def gguf_name(self, bid: int | None = None) -> str:
        return self.gguf.format(bid=bid)


def _layer(hf: str, gguf: str, transform: str | None = None) -> Rule:
    return Rule("model.layers.{bid}." + hf, "blk.{bid}." + gguf, transform)


def target_rules(arch: str) -> tuple[list[Rule], list[Rule]]:
    """(global rules, per-layer rules) for a target architecture. Norm transforms only for qwen35*."""
    norm = NORM if arch in ZERO_CENTRED_ARCHS else None
    glob = [
        Rule("model.embed_tokens.weight", "token_embd.weight"),
        Rule("lm_head.weight", "output.weight"),
        Rule("model.norm.weight", "output_norm.weight", norm),
    ]
    post_norm = "post_attention_norm.weight" if arch in ZERO_CENTRED_ARCHS else "ffn_norm.weight"
    layer = [
        _layer("input_layernorm.weight", "attn_norm.weight", norm),
        _layer("post_attention_layernorm.weight", post_norm, norm),
        _layer("self_attn.q_proj.weight", "attn_q.weight"),
        _layer("self_attn.k_proj.weight", "attn_k.weight"),
        _layer("self_attn.v_proj.weight", "attn_v.weight"),
        _layer("self_attn.o_proj.weight", "attn_output.weight"),
        _layer("self_attn.q_norm.weight", "attn_q_norm.weight", norm),
        _layer("self_attn.k_norm.weight", "attn_k_norm.weight", norm),
        _layer("mlp.gate_proj.weight", "ffn_gate.weight"),
        _layer("mlp.up_proj.weight", "ffn_up.weight"),
        _layer("mlp.down_proj.weight", "ffn_down.weight"),
    ]
    if arch in ZERO_CENTRED_ARCHS:
        layer += [
            _layer("linear_attn.in_proj_qkv.weight", "attn_qkv.weight", QKV_V),
            _layer("linear_attn.in_proj_z.weight", "attn_gate.weight", V_ROWS),
            _layer("linear_attn.in_proj_a.weight", "ssm_alpha.weight", V_HEADS),
            _layer("linear_attn.in_proj_b.weight", "ssm_beta.weight", V_HEADS),
            _layer("linear_attn.conv1d.weight", "ssm_conv1d.weight", CONV),
            _layer("linear_attn.A_log", "ssm_a", A_LOG),
            _layer("linear_attn.dt_bias", "ssm_dt.bias", V_HEADS),
            _layer("linear_attn.norm.weight", "ssm_norm.weight"),
            _layer("linear_attn.out_proj.weight", "ssm_out.weight", OUT_COLS),
        ]
    if arch == "qwen35moe":
        layer += [
            _layer("mlp.gate.weight", "ffn_gate_inp.weight"),
            _layer("mlp.experts.down_proj", "ffn_down_exps.weight"),
            _layer("mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"),
            _layer("mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"),
            _layer("mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"),
            _layer("mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"),
        ]
    return glob, layer


# The target's MTP layer (docs/ARCHITECTURE.md, The MTP layer): HF names it `mtp.*`; llama.cpp's converter numbers
# it as block N (N = the target's layer count), names its own tensors `nextn.*` and its decoder layer's as a
# target layer's, and stores every norm as 1 + w (all of them end in `norm.weight`).
MTP_PREFIX = "mtp."
MTP_LAYER = "mtp.layers.0."
_MTP_OWN = {
    "mtp.fc.weight": "nextn.eh_proj.weight",
    "mtp.pre_fc_norm_embedding.weight": "nextn.enorm.weight",
    "mtp.pre_fc_norm_hidden.weight": "nextn.hnorm.weight",
    "mtp.norm.weight": "nextn.shared_head_norm.weight",
}


def mtp_rules(arch: str) -> list[Rule]:
    """The MTP layer's tensors, `{bid}` standing for the target's layer count: its own, then its full-attention
    decoder layer's (the routed experts' gate/up pair aside, as for a target layer)."""
    norm = NORM if arch in ZERO_CENTRED_ARCHS else None
    own = [Rule(hf, "blk.{bid}." + gguf, norm if "norm" in hf else None) for hf, gguf in _MTP_OWN.items()]
    _, layer = target_rules(arch)
    prefix = "model.layers.{bid}."
    return own + [
        Rule(MTP_LAYER + rule.hf.removeprefix(prefix), rule.gguf, rule.transform)
        for rule in layer
        if ".linear_attn." not in rule.hf
    ]


# Routed gate/up experts: HF fuses them ([E, 2I, H], gate rows first); GGUF has them split or fused.
EXPERTS_GATE_UP = "model.layers.{bid}.mlp.experts.gate_up_proj"
GGUF_GATE_EXPS = "blk.{bid}.ffn_gate_exps.weight"
GGUF_UP_EXPS = "blk.{bid}.ffn_up_exps.weight"
GGUF_GATE_UP_EXPS = "blk.{bid}.ffn_gate_up_exps.weight"

# Drafter tensors: the z-lab state dict (no "model." prefix) <-> GGUF, per schema (docs/ARCHITECTURE.md, GGUF layouts). Norms are raw.
_DRAFTER_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
DRAFTER_NAMES = {  # schema -> (global names, per-layer names under blk.N.)
    "dflash-draft": (  # the DFlash fork's converter
        {
            "fc.weight": "dflash_fc.weight",
            "hidden_norm.weight": "dflash_hidden_norm.weight",
            "norm.weight": "output_norm.weight",
        },
        {**_DRAFTER_LAYER, "post_attention_layernorm.weight": "post_attention_norm.weight"},
    ),
    "dflash": (  # mainline llama.cpp's converter (conversion/qwen.py, DFlashModel)
        {"fc.weight": "fc.weight", "hidden_norm.weight": "enc.output_norm.weight", "norm.weight": "output_norm.weight"},
        {**_DRAFTER_LAYER, "post_attention_layernorm.weight": "ffn_norm.weight"},
    ),
}


# DFlash2's extra tensors, as llama.cpp's converter names them under the mainline `dflash` arch (PR #27342 /
# #27816; docs/ARCHITECTURE.md, GGUF layouts). The conv base kernels keep no `.weight` suffix (so llama-quantize leaves them F32).
DFLASH2_NAMES = (
    {
        "candidate_selector.predecessor_codebook": "selector_predecessor.weight",
        "candidate_selector.successor_codebook": "selector_successor.weight",
        "candidate_selector.hidden_projection.weight": "selector_hidden.weight",
    },
    {
        "attention_conv.base_kernel": "attn_conv_base",
        "attention_conv.kernel_projection.weight": "attn_conv_proj.weight",
        "mlp_conv.base_kernel": "ffn_conv_base",
        "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight",
    },
)
# the DFlash2 sizes in a `dflash` GGUF: `dflash.<key>`, as in dflash_config
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def gguf_rank(gguf_name: str) -> int:
    """How many dims a tensor has as the converter writes it (ggml writers drop trailing 1-sized ones).

    llama-quantize and every other ggml-written file store a tensor's shape without its trailing 1s
    (ggml_n_dims): the shared-expert gate [hidden, 1] comes back [hidden].
    """
    base = gguf_name.split(".", 2)[-1] if gguf_name.startswith("blk.") else gguf_name
    if base.endswith(".bias") or base == "ssm_a" or "norm" in base:
        return 1
    return 3 if "_exps." in base or base.endswith("_conv_base") else 2


# --- V-head regrouping --------------------------------------------------------


def v_head_perm(num_k_heads: int, num_v_heads: int, head_dim: int) -> torch.Tensor:
    """Row order of the converter's regrouping: gguf_rows = hf_rows[perm].

    HF groups V heads by K head ([nK, r]); GGUF tiles them ([r, nK]): new head v*nK + k holds
    old head k*r + v.
    """
    r = num_v_heads // num_k_heads
    heads = torch.arange(num_v_heads).view(num_k_heads, r).T.reshape(-1)
    return (heads[:, None] * head_dim + torch.arange(head_dim)).reshape(-1)


def invert(perm: torch.Tensor) -> torch.Tensor:
    return torch.argsort(perm)


@dataclass(frozen=True)
class LinearAttnDims:
    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int

    @property
    def reordered(self) -> bool:
        return self.num_k_heads != self.num_v_heads

    def row_perm(self, transform: str, rows: int) -> torch.Tensor:
        """gguf_rows = hf_rows[perm] for the row-reordering transforms (identity where not regrouped)."""
        if not self.reordered:
            return torch.arange(rows)
        if transform == QKV_V or transform == CONV:
            qk = 2 * self.num_k_heads * self.k_head_dim
            v = v_head_perm(self.num_k_heads, self.num_v_heads, self.v_head_dim) + qk
            return torch.cat([torch.arange(qk), v])
        if transform == V_ROWS or transform == OUT_COLS:
            return v_head_perm(self.num_k_heads, self.num_v_heads, self.v_head_dim)
        if transform == V_HEADS:
            return v_head_perm(self.num_k_heads, self.num_v_heads, 1)
        raise ValueError(f"transform {transform!r} does not reorder rows")


def to_gguf(t: torch.Tensor, transform: str | None, dims: LinearAttnDims | None) -> torch.Tensor:
    """Apply the converter's transform to an HF float tensor (what llama.cpp's converter writes)."""
    if transform is None:
        return t
    if transform == NORM:
        return t + 1
    if transform == A_LOG:
        t = -torch.exp(t)
        return t[_row_perm(dims, V_HEADS, t.shape[0])]
    if transform == CONV:
        t = t.squeeze(1)
        return t[_row_perm(dims, CONV, t.shape[0])]
    if transform == OUT_COLS:
        return t[:, _row_perm(dims, OUT_COLS, t.shape[1])]
    return t[_row_perm(dims, transform, t.shape[0])]


def from_gguf(t: torch.Tensor, transform: str | None, dims: LinearAttnDims | None) -> torch.Tensor:
    """Undo `to_gguf` on a float tensor."""
    if transform is None:
        return t
    if transform == NORM:
        return t - 1
    if transform == A_LOG:
        return torch.log(-t[invert(_row_perm(dims, V_HEADS, t.shape[0]))])
    if transform == CONV:
        return t[invert(_row_perm(dims, CONV, t.shape[0]))].unsqueeze(1)
    if transform == OUT_COLS:
        return t[:, invert(_row_perm(dims, OUT_COLS, t.shape[1]))]
    return t[invert(_row_perm(dims, transform, t.shape[0]))]


def _row_perm(dims: LinearAttnDims | None, transform: str, rows: int) -> torch.Tensor:
    """The row-reordering transforms need the linear-attention dims of the model they belong to."""
    if dims is None:
        raise ValueError(f"transform {transform!r} needs the linear-attention dims")
    return dims.row_perm(transform, rows)
