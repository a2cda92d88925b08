"""Measuring a trained pair the way the app runs it: the engine, greedy, thinking off.

`measure_pair` decodes the same held-out prompts with the DFlash engine and with the same engine
without a drafter (autoregressive), checks that the two outputs are identical token for token, and
reports the mean acceptance length and both decode speeds measured in this one run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

DEMO_HELDOUT = "heldout_prompts.json"


@dataclass
class PromptResult:
    prompt_tokens: int
    new_tokens: int
    verify_steps: int
    committed_in_verify: int
    ar_decode_s: float
    dflash_decode_s: float
    identical: bool


@dataclass
class PairReport:
    results: list[PromptResult] = field(default_factory=list)
    histogram: list[int] = field(default_factory=list)

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens committed per verify step (accepted drafts + the target's own token), over all prompts."""
        steps = sum(r.verify_steps for r in self.results)
        return sum(r.committed_in_verify for r in self.results) / steps if steps else 0.0

    @property
    def ar_tokens_per_s(self) -> float:
        return _rate(self.results, "ar_decode_s")

    @property
    def dflash_tokens_per_s(self) -> float:
        return _rate(self.results, "dflash_decode_s")

    @property
    def speedup(self) -> float:
        return self.dflash_tokens_per_s / self.ar_tokens_per_s if self.ar_tokens_per_s else 0.0

    @property
    def identical(self) -> bool:
        return all(r.identical for r in self.results)

    def as_dict(self) -> dict:
        return {
            "prompts": len(self.results),
            "new_tokens": sum(r.new_tokens for r in self.results),
            "mean_acceptance_length": self.mean_acceptance_length,
            "acceptance_histogram": self.histogram,
            "ar_decode_tokens_per_s": self.ar_tokens_per_s,
            "dflash_decode_tokens_per_s": self.dflash_tokens_per_s,
            "speedup": self.speedup,
            "identical_greedy_output": self.identical,
        }


def _rate(results: list[PromptResult], attr: str) -> float:
    tokens = sum(r.new_tokens - 1 for r in results)
    seconds = sum(getattr(r, attr) for r in results)
    return tokens / seconds if seconds > 0 else 0.0


def demo_heldout_prompts() -> list[list[dict]]:
    """The held-out chats shipped beside the demo pair (never seen in training)."""
    from dflash_chat.demo import demo_dir

    return json.loads((demo_dir() / DEMO_HELDOUT).read_text())


def measure_pair(target_dir: str | Path, drafter_dir: str | Path, *, prompts: int | list[list[dict]] = 16,
                 max_new_tokens: int = 128, enable_thinking: bool = False, device: str = "cpu") -> PairReport:
    """DFlash vs autoregressive on held-out prompts (greedy), each prompt decoded by both, interleaved."""
    import torch

    from dflash_chat.engine.load import load_pair
    from dflash_chat.engine.sampling import SamplingParams

    chats = demo_heldout_prompts()[:prompts] if isinstance(prompts, int) else prompts
    spec = load_pair(target_dir, drafter_dir, device=device, dtype=torch.float32)
    plain = load_pair(target_dir, None, device=device, dtype=torch.float32)
    tok = spec.tokenizer
    stops = tuple(t for t in (tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>"))
                  if isinstance(t, int) and t >= 0)
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=stops)
    report = PairReport(histogram=[0] * spec.engine.block_size)
    encoded = [tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False, enable_thinking=enable_thinking)
               for chat in chats]
    ids = [tok(text, add_special_tokens=False)["input_ids"] for text in encoded]
    if ids:  # warm both engines up (first calls pay for allocation)
        _decode(plain.engine, ids[0], params)
        _decode(spec.engine, ids[0], params)
    for prompt in ids:
        ar_tokens, ar_stats, _ = _decode(plain.engine, prompt, params)
        sp_tokens, sp_stats, steps = _decode(spec.engine, prompt, params)
        for step in steps:
            report.histogram[step.accepted] += 1
        report.results.append(PromptResult(
            prompt_tokens=len(prompt),
            new_tokens=len(sp_tokens),
            verify_steps=len(steps),
            committed_in_verify=sum(len(s.token_ids) for s in steps),
            ar_decode_s=ar_stats.decode_s,
            dflash_decode_s=sp_stats.decode_s,
            identical=ar_tokens == sp_tokens,
        ))
    return report


def _decode(engine, prompt: list[int], params):
    """(new tokens, final stats, the verify steps) for one prompt from a fresh state."""
    from dflash_chat.engine.events import Finished, Step

    engine.reset()
    tokens, steps, stats = [], [], None
    for event in engine.generate(prompt, params):
        if isinstance(event, Step):
            tokens.extend(event.token_ids)
            if event.drafted:
                steps.append(event)
        elif isinstance(event, Finished):
            if event.reason == "error":
                raise RuntimeError(event.error)
            stats = event.stats
    return tokens, stats, steps


def format_report(report: PairReport) -> str:
    d = report.as_dict()
    return "\n".join([
        f"held-out prompts: {d['prompts']} (greedy, thinking off), {d['new_tokens']} new tokens",
        f"mean acceptance length: {d['mean_acceptance_length']:.2f} tokens per verify step",
        f"acceptance histogram (accepted drafts per step): {d['acceptance_histogram']}",
        f"autoregressive decode: {d['ar_decode_tokens_per_s']:.1f} tok/s",
        f"DFlash decode:         {d['dflash_decode_tokens_per_s']:.1f} tok/s  ({d['speedup']:.2f}x)",
        f"identical greedy output: {'yes' if d['identical_greedy_output'] else 'NO'}",
    ])
