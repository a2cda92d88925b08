"""GGUF round trip: tiny HF models (transformers' own classes) -> fixture writer -> read_gguf -> HF again."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from dflash_chat.engine.errors import ModelFormatError
from dflash_chat.engine.quantized import QuantLinear
from dflash_chat.engine.weights import names
from dflash_chat.engine.weights.gguf import read_gguf
from dflash_chat.engine.weights.gguf_tokenizer import tokenizer_from_gguf
from dflash_chat.engine.weights.quant_tensor import QuantTensor
from tests.engine.gguf_write import write_drafter_gguf, write_target_gguf
from tests.engine.quant_helpers import one_thread

LINEAR = dict(
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
)
COMMON = dict(
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    vocab_size=300,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
)
_single_thread = pytest.fixture(autouse=True)(one_thread)


def _randomize(model):
    """HF zero-inits the zero-centred norms and fixes A_log/dt_bias; make every tensor distinctive."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 or "norm" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model


def _qwen35(moe=False):
    if moe:
        from transformers import Qwen3_5MoeForCausalLM
        from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig

        cfg = Qwen3_5MoeTextConfig(
            **COMMON,
            **LINEAR,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=256,
            shared_expert_intermediate_size=256,
        )
        return _randomize(Qwen3_5MoeForCausalLM(cfg).eval())
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(**COMMON, **LINEAR, intermediate_size=512)
    return _randomize(Qwen3_5ForCausalLM(cfg).eval())


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return _randomize(Qwen3ForCausalLM(Qwen3Config(**COMMON, intermediate_size=512)).eval())


MODELS = {"qwen35": lambda: _qwen35(), "qwen35moe": lambda: _qwen35(moe=True), "qwen3": _qwen3}


def _write(tmp_path, model, mix, **kw):
    path = tmp_path / f"{model.config.model_type}-{mix}.gguf"
    return write_target_gguf(path, model.state_dict(), model.config.to_dict(), mix, **kw)


def _as_float(t):
    if isinstance(t, tuple):
        return torch.cat([_as_float(p) for p in t], dim=1)
    return t.dequantize() if isinstance(t, QuantTensor) else t.float()


def _round_trips_through_float_arithmetic(hf_name: str, arch: str) -> bool:
    """Tensors whose round trip goes through float arithmetic (+1/-1, exp/log): exact to one ulp, not bit for bit."""
    if hf_name.endswith("A_log"):
        return True
    return arch in names.ZERO_CENTRED_ARCHS and "norm" in hf_name and "linear_attn.norm" not in hf_name


@pytest.mark.parametrize("arch", list(MODELS))
def test_f32_round_trip_tensors_config_and_logits(tmp_path, arch):
    model = MODELS[arch]()
    m = read_gguf(_write(tmp_path, model, "F32"))
    assert m.arch == arch
    sd = model.state_dict()
    assert set(m.tensors) == set(sd)
    for name, want in sd.items():
        got = m.tensors[name]
        assert isinstance(got, torch.Tensor) and got.shape == want.shape, name
        if _round_trips_through_float_arithmetic(name, arch):
            # (w + 1) - 1 and log(exp(a)) round in float32: within one ulp of the stored value
            torch.testing.assert_close(got, want, rtol=0, atol=3e-7 * (1 + want.abs().max().item()))
        else:
            assert torch.equal(got, want), name
    cfg = m.hf_config
    for key in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
        "rms_norm_eps",
    ):
        assert cfg[key] == getattr(model.config, key), key
    if arch != "qwen3":
        for key in ("layer_types", *LINEAR):
            assert cfg[key] == getattr(model.config, key), key
        assert cfg["partial_rotary_factor"] == model.config.rope_parameters["partial_rotary_factor"]
    if arch == "qwen35moe":
        for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"):
            assert cfg[key] == getattr(model.config, key), key
    # the config dict builds the same HF model, and the tensors load into it: logits equal
    from transformers import AutoConfig, AutoModelForCausalLM

    rebuilt = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg)).eval()
    rebuilt.load_state_dict({k: m.tensors[k] for k in m.tensors})
    ids = torch.tensor([[1, 5, 9, 200, 17, 3, 42, 7]])
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(ids).logits, model(ids).logits, rtol=0, atol=1e-4)


