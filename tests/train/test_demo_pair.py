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


@pytest.fixture(scope="module")
def tool_chats():
    from dflash_chat.train.tool_bench import heldout_chats

    return [c for c in heldout_chats() if c.call is not None and not c.more][:4]


def test_greedy_dflash2_decoding_of_tool_turns_equals_plain_decoding(tool_chats):
    """A request for a call and the answer after the tool's result: DFlash2's greedy tokens are plain
    decoding's, and its drafts land."""
    from dflash_chat.bench.comparison import compare
    from dflash_chat.engine.load import load_pair
    from dflash_chat.engine.sampling_params import SamplingParams
    from dflash_chat.train.tool_bench import prompt_ids
    from dflash_chat.train.tool_corpus import call_turns, result_turns

    target, drafter = demo_paths("dflash2")
    spec = load_pair(target, drafter, device="cpu", dtype=torch.float32)
    plain = load_pair(target, None, device="cpu", dtype=torch.float32)
    chat = tool_chats[0]
    ids = [prompt_ids(spec.tokenizer, turns, chat) for turns in (call_turns(chat), result_turns(chat))]
    report = compare(plain.engine, lambda *_: spec.engine, ids, SamplingParams(temperature=0.0, max_new_tokens=96))
    assert report.identical and report.new_tokens >= 2 * 8
    assert report.mean_acceptance_length > 2.0


def test_bench_tools_judges_every_class_and_finds_greedy_output_identical(capsys):
    """`bench --tools` on one held-out turn of each class: the checks' shares, DFlash2's τ per class, the goals,
    and DFlash2's greedy text equal to plain decoding's (else its exit status is 1)."""
    from dflash_chat.cli import main

    rc = main(["bench", "--tools", "--prompts", "1", "--tokens", "8", "--temperature", "0", "--threads", "1", "--json"])
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and figures["identical"] is True
    classes = figures["temperatures"]["0"]["classes"]
    assert set(classes) == {"call", "no_tool", "result", "prose"}
    assert set(classes["call"]["checks"]) == {"right", "right_tool", "exact"}
    for name in ("call", "no_tool", "result"):
        shares = classes[name]["checks"]["right"]
        assert set(shares) == {"all", "plain", "dflash2/15", "dflash2/auto"} and 0 <= shares["all"] <= 1
    assert classes["prose"]["checks"] == {} and classes["call"]["drafts"]["dflash2/15"]["tau"] >= 1.0
    assert set(figures["goals"]["0"]) == {"right_calls", "right_calls_met", "tau_call", "tau_prose", "tau_met"}
    held = figures["temperatures"]["0"]["constrained"]  # the call request free and held to the call grammar
    assert set(held) == {"unconstrained", "required", "auto"}
    for h in held.values():  # a cut answer is never a call
        assert h["answers"] == 1 and h["exact"] <= h["right"] <= h["well_formed"] <= 1 - h["cut"]
