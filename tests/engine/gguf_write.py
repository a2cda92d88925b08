"""Fixture writer: an HF state dict + HF config -> a GGUF file as llama.cpp's converter would make it.

Used by tests (and handy for experiments): it applies the converter's transforms
(names.py), writes the hyperparameters under llama.cpp's keys through
`gguf.GGUFWriter`, and stores tensors as F32, F16, BF16, as Q8_0, or in a Q4_K_M-style
mix (Q4_K, with Q6_K for `output` and for attn_v/attn_qkv/ffn_down* in about a third
of the layers, legacy fallbacks where a row is not a multiple of 256, norms and
small vectors F32). `quantize_like_llama` then does to such a file what
`llama-quantize` does to the converter's output, as the published GGUFs went through it.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

from dflash_chat.engine.ggml.formats import FORMATS, Format
from dflash_chat.engine.ggml.quantize import quantize
from dflash_chat.engine.weights import names

MIXES = ("F32", "F16", "BF16", "Q8_0", "Q4_K_M")
_ARCH_OF_MODEL_TYPE = {
    "qwen3_5_text": "qwen35",
    "qwen3_5": "qwen35",
    "qwen3_5_moe_text": "qwen35moe",
    "qwen3_5_moe": "qwen35moe",
    "qwen3": "qwen3",
}
_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0", "Q8_0": "F16"}
_KEEP_F32 = {"ssm_a", "ssm_dt.bias", "ssm_conv1d.weight", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight"}


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def choose_format(gguf_name: str, shape: tuple[int, ...], mix: str, n_layers: int) -> Format:
    """The type llama.cpp's quantize would pick for this tensor in `mix` (a simplified Q4_K_M)."""
    base = gguf_name.split(".", 2)[-1] if gguf_name.startswith("blk.") else gguf_name
    if mix == "F32" or len(shape) == 1 or "norm" in gguf_name or base in _KEEP_F32 or not gguf_name.endswith("weight"):
        return FORMATS["F32"]
    if mix in ("F16", "BF16"):
        return FORMATS[mix]
    if mix == "Q8_0":
        want = "Q8_0"
    else:
        bid = int(gguf_name.split(".")[1]) if gguf_name.startswith("blk.") else -1
        bumped = any(k in gguf_name for k in ("attn_v", "attn_qkv", "ffn_down")) and _use_more_bits(bid, n_layers)
        want = "Q6_K" if gguf_name.startswith("output.") or bumped else "Q4_K"
    while shape[-1] % FORMATS[want].block_size:
        want = _FALLBACK[want]
    return FORMATS[want]


def _add_tensor(writer: gguf.GGUFWriter, name: str, t: torch.Tensor, fmt: Format) -> None:
    t = t.detach().float().contiguous()
    if fmt.name == "F32":
        writer.add_tensor(name, t.numpy())
    elif fmt.name == "F16":
        writer.add_tensor(name, t.numpy().astype(np.float16))
    else:
        packed = quantize(t, fmt).numpy()
        writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=gguf.GGMLQuantizationType(fmt.ggml_type))


def _rope_keys(writer: gguf.GGUFWriter, cfg: dict, head_dim: int) -> None:
    params = cfg.get("rope_parameters") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    writer.add_rope_freq_base(float(theta))
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    if partial is not None:
        writer.add_rope_dimension_count(int(head_dim * partial))
    if "mrope_section" in params:
        writer.add_rope_dimension_sections(list(params["mrope_section"]) + [0] * (4 - len(params["mrope_section"])))
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in ("linear", "yarn"):  # what the converters write from a config's rope_scaling
        writer.add_rope_scaling_type(gguf.RopeScalingType(kind))
        writer.add_rope_scaling_factor(float(scaling["factor"]))
        if scaling.get("original_max_position_embeddings"):
            writer.add_rope_scaling_orig_ctx_len(int(scaling["original_max_position_embeddings"]))


def _common_keys(writer: gguf.GGUFWriter, cfg: dict, n_blocks: int) -> int:
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    writer.add_block_count(n_blocks)
    writer.add_context_length(cfg.get("max_position_embeddings", 32768))
    writer.add_embedding_length(cfg["hidden_size"])
    if cfg.get("intermediate_size"):
        writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    if cfg.get("vocab_size"):
        writer.add_vocab_size(cfg["vocab_size"])
    _rope_keys(writer, cfg, head_dim)
    return head_dim


