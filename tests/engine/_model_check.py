"""Run under TRITON_INTERPRET=1 with every kernel selected (test_model_kernels.py): whole models on the fused
kernel paths (glue, attention, GDN, routing; float weights: the quantized matmuls are checked on their own,
and at model size the interpreter would take many minutes), decoding through the fixed-shape steps. Greedy
DFlash must equal greedy AR token for token, and no kernel may fall back to torch.

    python tests/engine/_model_check.py DIR
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

from dflash_chat.bench.oracle import OracleDrafter
from dflash_chat.engine import kernels
from dflash_chat.engine.load import load_pair, load_target
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from dflash_chat.models import demo
from dflash_chat.models.demo import demo_heldout_prompts
from dflash_chat.runtime.prompt import build_prompt
from tests.engine import tiny
from tests.engine.helpers import run


def same_as_ar(target, drafter, prompt, tokens: int) -> list[int]:
    params = SamplingParams(max_new_tokens=tokens)
    expected, _, _ = run(Engine(target, None, max_context=128, decode="fixed", speculate="none"), prompt, params)
    # the drafter alone at a fixed length: auto would also time prompt lookup's sizes in the interpreter
    dflash = Engine(target, drafter, max_context=128, decode="fixed", draft=15, speculate="dflash")
    got, finished, events = run(dflash, prompt, params)
    assert got == expected, f"DFlash {got} != AR {expected}"
    return [e.accepted for e in events[2:-1]]


def main(root: Path) -> None:
    assert kernels.use_triton(torch.zeros(1)) and kernels.kernel_wanted(torch.zeros(1), "GDN")
    warnings.simplefilter("error")  # a kernel that fails its first-use check warns: that must not happen
    # the trained demo pair: GDN and attention layers, the real drafter (long acceptances)
    # a fixed draft and the drafter alone: auto would time every size and method (the demo target has its own MTP
    # layer) in the interpreter; only the target and drafter are used below
    pair = load_pair(*demo.demo_paths(), device="cpu", max_context=128, draft=15, speculate="dflash")
    prompt = build_prompt(pair.tokenizer, demo_heldout_prompts()[0], thinking=False).ids
    # 12 tokens: the drafter accepts 10 of them in one step (the AR side, a step a token, is most of the time)
    accepted = same_as_ar(pair.engine.target, pair.engine.drafter, prompt, 12)
    assert max(accepted) >= 3, accepted
    # a routed (MoE) target, an error-injecting drafter: many acceptance lengths go through commit
    moe_dir, _ = tiny.write_pair(root / "moe", "qwen3_5_moe", layers=2)
    target = load_target(moe_dir, "cpu", torch.float32)
    prompt = [5, 9, 13, 2, 7]
    expected, _, _ = run(
        Engine(target, None, max_context=128, decode="fixed", speculate="none"),
        prompt,
        SamplingParams(max_new_tokens=12),
    )
    oracle = OracleDrafter(prompt + expected, target.cfg.vocab_size, block_size=16, mode="uniform", seed=3)
    assert same_as_ar(target, oracle, prompt, 12)
    print("model kernel checks passed")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
