"""A tiny target whose greedy continuation is set by hand, so the real engine writes tool calls on cue.

Every layer adds nothing to the residual stream (attention's o_proj, the DeltaNet's out_proj and the MLP's
down_proj are zero), so the next token depends on the last one alone: logits = lm_head(norm(embed[last])).
lm_head is set so that each token of NEXT leads to the one it names. The tokenizer is the tiny BPE with the
tags of a call as added tokens and the demo's chat template (Qwen3.6's shape, tools included), so:

- after a forced call's opening (`<tool_call>\\n<function=NAME>\\n`, the prompt's last token `>\\n`), the model
  closes the call: `</function>\\n</tool_call>`, then ends. A chat whose tool choice names a tool makes its
  first answer call it, with no arguments;
- after the generation prompt (its last token `\\n\\n`, thinking off) it answers `Done.`, or, built with
  `calls=True`, it calls `echo` on its own, every time (a model that never stops calling).

Built with transformers' own class, and checked against transformers' greedy generation before it is saved.
"""

from __future__ import annotations

from pathlib import Path

import torch

import dflash_chat
from dflash_chat.bench.tiny_target import target_config, write_tokenizer

from .tiny import write_drafter

TEMPLATE = Path(dflash_chat.__file__).parent / "demo_data" / "target" / "chat_template.jinja"
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "\n<function=", ">\n"]
ADDED += ["</function>\n", "\n\n", "Done.", "echo"]
CLOSE = {">\n": "</function>\n", "</function>\n": "</tool_call>", "</tool_call>": "<|im_end|>"}
ANSWER = {"\n\n": "Done.", "Done.": "<|im_end|>"}
CALL = {"\n\n": "<tool_call>", "<tool_call>": "\n<function=", "\n<function=": "echo", "echo": ">\n"}
HIDDEN = 64


def write_scripted_pair(root: Path, *, calls: bool = False) -> tuple[Path, Path]:
    """The pair under `root` (target/, drafter/); `calls`: the model calls `echo` on its own."""
    target, drafter = Path(root) / "target", Path(root) / "drafter"
    tokenizer = _tokenizer(target)
    chain = {**CLOSE, **(CALL if calls else ANSWER)}
    next_ids = {tokenizer.convert_tokens_to_ids(a): tokenizer.convert_tokens_to_ids(b) for a, b in chain.items()}
    assert all(isinstance(i, int) and i >= 0 for pair in next_ids.items() for i in pair), next_ids
    model = _model(len(tokenizer), next_ids)
    _check(model, tokenizer, calls)
    model.save_pretrained(str(target))
    write_drafter(drafter, target, seed=1)
    return target, drafter


def _tokenizer(directory: Path):
    from transformers import AutoTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    write_tokenizer(directory)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    tokenizer.add_tokens(ADDED)
    tokenizer.chat_template = TEMPLATE.read_text()
    tokenizer.save_pretrained(str(directory))
    return tokenizer


def _model(vocab: int, next_ids: dict[int, int]):
    import transformers as tf

    cfg = target_config("qwen3_5", vocab, hidden=HIDDEN, layers=2)
    torch.manual_seed(0)
    model = tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**cfg)).float().eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight", "model.norm.weight")):
                p.zero_()  # nothing reaches the residual stream; the final norm multiplies by 1 + 0
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
        embed = model.model.embed_tokens.weight
        embed.copy_(torch.randn(embed.shape, generator=gen))
        normed = embed / embed.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        head = torch.zeros_like(model.lm_head.weight)
        for last, following in next_ids.items():
            head[following] += 30.0 * normed[last] / HIDDEN  # that token's logit: 30; any other's: noise of ~4
        model.lm_head.weight.copy_(head)
    return model


def _check(model, tokenizer, calls: bool) -> None:
    """Greedy generation by transformers gives the scripted continuations."""
    turns = [{"role": "user", "content": "hi"}]
    prompt = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    forced = prompt + "<tool_call>\n<function=fail>\n"
    expected = [
        (prompt, "<tool_call>\n<function=echo>\n</function>\n</tool_call>" if calls else "Done."),
        (forced, "</function>\n</tool_call>"),
    ]
    for text, continuation in expected:
        ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
        out = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=tokenizer.eos_token_id)
        written = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        assert written == continuation, (text[-40:], written)