def _add_tokenizer(
    writer: gguf.GGUFWriter, tokenizer, chat_template: str | None, pre: str, vocab_size: int | None = None
) -> None:
    """Byte-level BPE vocabulary under llama.cpp's tokenizer.ggml.* keys, listed as the converter lists it:
    ids the tokenizer lacks, up to the model's `vocab_size`, become [PAD<id>] of type UNUSED; added tokens
    are CONTROL when special (or shaped <|...|>), USER_DEFINED otherwise."""
    import json

    reverse = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(max(vocab_size or 0, max(reverse) + 1)):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tok = reverse[i]
        tokens.append(tok)
        if i not in added:
            types.append(gguf.TokenType.NORMAL)
        elif added[i].special or (tok.startswith("<|") and tok.endswith("|>")):
            types.append(gguf.TokenType.CONTROL)
        else:
            types.append(gguf.TokenType.USER_DEFINED)
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for key, adder in (
        ("eos_token_id", writer.add_eos_token_id),
        ("bos_token_id", writer.add_bos_token_id),
        ("pad_token_id", writer.add_pad_token_id),
    ):
        if getattr(tokenizer, key, None) is not None:
            adder(getattr(tokenizer, key))
    writer.add_add_bos_token(False)
    if chat_template:
        writer.add_chat_template(chat_template)


def write_target_gguf(
    path: str | Path,
    state_dict: dict[str, torch.Tensor],
    config: dict,
    mix: str = "F32",
    *,
    fused_experts: bool = False,
    extra_mtp_layers: int = 0,
    tokenizer=None,
    chat_template: str | None = None,
    split_max_tensors: int = 0,
) -> Path:
    """Write a qwen35 / qwen35moe / qwen3 target. An MTP layer in `state_dict` (`mtp.*`, the config's
    `mtp_num_hidden_layers`) is written as llama.cpp's converter writes it (`_Qwen35MtpMixin`): block N
    after the N target layers, its own tensors as `blk.N.nextn.{eh_proj, enorm, hnorm, shared_head_norm}`,
    its decoder layer's as a target layer's, every norm as 1 + w, `<arch>.nextn_predict_layers`.
    `extra_mtp_layers` appends stand-in blocks without nextn tensors instead (a reader must ignore them).

    `split_max_tensors` > 0 writes a split GGUF as llama.cpp's gguf-split does (NAME-0000i-of-0000n.gguf,
    metadata in the first part) and returns the first part's path.
    """
    if mix not in MIXES:
        raise ValueError(f"mix must be one of {MIXES}")
    cfg = dict(config.get("text_config") or config)
    arch = _ARCH_OF_MODEL_TYPE[cfg["model_type"]]
    n_layers = cfg["num_hidden_layers"]
    mtp = {k: v for k, v in state_dict.items() if k.startswith("mtp.")}
    if mtp:
        extra_mtp_layers = int(cfg.get("mtp_num_hidden_layers", 1))
    writer = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    writer.add_name("dflash-chat fixture")
    _common_keys(writer, cfg, n_layers + extra_mtp_layers)
    if extra_mtp_layers:
        writer.add_nextn_predict_layers(extra_mtp_layers)
    dims = None
    if arch in names.ZERO_CENTRED_ARCHS:
        writer.add_ssm_conv_kernel(cfg.get("linear_conv_kernel_dim", 4))
        writer.add_ssm_state_size(cfg["linear_key_head_dim"])
        writer.add_ssm_group_count(cfg["linear_num_key_heads"])
        writer.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
        writer.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
        writer.add_full_attention_interval(cfg.get("full_attention_interval", 4))
        dims = names.LinearAttnDims(
            cfg["linear_num_key_heads"],
            cfg["linear_num_value_heads"],
            cfg["linear_key_head_dim"],
            cfg["linear_value_head_dim"],
        )
    if arch == "qwen35moe":
        writer.add_expert_count(cfg["num_experts"])
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if cfg.get("shared_expert_intermediate_size"):
            writer.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if tokenizer is not None:
        _add_tokenizer(
            writer,
            tokenizer,
            chat_template,
            pre="qwen35" if arch != "qwen3" else "qwen2",
            vocab_size=cfg.get("vocab_size"),
        )
    elif chat_template:
        writer.add_chat_template(chat_template)

    glob, layer = names.target_rules(arch)
    out: list[tuple[str, torch.Tensor]] = []
    for rule in glob:
        if rule.hf in state_dict:
            out.append((rule.gguf_name(), names.to_gguf(state_dict[rule.hf], rule.transform, dims)))
    for bid in range(n_layers):
        for rule in layer:
            if rule.hf_name(bid) in state_dict:
                out.append((rule.gguf_name(bid), names.to_gguf(state_dict[rule.hf_name(bid)], rule.transform, dims)))
        gate_up = state_dict.get(names.EXPERTS_GATE_UP.format(bid=bid))
        if gate_up is not None:
            if fused_experts:
                out.append((names.GGUF_GATE_UP_EXPS.format(bid=bid), gate_up))
            else:
                gate, up = gate_up.chunk(2, dim=1)
                out += [(names.GGUF_GATE_EXPS.format(bid=bid), gate), (names.GGUF_UP_EXPS.format(bid=bid), up)]
    if mtp:
        out += _mtp_tensors(mtp, arch, n_layers, dims)
    else:
        for extra in range(n_layers, n_layers + extra_mtp_layers):  # stand-in MTP block: shapes of layer n-1
            for name, t in list(out):
                if name.startswith(f"blk.{n_layers - 1}."):
                    out.append((name.replace(f"blk.{n_layers - 1}.", f"blk.{extra}.", 1), torch.randn_like(t)))
    for name, t in out:
        _add_tensor(writer, name, t, choose_format(name, tuple(t.shape), mix, n_layers))
    parts = writer.format_shard_names(Path(path))
    _finish(writer)
    return parts[0]


