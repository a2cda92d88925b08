"""`bench --demo --against REV`: the plumbing of the per-step guard (no timing is asserted: the machine decides
those)."""

import json
import subprocess

import pytest

from dflash_chat.bench import step_guard, step_probe
from dflash_chat.cli import main
from dflash_chat.errors import UserError


def _kind(steps: int, verify_s: float, draft_s: float = 0.0, host_s: float | None = None, methods=None) -> dict:
    return {
        "steps": steps,
        "new_tokens": 2 * steps + 1,
        "answers": 1,
        "decode_s": verify_s + draft_s + 0.001,
        "draft_s": draft_s,
        "verify_s": verify_s,
        "host_s": host_s,
        "methods": methods or {},
    }


def _answers(scales: list[float], host: bool) -> dict:
    """kind -> [prompt -> its runs], one run per scale (a slower machine stretches every figure of a run)."""
    kinds = {
        "plain": [[_kind(10, 0.1 * x, host_s=0.0004 if host else None) for x in scales]],
        "dflash": [[_kind(4, 0.08 * x, 0.02 * x, host_s=0.0002 if host else None) for x in scales]],
    }
    if host:
        methods = {
            "dflash": {"steps": 4, "drafted": 40, "accepted": 9, "host_s": 0.0004},
            "plain": {"steps": 1, "drafted": 0, "accepted": 0, "host_s": 1e-4},
        }
        kinds["auto"] = [[_kind(5, 0.1 * x, 0.02, 0.0005, methods) for x in scales]]
    return kinds


def test_each_answers_fastest_run_counts_and_the_ratios_cover_the_kinds_both_trees_have():
    this = step_guard.summary(_answers([3.0, 1.0, 1.2], True))  # a busy run does not count
    earlier = step_guard.summary(_answers([2.0, 2.5], False))
    assert this["plain"]["verify_ms"] == pytest.approx(10.0) and earlier["plain"]["verify_ms"] == pytest.approx(20.0)
    assert this["plain"]["host_us"] == pytest.approx(40.0) and "host_us" not in earlier["plain"]
    assert this["auto"]["host_us_by_method"] == pytest.approx({"dflash": 100.0, "plain": 100.0})
    # decode tok/s of each: 8 tokens after the first in 0.101 s against 20 in 0.101 s
    assert this["dflash_over_plain"] == pytest.approx(8 / 20)
    ratios = step_guard.ratios(this, earlier)
    assert set(ratios) == {"plain step", "verify 16", "draft 15", "dflash step"}  # auto only in this tree
    assert ratios["verify 16"] == pytest.approx(0.5) and ratios["draft 15"] == pytest.approx(0.5)
    figures = {
        "setup": {
            "this_commit": "a" * 40,
            "this_tree_modified": True,
            "against": "v1",
            "earlier_commit": "b" * 40,
            "prompts": 1,
            "tokens": 8,
            "threads": 1,
            "pairs": 3,
        },
        "this": this,
        "earlier": earlier,
        "ratios": ratios,
    }
    text = step_guard.format_report(figures)
    assert any(line.split()[:3] == ["verify", "16", "0.50x"] for line in text.splitlines())
    assert "host time per step, this tree" in text and "auto by method" in text
    assert "host time per step, earlier tree" not in text  # it did not count its host time


def _git(repo, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def test_the_earlier_commit_is_a_worktree_made_for_the_run_and_removed(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "marker.txt").write_text("old\n")
    _git(repo, "add", "marker.txt")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "old")
    old = _git(repo, "rev-parse", "HEAD")
    (repo / "marker.txt").write_text("new\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "new")
    assert step_guard.resolve("HEAD~1", repo) == old
    with step_guard.worktree(old, repo) as path:
        assert (path / "marker.txt").read_text() == "old\n" and path.parent.exists()
        assert len(_git(repo, "worktree", "list").splitlines()) == 2
    assert not path.exists() and len(_git(repo, "worktree", "list").splitlines()) == 1
    with pytest.raises(UserError, match="no such commit"):
        step_guard.resolve("no-such-rev", repo)
    with pytest.raises(UserError, match="not one"):
        step_guard.resolve("HEAD", tmp_path)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--against", "HEAD"], "with --demo alone"),
        (["--demo", "--against", "HEAD", "--http"], "with --demo alone"),
        (["--demo", "--against", "HEAD", "--temperature", "0.7"], "greedy steps"),
        (["--demo", "--against", "no-such-rev"], "no such commit"),
    ],
)
def test_bench_against_refuses_in_one_line(argv, words, capsys):
    assert main(["bench", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and words in err


@pytest.mark.slow(seconds=10)
def test_the_probe_measures_every_kind_of_step_with_its_host_time():
    """The probe, as the guard runs it (its own process, this tree on the path): every kind, the loop's host time
    per kind and per method."""
    out = step_guard.probe(step_guard.ROOT, threads=1, prompts=1, tokens=8)
    assert list(out["kinds"]) == list(step_probe.KINDS) and out["prompts"] == 1
    for kind, figures in out["kinds"].items():
        assert figures["steps"] >= 1 and figures["host_s"] > 0, kind
        assert sum(m["host_s"] for m in figures["methods"].values()) == pytest.approx(figures["host_s"])
        assert figures["host_s"] + figures["draft_s"] + figures["verify_s"] <= figures["decode_s"]
    assert set(out["kinds"]["plain"]["methods"]) == {"plain"} and out["kinds"]["dflash"]["draft_s"] > 0


@pytest.mark.slow(seconds=25)
def test_bench_demo_against_a_commit_reports_both_trees_and_their_ratios(capsys):
    worktrees = set(step_guard.git("worktree", "list").splitlines())
    assert (
        main(
            [
                "bench",
                "--device",
                "cpu",
                "--demo",
                "--against",
                "HEAD",
                "--prompts",
                "1",
                "--tokens",
                "6",
                "--repeats",
                "1",
                "--json",
            ]
        )
        == 0
    )
    f = json.loads(capsys.readouterr().out)
    assert f["setup"]["against"] == "HEAD" and f["setup"]["pairs"] == 1 and f["setup"]["threads"] == 1
    assert f["setup"]["earlier_commit"] == step_guard.git("rev-parse", "HEAD")
    assert all(len(runs) == 1 for runs in f["answers"]["earlier"]["plain"])  # one prompt, one run of it
    assert set(f["answers"]["this"]) == set(step_probe.KINDS) and f["setup"]["prompts"] == 1
    assert {"plain step", "verify 16", "draft 15", "dflash step"} <= set(f["ratios"])
    assert all(r > 0 for r in f["ratios"].values())
    assert f["this"]["auto"]["host_us"] > 0 and f["this"]["dflash_over_plain"] > 0
    assert not set(step_guard.git("worktree", "list").splitlines()) - worktrees  # its worktree removed
