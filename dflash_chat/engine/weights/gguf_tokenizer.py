"""A transformers tokenizer from a GGUF's tokenizer.ggml.* metadata, built with public APIs only.

transformers' own GGUF tokenizer code is internal and moved between 5.x releases (5.17 has no
`integrations.gguf.gguf_tokenizer_mapping`), so we build the byte-level BPE that Qwen's files
describe with the `tokenizers` library and wrap it in `PreTrainedTokenizerFast`, as Qwen's own
tokenizer classes do: NFC, the split regex `tokenizer.ggml.pre` names, byte-level pieces and decoder.

Token types (llama.cpp's): CONTROL tokens become special added tokens, USER_DEFINED ones (`<think>`)
plain added tokens, so both stay whole. UNUSED ones are the converter's `[PAD<id>]` fillers between
the real vocabulary and the padded embedding size: they are left out, so decoding them gives "" as
the official tokenizer (which does not have them) and llama.cpp (which prints nothing) do.
"""

from __future__ import annotations

from pathlib import Path

from dflash_chat.engine.errors import ModelFormatError
from dflash_chat.engine.weights.gguf_file import read_header

# llama.cpp's token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# the pre-tokenizer split of each `tokenizer.ggml.pre` we know (Qwen's tokenizer classes hold the same)
SPLITS = {
    "qwen2": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "qwen35": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}
SPLITS["deepseek-r1-qwen"] = SPLITS["qwen2"]
# what llama.cpp's converter writes for a tokenizer its table does not know (a fine-tune, a small model, our own
# demo converted); llama.cpp reads it with GPT-2's split (llama-vocab.cpp: LLAMA_VOCAB_PRE_TYPE_GPT2) and no
# normalization, and so do we (the `\s+` at the end takes the whitespace its hand-written split leaves alone)
SPLITS["gpt-2"] = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
UNNORMALIZED = ("gpt-2",)  # pre-tokenizers llama.cpp (and the tokenizer they come from) run without NFC

_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")


def tokenizer_from_gguf(source):
    """A PreTrainedTokenizerFast from a GGUF file (or a GGUFModel): vocabulary, merges, specials, chat template."""
    path = Path(getattr(source, "path", source))
    meta = read_header(path, decode=_KEYS).fields  # a missing, truncated or corrupt file says so first
    try:
        return _build(meta)
    except ModelFormatError as exc:
        raise ModelFormatError(
            f"{path}: cannot build a tokenizer from the GGUF metadata ({exc}). "
            "Use the model's official tokenizer files instead."
        ) from None
    except Exception as exc:  # noqa: BLE001 - the tokenizers library rejects bad vocabularies in its own words
        raise ModelFormatError(
            f"{path}: cannot build a tokenizer from the GGUF metadata "
            f"({type(exc).__name__}: {exc}). Use the model's official tokenizer files instead."
        ) from None


def _build(meta: dict):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    kind = meta.get("tokenizer.ggml.model")
    if kind is None:
        raise ModelFormatError("the file has no tokenizer.ggml.* metadata")
    if kind != "gpt2":
        raise ModelFormatError(f"tokenizer model {kind!r}: only byte-level BPE ('gpt2', Qwen's) is supported")
    pre = meta.get("tokenizer.ggml.pre")
    if pre not in SPLITS:
        raise ModelFormatError(f"pre-tokenizer {pre!r} is not known (known: {', '.join(sorted(SPLITS))})")
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise ModelFormatError(f"{len(tokens)} tokens but {len(types)} token types")
    vocab = {t: i for i, (t, kind) in enumerate(zip(tokens, types, strict=False)) if kind != UNUSED}
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    if pre not in UNNORMALIZED:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, kind in zip(tokens, types, strict=False)
            if kind == CONTROL
        ]
    )
    tok.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, kind in zip(tokens, types, strict=False)
            if kind == USER_DEFINED
        ]
    )

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    bos = token("bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token") and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, meta["tokenizer.ggml.bos_token_id"])]
        )
    specials = {
        "bos_token": bos,
        "eos_token": token("eos_token_id"),
        "pad_token": token("padding_token_id"),
        "unk_token": token("unknown_token_id"),
    }
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        chat_template=meta.get("tokenizer.chat_template"),
        **{k: v for k, v in specials.items() if v is not None},
    )