# llama.cpp's converter (conversion/qwen.py, _Qwen35MtpMixin.filter_tensors): mtp.X -> layer N's nextn tensors
_NEXTN = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm", "norm": "shared_head_norm"}


def _mtp_tensors(mtp: dict[str, torch.Tensor], arch: str, bid: int, dims) -> list[tuple[str, torch.Tensor]]:
    """The MTP layer's tensors as the converter writes them: its decoder layer renumbered as layer `bid` and
    mapped as any target layer, its own four as nextn tensors; norms + 1 (the converter adds 1 to every
    tensor whose name ends in norm.weight)."""
    as_layer = {f"model.layers.{bid}.{k.removeprefix('mtp.layers.0.')}": v for k, v in mtp.items() if ".layers." in k}
    _, layer = names.target_rules(arch)
    out = [
        (r.gguf_name(bid), names.to_gguf(as_layer[r.hf_name(bid)], r.transform, dims))
        for r in layer
        if r.hf_name(bid) in as_layer
    ]
    gate_up = as_layer.get(names.EXPERTS_GATE_UP.format(bid=bid))
    if gate_up is not None:
        gate, up = gate_up.chunk(2, dim=1)
        out += [(names.GGUF_GATE_EXPS.format(bid=bid), gate), (names.GGUF_UP_EXPS.format(bid=bid), up)]
    for hf, nextn in _NEXTN.items():
        t = mtp[f"mtp.{hf}.weight"]
        out.append((f"blk.{bid}.nextn.{nextn}.weight", t + 1 if "norm" in hf else t))
    return out


