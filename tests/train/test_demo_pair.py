"""The shipped demo pair: loads through the normal loader, decodes losslessly, and its drafter is trained."""

from __future__ import annotations

import json

import pytest
import torch

from dflash_chat.models.demo import demo_available, demo_dir, demo_paths

# Floor for the mean acceptance length on held-out prompts: an untrained drafter stays near 1.
ACCEPTANCE_FLOOR = 2.5
MAX_BYTES = 25 * 10**6


@pytest.fixture(scope="module")
def report():
    from dflash_chat.models.demo import demo_heldout_prompts
    from dflash_chat.train.evaluate import measure_pair

    torch.set_num_threads(1)
    target, drafter = demo_paths()
    return measure_pair(target, drafter, prompts=demo_heldout_prompts()[:4], max_new_tokens=64)


def test_the_demo_pair_is_shipped_and_small():
    assert demo_available()
    files = [p for p in demo_dir().rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert sum(p.stat().st_size for p in files) <= MAX_BYTES


def test_the_demo_pair_loads_through_the_normal_loader():
    from dflash_chat.engine.load import load_pair

    target, drafter = demo_paths()
    pair = load_pair(target, drafter, device="cpu", dtype=torch.float32)
    assert pair.engine.drafter is not None and pair.engine.block_size == 16
    cfg = json.loads((drafter / "config.json").read_text())
    assert cfg["dflash_config"]["mask_token_id"] == pair.tokenizer.convert_tokens_to_ids("<|mask|>")
    prompt = pair.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_greedy_dflash_output_equals_autoregressive(report):
    assert report.identical
    assert report.new_tokens >= 4 * 8


def test_the_drafter_is_really_trained(report):
    assert report.mean_acceptance_length >= ACCEPTANCE_FLOOR


def test_run_demo_json_prints_the_stats_record(capsys):
    from dflash_chat.cli import main

    rc = main(
        [
            "run",
            "--demo",
            "--prompt",
            "Show the function `dedent` from module `textwrap`.",
            "--max-tokens",
            "24",
            "--device",
            "cpu",
            "--context",
            "512",
            "--json",
        ]
    )
    assert rc == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["speculative"] is True and record["drafter"] == demo_paths()[1].name
    assert 1 <= record["new_tokens"] <= 24
    assert record["steps"] >= 1 and record["mean_acceptance_length"] >= 1.0


def test_demo_runs_the_drafter_its_bench_measured_faster():
    """demo.json names a shipped drafter, and the committed `bench --demo` result it cites found it the faster."""
    import re
    from pathlib import Path

    from dflash_chat.models.demo import CHOICE_FILE, DRAFTER_DIRS, chosen_kind, demo_drafters

    choice = json.loads((demo_dir() / CHOICE_FILE).read_text())
    assert choice["drafter"] in demo_drafters() and chosen_kind() == choice["drafter"]
    assert demo_paths()[1].name == DRAFTER_DIRS[choice["drafter"]]
    cited = re.search(r"bench/results/\S+\.json", choice["why"]).group(0)
    result = json.loads((Path(__file__).resolve().parents[2] / cited).read_text())["bench"]
    assert result["faster"]["drafter"] == choice["drafter"] and result["identical"] is True
    assert set(result["setup"]["drafters"]) == set(demo_drafters())
