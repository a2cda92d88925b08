"""The ids that end an answer, read from a tokenizer and a model config, and the other special tokens the prompt
code names. No torch: the prompt code uses `token_id` too."""

from __future__ import annotations

END_TOKENS = ("<|im_end|>", "<|endoftext|>")  # the chat templates' end of a turn, and of a text
IMAGE_PAD = "<|image_pad|>"  # the placeholder Qwen's chat template writes for an image


def end_token_ids(tokenizer, config_eos=None) -> tuple[int, ...]:
    """The ids that end an answer: the end tokens the vocabulary has, the tokenizer's eos, and the model
    config's own eos_token_id (one id or a list)."""
    ids = {i for i in (token_id(tokenizer, t) for t in END_TOKENS) if i is not None}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    if config_eos is not None:
        ids.update(config_eos if isinstance(config_eos, (list, tuple)) else (config_eos,))
    return tuple(sorted(ids))


def token_id(tokenizer, token: str) -> int | None:
    """The id of `token` when the vocabulary has it whole, else None.

    convert_tokens_to_ids looks one token up; get_vocab() would copy the whole vocabulary (about 150 ms at
    Qwen's 248k) on every call."""
    found = tokenizer.convert_tokens_to_ids(token)
    return found if isinstance(found, int) and found != tokenizer.unk_token_id else None