def write_drafter_gguf(
    path: str | Path,
    state_dict: dict[str, torch.Tensor],
    config: dict,
    mix: str = "F32",
    *,
    schema: str = "dflash-draft",
    tokenizer=None,
    mrope_target: bool = False,
) -> Path:
    """A z-lab DFlash drafter as the DFlash fork's converter (`dflash-draft`) or mainline llama.cpp's
    (`dflash`, conversion/qwen.py DFlashModel) writes it: see docs/ARCHITECTURE.md, GGUF layouts, and `gguf._drafter_config`.

    `tokenizer`: the vocabulary both converters copy in (the fork from the drafter's folder, mainline from
    the target's). `mrope_target`: mainline gives drafts of M-RoPE targets (Qwen3.5/3.6) degenerate rope
    sections [head_dim / 2, 0, 0, 0]. `attention.causal`: both converters' TextModel writes false for a
    config with `is_causal: false` (and never true); the fork's DFlashDraftModel writes false always.
    """
    if schema not in names.DRAFTER_ARCHS:
        raise ValueError(f"schema must be one of {names.DRAFTER_ARCHS}")
    dflash = config.get("dflash_config") or {}
    block_size = int(dflash.get("block_size", config.get("block_size")))
    mask, taps = int(dflash["mask_token_id"]), [int(i) for i in dflash["target_layer_ids"]]
    n_layers = config["num_hidden_layers"]
    writer = gguf.GGUFWriter(str(path), schema)
    writer.add_name("dflash-chat drafter fixture")
    head_dim = _common_keys(writer, config, n_layers)
    if schema == "dflash-draft" or config.get("is_causal") is False:
        writer.add_causal_attention(False)
    if schema == "dflash-draft":
        writer.add_rope_dimension_count(head_dim)
        writer.add_uint32("dflash-draft.dflash.block_size", block_size)
        writer.add_uint32("dflash-draft.dflash.mask_token_id", mask)
        writer.add_array("dflash-draft.dflash.target_layer_ids", taps)
        writer.add_uint32("dflash-draft.dflash.n_target_features", config["hidden_size"] * len(taps))
    else:
        writer.add_uint32("dflash.block_size", block_size)
        writer.add_array("dflash.target_layers", [i + 1 for i in taps])  # llama.cpp taps the next layer's input
        writer.add_mask_token_id(mask)
        if any("DFlash2" in a for a in config.get("architectures", [])):
            for key in names.DFLASH2_KEYS:
                writer.add_uint32(f"dflash.{key}", int(dflash[key]))
        if mrope_target:
            writer.add_rope_dimension_sections([head_dim // 2, 0, 0, 0])
    types = config.get("layer_types") or ["full_attention"] * n_layers
    if config.get("use_sliding_window") and config.get("sliding_window"):
        writer.add_sliding_window(int(config["sliding_window"]))
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in types])
    if tokenizer is not None:
        _add_tokenizer(writer, tokenizer, None, pre="qwen35")

    glob, layer = names.DRAFTER_NAMES[schema]
    if "candidate_selector.hidden_projection.weight" in state_dict:
        if schema != "dflash":
            raise ValueError("only llama.cpp's mainline converter (schema 'dflash') writes DFlash2 drafters")
        glob, layer = {**glob, **names.DFLASH2_NAMES[0]}, {**layer, **names.DFLASH2_NAMES[1]}
    out = [(gguf_name, state_dict[hf]) for hf, gguf_name in glob.items()]
    for bid in range(n_layers):
        out += [(f"blk.{bid}.{g}", state_dict[f"layers.{bid}.{hf}"]) for hf, g in layer.items()]
    for name, t in out:
        _add_tensor(writer, name, t, choose_format(name, tuple(t.shape), mix, n_layers))
    _finish(writer)
    return Path(path)


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


_FILE_TYPE = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "BF16": gguf.LlamaFileType.MOSTLY_BF16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_K_M": gguf.LlamaFileType.MOSTLY_Q4_K_M,
}


def quantize_like_llama(src: str | Path, dst: str | Path, mix: str) -> Path:
    """What `llama-quantize SRC DST <mix>` makes of a converter-written GGUF.

    Every key is kept and general.file_type / general.quantization_version are set; each tensor is
    re-typed as `choose_format` says; and shapes are stored as ggml's writer stores them, without
    trailing 1-sized dims (ggml_n_dims), which the gguf package's writer (the converter's) never drops:
    a [hidden, 1] tensor comes out [hidden].
    """
    if mix not in _FILE_TYPE:
        raise ValueError(f"mix must be one of {tuple(_FILE_TYPE)}")
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in (
            "general.architecture",
            "general.file_type",
            "general.quantization_version",
        ):
            continue
        vtype = field.types[0]
        writer.add_key_value(key, field.contents(), vtype, sub_type=field.types[-1] if len(field.types) > 1 else None)
    writer.add_file_type(_FILE_TYPE[mix])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    n_layers = int(reader.fields[f"{arch}.block_count"].contents())
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        values = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
        values = values.reshape(shape)
        fmt = choose_format(t.name, shape, mix, n_layers)
        while len(shape) > 1 and shape[0] == 1:  # ggml_n_dims: the trailing 1s of ne are not written
            shape = shape[1:]
        _add_tensor(writer, t.name, values.reshape(shape), fmt)
    _finish(writer)
    return Path(dst)


