"""The pairs plain `dflash-chat bench` measures: a tiny random target, or a user's own target + drafter.

The tiny random target is measured with an error-injecting drafter (oracle.py): plain decoding first, to
learn the true continuation, then DFlash from drafts that are right with the asked-for probability. With
`vs_transformers`, transformers' own generate() is timed on the same weights. A user's pair is measured
with its real drafter on a few fixed questions, after its load is timed beside the disk's read rate.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from dflash_chat.bench.comparison import Comparison, compare, report

REAL_QUESTIONS = (
    "Show the function that joins path components in posixpath.",
    "What does the with statement do?",
    "Write a function that reads a JSON file.",
    "How do I sort a list of tuples by the second item?",
    "Show the class definition of OrderedDict.",
    "What is a generator expression?",
)


@dataclass
class Measured:
    """One pair's comparison, and the figures beside it (transformers' generate(), or the load)."""

    title: str
    comparison: Comparison
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"setup": self.title, **self.comparison.as_dict(), **self.extra}

    def report(self) -> str:
        text = report(self.comparison, self.title)
        hf = self.extra
        if "transformers_tokens_per_s" in hf:
            text += (
                f"\n  transformers    {hf['transformers_tokens_per_s']:8.1f} tok/s (generate, greedy, same weights; "
                f"same tokens: {'yes' if hf['transformers_identical'] else 'NO'})\n"
                f"  ours AR / transformers {hf['ar_vs_transformers']:.2f}x, DFlash / transformers {hf['dflash_vs_transformers']:.2f}x"
            )
        return text


def measure_random(
    folder: Path,
    *,
    arch: str,
    hidden: int,
    layers: int,
    device: str | None,
    dtype: str | None,
    prompts: int,
    tokens: int,
    block: int,
    acceptance: float,
    vs_transformers: bool = False,
) -> Measured:
    """A tiny random target written into `folder`, against DFlash with an error-injecting drafter."""
    import torch

    from dflash_chat.bench.oracle import OracleDrafter
    from dflash_chat.bench.tiny_target import write_target
    from dflash_chat.engine.load import load_target
    from dflash_chat.engine.sampling_params import SamplingParams
    from dflash_chat.engine.spec import Engine

    hf = write_target(folder, arch, hidden=hidden, layers=layers, seed=0)
    target = load_target(folder, device, getattr(torch, dtype) if dtype else None)
    context = 64 + tokens + block
    ar = Engine(target, None, max_context=context, speculate="none")
    rng = random.Random(0)
    ids = [[rng.randrange(target.cfg.vocab_size) for _ in range(32)] for _ in range(prompts)]

    def spec_for(prompt, ar_tokens):
        oracle = OracleDrafter(
            prompt + ar_tokens, target.cfg.vocab_size, block_size=block, accept_prob=acceptance, seed=len(ar_tokens)
        )
        return Engine(target, oracle, max_context=context, speculate="dflash")

    title = (
        f"tiny random {arch} target (hidden {hidden}, {layers} layers) on {target.model.norm.weight.device}; "
        f"autoregressive decoding first, to learn the true continuation, then DFlash with an error-injecting "
        f"drafter (block {block}, each drafted token right with probability {acceptance})"
    )
    result = compare(ar, spec_for, ids, SamplingParams(max_new_tokens=tokens))
    extra = time_transformers(hf, target, ids, result) if vs_transformers else {}
    return Measured(title, result, extra)


def measure_real(target_dir, drafter_dir, *, device: str | None, prompts: int, tokens: int, log=print) -> Measured:
    """A user's pair on the first `prompts` of REAL_QUESTIONS, greedy, after its load is timed."""
    from dflash_chat.engine.load import load_drafter, load_pair, model_bytes, resolve_model_path
    from dflash_chat.engine.sampling_params import SamplingParams
    from dflash_chat.engine.spec import Engine
    from dflash_chat.models import disk
    from dflash_chat.models.sizes import rate_text, size_text
    from dflash_chat.runtime.prompt import build_prompt

    # the disk first (its cache dropped), then the load: the load reads what the disk has
    disk_rate, dropped = disk.read_rate(disk.largest_file(resolve_model_path(target_dir, "target")[1]))
    t0 = time.perf_counter()
    pair = load_pair(target_dir, None, device=device, max_context=4096, speculate="none")
    seconds = time.perf_counter() - t0
    size = model_bytes(target_dir)
    load = {
        "load_bytes": size,
        "load_s": seconds,
        "load_bytes_per_s": size / seconds,
        "disk_read_bytes_per_s": disk_rate,
        "disk_cache_dropped": dropped,
    }
    log(
        f"loaded the target ({size_text(size)}) in {seconds:.1f} s: {rate_text(size / seconds)}; the disk reads "
        f"it at {rate_text(disk_rate)}" + ("" if dropped else " (page cache not dropped: may be memory's)")
    )
    drafter = load_drafter(drafter_dir, pair.engine.target)
    spec = Engine(pair.engine.target, drafter, max_context=4096, end_ids=pair.engine.end_ids, speculate="dflash")
    questions = REAL_QUESTIONS[:prompts]
    ids = [build_prompt(pair.tokenizer, [{"role": "user", "content": q}], thinking=False).ids for q in questions]
    params = SamplingParams(max_new_tokens=tokens)
    result = compare(pair.engine, lambda prompt, ar_tokens: spec, ids, params)
    return Measured(f"{target_dir} + {drafter_dir}, greedy", result, load)


def time_transformers(hf, target, prompts, result: Comparison) -> dict:
    """transformers' own generate() on the tiny target: decode tok/s measured like ours (after the first token)."""
    import torch

    weight = target.model.norm.weight
    device = weight.device
    hf = hf.to(device=device, dtype=weight.dtype)  # same precision as ours
    hf.generation_config.eos_token_id = None  # our runs have no stop token either
    hf.generation_config.pad_token_id = 0
    tokens = seconds = 0.0
    identical = True
    for prompt, ours in zip(prompts, result.ar, strict=True):
        ids = torch.tensor([prompt], device=device)
        # an explicit mask: otherwise generate() masks prompt tokens that equal the pad id
        kw = dict(attention_mask=torch.ones_like(ids), do_sample=False)
        n = len(ours.tokens)
        with torch.no_grad():
            hf.generate(ids, max_new_tokens=1, **kw)  # prefill + first token, timed apart
            t0 = time.perf_counter()
            one = hf.generate(ids, max_new_tokens=1, **kw)
            t1 = time.perf_counter()
            out = hf.generate(ids, max_new_tokens=n, **kw)
            t2 = time.perf_counter()
        del one
        seconds += max((t2 - t1) - (t1 - t0), 1e-9)
        tokens += n - 1
        identical &= out[0, len(prompt) :].tolist() == ours.tokens
    rate = tokens / seconds
    return {
        "transformers_tokens_per_s": rate,
        "transformers_identical": identical,
        "ar_vs_transformers": result.ar_tokens_per_s / rate,
        "dflash_vs_transformers": result.spec_tokens_per_s / rate,
    }
