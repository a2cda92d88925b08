"""Measuring a trained pair the way the app runs it: the engine, greedy, thinking off.

`measure_pair` decodes the same held-out prompts with the DFlash engine and with the same engine
without a drafter (autoregressive), checks that the two outputs are identical token for token, and
reports the mean acceptance length and both decode speeds measured in this one run.
"""

from __future__ import annotations

from pathlib import Path

from dflash_chat.bench.comparison import Comparison, compare
from dflash_chat.models.demo import demo_heldout_prompts


def measure_pair(
    target_dir: str | Path,
    drafter_dir: str | Path,
    *,
    prompts: int | list[list[dict]] = 16,
    max_new_tokens: int = 128,
    enable_thinking: bool = False,
    device: str = "cpu",
) -> Comparison:
    """DFlash vs autoregressive on held-out prompts (greedy), each prompt decoded by both, interleaved."""
    import torch

    from dflash_chat.engine.load import load_pair
    from dflash_chat.engine.sampling_params import SamplingParams
    from dflash_chat.runtime.prompt import build_prompt

    chats = demo_heldout_prompts()[:prompts] if isinstance(prompts, int) else prompts
    spec = load_pair(target_dir, drafter_dir, device=device, dtype=torch.float32)
    plain = load_pair(target_dir, None, device=device, dtype=torch.float32)
    tok = spec.tokenizer
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)  # the engine stops at the model's end ids
    ids = [build_prompt(tok, chat, thinking=enable_thinking).ids for chat in chats]
    return compare(plain.engine, lambda prompt, ar_tokens: spec.engine, ids, params)


def format_report(report: Comparison) -> str:
    d = report.as_dict()
    return "\n".join(
        [
            f"held-out prompts: {d['prompts']} (greedy, thinking off), {d['new_tokens']} new tokens",
            f"mean acceptance length: {d['mean_acceptance_length']:.2f} tokens per verify step",
            f"acceptance histogram (accepted drafts per step): {d['acceptance_histogram']}",
            f"autoregressive decode: {d['ar_tokens_per_s']:.1f} tok/s",
            f"DFlash decode:         {d['dflash_tokens_per_s']:.1f} tok/s  ({d['speedup']:.2f}x)",
            f"identical greedy output: {'yes' if d['identical_output'] else 'NO'}",
        ]
    )