# --- the vision tower as `convert_hf_to_gguf.py --mmproj` writes it (Qwen3VLVisionModel, projector qwen3vl_merger)

_MMPROJ_BLOCK = {
    "norm1": "ln1",
    "norm2": "ln2",
    "attn.qkv": "attn_qkv",
    "attn.proj": "attn_out",
    "mlp.linear_fc1": "ffn_up",
    "mlp.linear_fc2": "ffn_down",
}
_MMPROJ_MERGER = {"norm": "v.post_ln", "linear_fc1": "mm.0", "linear_fc2": "mm.2"}


def _mmproj_name(hf: str) -> list[str]:
    """The converter's GGUF name(s) for an HF `model.visual.` tensor name (the prefix taken off)."""
    if hf == "patch_embed.proj.weight":
        return ["v.patch_embd.weight", "v.patch_embd.weight.1"]  # the Conv3d's two temporal halves
    if hf == "patch_embed.proj.bias":
        return ["v.patch_embd.bias"]
    if hf == "pos_embed.weight":
        return ["v.position_embd.weight"]
    module, _, part = hf.rpartition(".")
    if module.startswith("merger."):
        return [f"{_MMPROJ_MERGER[module.removeprefix('merger.')]}.{part}"]
    _, bid, rest = module.split(".", 2)
    return [f"v.blk.{bid}.{_MMPROJ_BLOCK[rest]}.{part}"]


def _mmproj_format(name: str, shape: tuple[int, ...], ftype: str) -> Format:
    """The converter's choice: 1-D tensors, names not ending in .weight (biases, the second patch-embed half) and
    the position table F32; Q8_0 falls back to F16 where a row is not whole blocks."""
    if len(shape) <= 1 or not name.endswith(".weight") or name == "v.position_embd.weight" or ftype == "F32":
        return FORMATS["F32"]
    if ftype == "Q8_0" and shape[-1] % FORMATS["Q8_0"].block_size:
        return FORMATS["F16"]
    return FORMATS[ftype]


def write_mmproj_gguf(
    path: str | Path,
    visual: dict[str, torch.Tensor],
    vision_cfg: dict,
    text_hidden: int,
    ftype: str = "F16",
    image_mean=(0.5, 0.5, 0.5),
    image_std=(0.5, 0.5, 0.5),
    deepstack: list[bool] | None = None,
) -> Path:
    """An mmproj GGUF from a Qwen3.5 tower's HF tensors (names after `model.visual.`) and its vision_config;
    `deepstack` marks layers as Qwen3-VL's converter does (Qwen3.5's: none)."""
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_file_type(_FILE_TYPE[ftype])
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(text_hidden)
    side = int(vision_cfg["num_position_embeddings"] ** 0.5)
    writer.add_vision_image_size(side * vision_cfg["patch_size"])
    writer.add_vision_patch_size(vision_cfg["patch_size"])
    writer.add_vision_embedding_length(vision_cfg["hidden_size"])
    writer.add_vision_feed_forward_length(vision_cfg["intermediate_size"])
    writer.add_vision_block_count(vision_cfg["depth"])
    writer.add_vision_head_count(vision_cfg["num_heads"])
    writer.add_vision_image_mean(list(image_mean))
    writer.add_vision_image_std(list(image_std))
    writer.add_clip_projector_type(gguf.VisionProjectorType.QWEN3VL)
    writer.add_vision_use_gelu(True)
    writer.add_vision_spatial_merge_size(vision_cfg["spatial_merge_size"])
    writer.add_vision_attention_layernorm_eps(1e-6)
    writer.add_vision_is_deepstack_layers(deepstack or [False] * vision_cfg["depth"])
    for hf, t in visual.items():
        names_out = _mmproj_name(hf)
        parts = [t[:, :, 0], t[:, :, 1]] if len(names_out) == 2 else [t]
        for name, part in zip(names_out, parts, strict=True):
            _add_tensor(writer, name, part, _mmproj_format(name, tuple(part.shape), ftype))
    _finish(writer)
    return Path(path)
