"""`bench --demo --decisions`: auto's choices on the demo pair, priced from one frozen table of step costs."""

from __future__ import annotations

import json

import pytest

from dflash_chat.bench.decisions import CLASSES
from dflash_chat.cli import main

ARGV = ["bench", "--demo", "--decisions", "--prompts", "1", "--tokens", "24", "--device", "cpu", "--json"]


def _table(verify: float, draft: float) -> dict:
    """Every verify size at `verify` seconds, every method's draft at `draft`."""
    sizes = (1, 2, 3, 4, 8, 16)
    return {
        "verify": {str(T): verify for T in sizes},
        "draft": {m: {str(T): draft for T in sizes if T > 1} for m in ("dflash", "mtp", "lookup")},
    }


def _run(capsys, *extra: str) -> dict:
    assert main([*ARGV[:3], *extra, *ARGV[3:]]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_same_table_gives_the_same_greedy_figures_and_every_class_is_scored(capsys, tmp_path):
    """The run prints the table it priced from; given back as COSTS it prices the same greedy choices alike (no
    timing moves them), which is what lets two trees be compared on one table."""
    first = _run(capsys)
    assert first["setup"]["costs_from"] == "measured at warm-up" and first["costs"]["verify"]["1"] > 0
    table = tmp_path / "costs.json"
    table.write_text(json.dumps(first["costs"]))
    again = _run(capsys, str(table))
    whole = tmp_path / "run.json"  # a whole run's JSON prices alike
    whole.write_text(json.dumps(first))
    assert _run(capsys, str(whole))["temperatures"]["0"] == again["temperatures"]["0"]
    assert again["costs"] == first["costs"] and again["setup"]["costs_from"] == str(table)
    for run in (first, again):
        assert len(run["temperatures"]) == 2
        for leg in run["temperatures"].values():
            assert list(leg["classes"]) == list(CLASSES)
            assert all(c["answers"] >= 1 and c["plain_over_auto"] > 0 for c in leg["classes"].values())
    greedy = [run["temperatures"]["0"]["classes"] for run in (first, again)]
    assert greedy[0] == greedy[1]


def test_where_drafts_are_free_and_a_verify_costs_a_plain_step_no_answer_is_dearer_than_plain(capsys, tmp_path):
    """Priced so that a step of any size costs one plain step, every step lands at least a token for that price:
    no answer of auto's can cost more than plain decoding's (each verify is priced once, drafts at nothing)."""
    table = tmp_path / "costs.json"
    table.write_text(json.dumps(_table(1.0, 0.0)))
    for leg in _run(capsys, str(table))["temperatures"].values():
        assert all(c["least"] >= 1.0 for c in leg["classes"].values()), leg


def test_where_every_draft_costs_many_plain_steps_auto_decodes_plainly(capsys, tmp_path):
    """The frozen table is what auto chooses by: drafts priced at fifty plain steps leave it plain but for its
    tries, and no step of its can cost less than plain decoding's for the tokens it lands."""
    table = tmp_path / "costs.json"
    table.write_text(json.dumps(_table(1.0, 50.0)))
    for leg in _run(capsys, str(table))["temperatures"].values():
        for c in leg["classes"].values():
            drafted = sum(n for method, n in c["steps"].items() if method != "plain")
            assert c["steps"]["plain"] > 2 * drafted and c["plain_over_auto"] <= 1.0, c


@pytest.mark.parametrize(
    "content, said",
    [
        (None, "cannot read the cost table"),
        ("not json", "is not a cost table"),
        (json.dumps({"verify": {"1": 1.0}, "draft": {}}), "lacks a figure for verify 2"),
    ],
)
def test_a_cost_table_that_cannot_be_used_is_one_line(capsys, tmp_path, content, said):
    table = tmp_path / "costs.json"
    if content is not None:
        table.write_text(content)
    assert main([*ARGV[:3], str(table), *ARGV[3:]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "argv, said",
    [
        (["bench", "--decisions", "--device", "cpu"], "use it with --demo"),
        (["bench", "--demo", "--seeds", "3", "--device", "cpu"], "--seeds goes with --demo --decisions"),
    ],
)
def test_decisions_and_its_seeds_go_with_the_demo_alone(capsys, argv, said):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err


def test_the_sampled_leg_answers_each_prompt_once_a_seed(capsys, tmp_path):
    table = tmp_path / "costs.json"
    table.write_text(json.dumps(_table(1.0, 0.1)))
    run = _run(capsys, str(table), "--seeds", "3")
    assert run["setup"]["seeds"] == 3
    greedy, sampled = run["temperatures"].values()
    assert all(c["answers"] == 1 for c in greedy["classes"].values())
    assert all(c["answers"] == 3 for c in sampled["classes"].values())