@pytest.mark.parametrize("arch", list(MODELS))
def test_q4_k_m_mix_round_trip(tmp_path, arch):
    model = MODELS[arch]()
    m = read_gguf(_write(tmp_path, model, "Q4_K_M", fused_experts=arch == "qwen35moe"))
    fmts = set()
    for name, want in model.state_dict().items():
        got = m.tensors[name]
        if isinstance(got, QuantTensor):
            fmts.add(got.fmt.name)
            assert got.shape == tuple(want.shape), name
            # quantized once, decoded in HF layout: error within the format's few percent
            err = (got.dequantize() - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()
            assert err < {"Q4_K": 0.12, "Q6_K": 0.03, "Q5_0": 0.06, "Q8_0": 0.01}[got.fmt.name], (name, err)
        else:
            assert (
                got.dtype == torch.float32
                and want.ndim == 1
                or "conv1d" in name
                or "mlp.gate." in name
                or "shared_expert_gate" in name
            ), name
    assert {"Q4_K", "Q6_K"} <= fmts


def test_regrouped_tensors_keep_packed_rows_and_gather_inputs(tmp_path):
    """attn_qkv rows move as whole blocks (bit-exact vs requantizing nothing); ssm_out keeps its bytes."""
    model = _qwen35()
    m = read_gguf(_write(tmp_path, model, "Q4_K_M"))
    sd = model.state_dict()
    qkv = m.tensors["model.layers.0.linear_attn.in_proj_qkv.weight"]
    # rows of the HF tensor quantize independently: the read-back equals quantizing the HF rows directly
    direct = QuantTensor.from_float(sd["model.layers.0.linear_attn.in_proj_qkv.weight"], qkv.fmt)
    assert torch.equal(qkv.data, direct.data)
    out = m.tensors["model.layers.0.linear_attn.out_proj.weight"]
    assert out.input_index is not None and out.fmt.name == "Q4_K"
    lin = QuantLinear(out)
    x = torch.randn(3, out.shape[1])
    torch.testing.assert_close(lin(x), x @ out.dequantize().T, rtol=1e-5, atol=1e-5)
    # equals the file's blocks decoded by gguf's own numpy dequantizer, columns put back in HF order
    raw = next(t for t in m.header.tensors if t.name == "blk.0.ssm_out.weight")
    decoded = torch.from_numpy(gguf.quants.dequantize(raw.data, raw.tensor_type).astype(np.float32))
    dims = names.LinearAttnDims(2, 4, 32, 64)
    assert torch.equal(out.dequantize(), names.from_gguf(decoded, names.OUT_COLS, dims))


def test_as_many_k_as_v_heads_loads_without_reordering(tmp_path):
    """Nothing was regrouped: tensors come back as written and ssm_out needs no input gather."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    linear = dict(LINEAR, linear_num_key_heads=4, linear_num_value_heads=4, linear_value_head_dim=32)
    model = _randomize(Qwen3_5ForCausalLM(Qwen3_5TextConfig(**COMMON, **linear, intermediate_size=512)).eval())
    f32 = read_gguf(_write(tmp_path, model, "F32"))
    for name, want in model.state_dict().items():
        if "linear_attn" in name and "A_log" not in name and "norm" not in name:
            assert torch.equal(f32.tensors[name], want), name
    packed = read_gguf(_write(tmp_path, model, "Q4_K_M"))
    out = packed.tensors["model.layers.0.linear_attn.out_proj.weight"]
    assert isinstance(out, QuantTensor) and out.input_index is None


def test_split_expert_formats_stay_a_pair(tmp_path):
    model = _qwen35(moe=True)
    m = read_gguf(_write(tmp_path, model, "Q8_0"))
    gate_up = m.tensors["model.layers.0.mlp.experts.gate_up_proj"]
    assert isinstance(gate_up, QuantTensor) and gate_up.shape == (4, 512, 256)
    torch.testing.assert_close(
        gate_up.dequantize(), model.state_dict()["model.layers.0.mlp.experts.gate_up_proj"], rtol=0, atol=0.01
    )


def test_extra_mtp_layers_are_ignored(tmp_path):
    model = _qwen35()
    m = read_gguf(_write(tmp_path, model, "F32", extra_mtp_layers=1))
    assert m.hf_config["num_hidden_layers"] == 4
    assert not any(".layers.4." in k for k in m.tensors)
    assert any(n.startswith("blk.4.") for n in m.ignored)


def _drafter_state(hidden=256, layers=2, taps=(1, 3), inter=512, heads=2, kv=1, hd=64):
    g = torch.Generator().manual_seed(1)
    sd = {
        "fc.weight": torch.randn(hidden, hidden * len(taps), generator=g),
        "hidden_norm.weight": torch.randn(hidden, generator=g),
        "norm.weight": torch.randn(hidden, generator=g),
    }
    shapes = {
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (heads * hd, hidden),
        "self_attn.k_proj.weight": (kv * hd, hidden),
        "self_attn.v_proj.weight": (kv * hd, hidden),
        "self_attn.o_proj.weight": (hidden, heads * hd),
        "self_attn.q_norm.weight": (hd,),
        "self_attn.k_norm.weight": (hd,),
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
    }
    for i in range(layers):
        for k, s in shapes.items():
            sd[f"layers.{i}.{k}"] = torch.randn(s, generator=g)
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1e7,
        "max_position_embeddings": 4096,
        "block_size": 16,
        "num_target_layers": 4,
        "dflash_config": {"mask_token_id": 299, "target_layer_ids": list(taps)},
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 2048,
        "use_sliding_window": True,
    }
    return sd, cfg


@pytest.mark.parametrize("schema", names.DRAFTER_ARCHS)
@pytest.mark.parametrize("mix", ["F32", "Q8_0"])
def test_drafter_round_trip(tmp_path, schema, mix):
    sd, cfg = _drafter_state()
    m = read_gguf(write_drafter_gguf(tmp_path / "d.gguf", sd, cfg, mix, schema=schema))
    assert m.arch == schema and set(m.tensors) == set(sd)
    for name, want in sd.items():
        got = m.tensors[name]
        if mix == "F32" or want.ndim == 1:
            assert torch.equal(got, want), name  # drafter norms are stored as is (no +1)
        else:
            assert got.fmt.name == "Q8_0"
            torch.testing.assert_close(got.dequantize(), want, rtol=0, atol=float(want.abs().max()) / 127)
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "block_size",
        "layer_types",
        "sliding_window",
    ):
        assert m.hf_config[key] == cfg[key], key
    # llama.cpp hands a last-layer tap over un-normed; the fork's converter writes every drafter non-causal,
    # mainline's says nothing for a config that says nothing
    assert m.hf_config["dflash_config"] == {**cfg["dflash_config"], "last_layer_tap": "raw"}
    assert m.hf_config.get("is_causal") is (False if schema == "dflash-draft" else None)
    from dflash_chat.engine.models.config import DrafterConfig

    dc = DrafterConfig.from_dict(m.hf_config)
    assert dc.target_layer_ids == [1, 3] and dc.mask_token_id == 299 and dc.sliding_window == 2048


def _tiny_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen3_5.tokenization_qwen3_5 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["hello world, the quick brown fox jumps over the lazy dog 12345"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def test_tokenizer_and_chat_template_from_gguf(tmp_path):
    tok = _tiny_tokenizer()
    template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    model = _qwen35()
    path = _write(tmp_path, model, "F32", tokenizer=tok, chat_template=template)
    m = read_gguf(path)
    assert m.chat_template == template
    assert m.hf_config["eos_token_id"] == tok.eos_token_id
    back = tokenizer_from_gguf(m)
    text = "<|im_start|>user\nhello   world, the quick brown fox 123 jumps!<|im_end|>"
    assert back.encode(text) == tok.encode(text)
    assert back.decode(tok.encode(text)) == text
    assert back.eos_token == "<|im_end|>"
    msgs = [{"role": "user", "content": "hi"}]
    assert back.apply_chat_template(msgs, tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n"


# --- bad input -----------------------------------------------------------------------------


def test_wrong_magic(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGML" + bytes(100))
    with pytest.raises(ModelFormatError, match="not a GGUF file"):
        read_gguf(p)


def test_truncated_file(tmp_path):
    p = _write(tmp_path, _qwen3(), "Q8_0")
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError, match="truncated"):
        read_gguf(p)


def test_missing_file(tmp_path):
    with pytest.raises(ModelFormatError, match="no such GGUF file"):
        read_gguf(tmp_path / "nope.gguf")


def _tiny_gguf(path, arch, qtype=None):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    if qtype is None:
        w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    else:  # raw blocks of an unsupported type (IQ2_XXS: 66 bytes per 256 values)
        w.add_tensor("token_embd.weight", np.zeros((4, 66), dtype=np.uint8), raw_shape=(4, 66), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_arch(tmp_path):
    with pytest.raises(ModelFormatError, match="architecture 'llama' is not supported"):
        read_gguf(_tiny_gguf(tmp_path / "l.gguf", "llama"))


def test_unsupported_quant_type(tmp_path):
    with pytest.raises(ModelFormatError, match="tensor token_embd.weight is IQ2_XXS, which dflash-chat cannot run"):
        read_gguf(_tiny_gguf(tmp_path / "q.gguf", "qwen3", gguf.GGMLQuantizationType.IQ2_XXS))


@pytest.mark.parametrize("name", ["Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"])
def test_low_bit_types_read_as_gguf_decodes_them(tmp_path, name):
    """Blocks written as llama-quantize lays them out come back packed, and decode as gguf's numpy reference does."""
    from dflash_chat.engine.ggml.formats import FORMATS
    from dflash_chat.engine.weights.gguf import raw_tensor
    from tests.engine.quant_helpers import random_rows

    fmt = FORMATS[name]
    blocks = random_rows(fmt, 3, 512, seed=fmt.ggml_type)
    path = tmp_path / f"{name}.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3")
    qtype = gguf.GGMLQuantizationType(fmt.ggml_type)
    w.add_tensor("blk.0.ffn_down.weight", blocks, raw_shape=blocks.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tensor = gguf.GGUFReader(path).tensors[0]
    packed = raw_tensor(tensor)
    assert isinstance(packed, QuantTensor) and packed.fmt is fmt and packed.shape == (3, 512)
    want = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
    np.testing.assert_array_equal(packed.dequantize().numpy(), want)
    x = torch.randn(2, 512)
    torch.testing.assert_close(QuantLinear(packed)(x), x @ torch.from_numpy(want).T, rtol=1e-5, atol=1e-4)


def test_our_names_agree_with_gguf_tensor_map():
    """Every HF name we map lands where gguf's own TensorNameMap puts it (the converter's table)."""
    for arch, model in (("qwen35", _qwen35()), ("qwen3", _qwen3())):
        tmap = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), 4)
        glob, layer = names.target_rules(arch)
        for name in model.state_dict():
            rule = next((r for r in glob if r.hf == name), None)
            bid = int(name.split(".")[2]) if ".layers." in name else None
            rule = rule or next((r for r in layer if r.hf_name(bid) == name), None)
            assert rule is not None, name
            theirs = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
            if name.endswith("dt_bias"):
                theirs = f"blk.{bid}.ssm_dt.bias"  # the converter renames dt_bias to dt_proj.bias first
            assert rule.gguf_name(bid) == theirs, name
