"""The tokenizer a target GGUF carries: built from public APIs, padded vocabularies decoded as HF does.

Real vocabularies are padded to the embedding size (Qwen3.6: 248320 rows for about 248k tokens); the
converter lists the missing ids as `[PAD<id>]` tokens of type UNUSED, and HF's tokenizer (which does
not have them) and llama.cpp (which prints nothing for UNUSED) both decode them to "".
"""

from __future__ import annotations

import sys

import gguf
import pytest
import torch

from dflash_chat.engine.errors import ModelFormatError
from dflash_chat.engine.load import load_pair, load_tokenizer
from dflash_chat.engine.weights.gguf_tokenizer import tokenizer_from_gguf
from dflash_chat.runtime.detokenize import IncrementalDecoder
from tests.engine.gguf_write import write_target_gguf
from tests.engine.tiny import CHAT_TEMPLATE, target_config, write_tokenizer

PADDED = 400  # embedding rows; the tokenizer has 384 tokens
TEXT = "def main():\n    print('hello world')  # 12 apples <think>\n\n</think>"


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    """A qwen3 GGUF whose embedding is wider than its tokenizer, with the official tokenizer folder."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    root = tmp_path_factory.mktemp("padded")
    assert write_tokenizer(root) == 384
    official = load_tokenizer(root)
    model = Qwen3ForCausalLM(Qwen3Config(**target_config("qwen3", PADDED))).eval()
    path = write_target_gguf(
        root / "padded.gguf",
        model.state_dict(),
        model.config.to_dict(),
        "F32",
        tokenizer=official,
        chat_template=CHAT_TEMPLATE,
    )
    return path, official


def test_the_file_lists_pad_tokens_as_the_converter_does(padded):
    reader = gguf.GGUFReader(padded[0])
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    assert len(tokens) == PADDED and tokens[390] == "[PAD390]" and types[390] == gguf.TokenType.UNUSED
    assert types[tokens.index("<|im_start|>")] == gguf.TokenType.CONTROL


def test_padding_tokens_decode_to_nothing(padded):
    path, official = padded
    tok = tokenizer_from_gguf(path)
    ids = official.encode(TEXT)  # (the folder's tokenizer splits with GPT-2's regex, the GGUF's with Qwen's)
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert tok.decode([390]) == official.decode([390]) == ""
    with_pads = ids[:5] + [390, 399] + ids[5:]
    assert tok.decode(with_pads) == official.decode(with_pads) == TEXT
    assert len(tok) == len(official) == 384


def test_a_stream_with_padding_tokens_shows_only_the_text(padded):
    tok = tokenizer_from_gguf(padded[0])
    ids = tok.encode(TEXT)
    decoder = IncrementalDecoder(tok)
    shown = "".join(decoder.push([t]) + (decoder.push([395]) if i % 3 == 0 else "") for i, t in enumerate(ids))
    assert shown + decoder.flush() == TEXT


def test_the_gguf_tokenizer_needs_no_transformers_internals(padded, monkeypatch):
    """transformers 5.17 has no integrations.gguf.gguf_tokenizer_mapping: the import fails there."""
    for name in (
        "transformers.integrations.gguf.gguf_tokenizer_mapping",
        "transformers.integrations.gguf",
        "transformers.integrations.ggml",
    ):
        monkeypatch.setitem(sys.modules, name, None)  # importing it raises ImportError
    path, official = padded
    pair = load_pair(path, None, device="cpu", dtype=torch.float32)
    messages = [{"role": "user", "content": "hello world"}]
    text = pair.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == official.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert pair.tokenizer.encode(text) == official.encode(text)
    assert pair.tokenizer.eos_token == "<|im_end|>"


def test_a_tokenizer_the_builder_does_not_know_is_one_line(padded, tmp_path):
    src = gguf.GGUFReader(padded[0])
    writer = gguf.GGUFWriter(str(tmp_path / "spm.gguf"), "qwen3")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "a"])
    writer.add_tensor("token_embd.weight", src.tensors[0].data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        ModelFormatError,
        match=r"spm\.gguf: cannot build a tokenizer from the GGUF metadata "
        r"\(tokenizer model 'llama': only byte-level BPE",
    ) as exc:
        tokenizer_from_gguf(tmp_path / "spm.gguf")
    assert "\n" not in str(exc.value)


def test_a_gpt2_pre_tokenizer_reads_as_llama_cpp_reads_it(padded, tmp_path):
    """`tokenizer.ggml.pre = gpt-2` (what llama.cpp's converter writes for a tokenizer its table does not know) is
    read with GPT-2's split and no normalization, as llama.cpp reads it: the same ids as the `tokenizers` library's
    own GPT-2 byte-level pre-tokenizer over the same vocabulary (the tiny tokenizer's own), where Qwen's split
    gives others."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from tests.engine.gguf_write import _add_tokenizer

    src = gguf.GGUFReader(padded[0])
    writer = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "qwen3")
    _add_tokenizer(writer, padded[1], None, pre="gpt-2")
    writer.add_tensor("token_embd.weight", src.tensors[0].data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours = tokenizer_from_gguf(tmp_path / "gpt2.gguf")
    model = json.loads(padded[1].backend_tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    gpt2 = Tokenizer(models.BPE(vocab=model["vocab"], merges=merges, fuse_unk=False))
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    gpt2.decoder = decoders.ByteLevel()
    texts = ["x = 1000000  # 12 apples\n\n\tdef f():\n    return 'it''s'  ", "Cafe\u0301 and caf\u00e9 12345!!\n"]
    for text in texts:
        assert ours.encode(text, add_special_tokens=False) == gpt2.encode(text).ids
        assert ours.decode(ours.encode(text, add_special_tokens=False)) == text
        assert ours.encode(text, add_special_tokens=False) == padded[1].encode(text, add_special_tokens=False)
    qwen = tokenizer_from_gguf(padded[0])  # the same vocabulary read with Qwen's split: it matters
    assert any(qwen.encode(t, add_special_tokens=False) != gpt2.encode(t).ids for t in texts)
