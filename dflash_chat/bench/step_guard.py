"""`dflash-chat bench --demo --against REV`: this tree's decode steps against an earlier commit's, in one run.

A guard for the per-step time: a step that grew shows here before it lands. The commit is checked out into a
temporary git worktree (removed afterwards), and the same measure (bench/step_probe.py) runs in a process of its
own in each tree, both loaded at once; they take turns answer by answer (each prompt with each kind, the order
flipped every answer), so a busy moment of the machine hits both trees alike, and each prompt is answered `pairs`
times by each: the fastest of an answer's runs counts (a busy machine only ever adds time). Per step kind both
trees have: the plain step, the DFlash drafter's verify of 16 and its draft of 15, the MTP and lookup steps,
each kind's whole step (decode seconds over steps), this tree's over the earlier one's; and each tree's DFlash over
plain (decode tokens/s). Where a tree counts it, the decode loop's host time per step (GenerationStats.host_s:
choosing, bookkeeping and stats, apart from the model calls) per kind and, for `auto`, per method.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from dflash_chat.bench import step_probe
from dflash_chat.errors import UserError

ROOT = Path(__file__).resolve().parents[2]  # this tree: the checkout dflash_chat/ is in
PROBE_TIMEOUT_S = 1800  # one probe run; a tree that hangs is reported, not waited for


def git(*args: str, cwd: Path = ROOT) -> str:
    """git's stdout; a UserError with git's own message when it fails."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        raise UserError(f"--against needs git: {exc}") from None
    if done.returncode:
        message = (done.stderr.strip().splitlines() or ["git failed"])[-1]
        raise UserError(f"git {' '.join(args[:2])}: {message}")
    return done.stdout.strip()


def resolve(rev: str, repo: Path = ROOT) -> str:
    """The commit `rev` names in the checkout `repo` (a UserError when it is no checkout or `rev` names none)."""
    if not (repo / ".git").exists():
        raise UserError(f"--against compares with a commit of a git checkout, and {repo} is not one: run from a clone")
    try:
        return git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", cwd=repo)
    except UserError:
        raise UserError(f"--against {rev}: no such commit in {repo}: give a commit hash, tag or branch") from None


@contextmanager
def worktree(commit: str, repo: Path = ROOT):
    """A temporary checkout of `commit` from `repo` (git worktree, detached), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="dflash-against-") as tmp:
        path = Path(tmp) / commit[:12]
        git("worktree", "add", "--detach", "--quiet", str(path), commit, cwd=repo)
        try:
            yield path
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=repo, capture_output=True)
            subprocess.run(["git", "worktree", "prune"], cwd=repo, capture_output=True)


def probe(tree: Path, *, threads: int, prompts: int, tokens: int) -> dict:
    """One run of the step probe in `tree`, in a process of its own (its package first on the path)."""
    source = Path(step_probe.__file__).read_text()
    args = ["--threads", str(threads), "--prompts", str(prompts), "--tokens", str(tokens)]
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", source, *args],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise UserError(f"the step probe ran past {PROBE_TIMEOUT_S} s in {tree}") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"the step probe failed in {tree}: {last}")
    return json.loads(lines[-1])


def per_step(kind: dict) -> dict:
    """One probe run's figures of a kind, per step (ms; host time in µs), and its decode tokens/s."""
    steps = kind["steps"] or 1
    decoded = kind["new_tokens"] - kind["answers"]  # each answer's first token comes from its prefill
    out = {
        "verify_ms": 1e3 * kind["verify_s"] / steps,
        "draft_ms": 1e3 * kind["draft_s"] / steps,
        "step_ms": 1e3 * kind["decode_s"] / steps,
        "tokens_per_s": decoded / kind["decode_s"] if kind["decode_s"] else 0.0,
        "steps": kind["steps"],
    }
    if kind.get("host_s") is not None:
        out["host_us"] = 1e6 * kind["host_s"] / steps
        out["host_us_by_method"] = {
            name: 1e6 * m["host_s"] / m["steps"]
            for name, m in kind.get("methods", {}).items()
            if m.get("host_s") is not None and m["steps"]
        }
    return out


class Served:
    """The step probe answering on request in `tree`, in a process of its own (its package first on the path)."""

    def __init__(self, tree: Path, *, threads: int, prompts: int, tokens: int):
        source = Path(step_probe.__file__).read_text()
        args = ["--threads", str(threads), "--prompts", str(prompts), "--tokens", str(tokens), "--serve"]
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
        self.tree, self.errors = tree, tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            [sys.executable, "-c", source, *args],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
        )
        self.ready = self._line()  # {"kinds": [...], "prompts": n}

    def _line(self) -> dict:
        assert self.process.stdout is not None, "the probe's output is a pipe"
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            self.errors.seek(0)
            last = (self.errors.read().strip().splitlines() or ["no output"])[-1]
            raise UserError(f"the step probe failed in {self.tree}: {last}")
        return json.loads(line)

    def ask(self, kind: str, index: int) -> dict:
        """One answer of prompt `index` by `kind`: its figures (step_probe's, of one answer)."""
        assert self.process.stdin is not None, "the probe's input is a pipe"
        self.process.stdin.write(f"{kind} {index}\n")
        self.process.stdin.flush()
        return self._line()

    def close(self) -> None:
        try:
            assert self.process.stdin is not None
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
            self.process.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        self.errors.close()


def fastest(runs: list[dict]) -> dict:
    """Of one answer's runs, the one with the least decode time."""
    return min(runs, key=lambda r: r["decode_s"])


def total(answers: list[dict]) -> dict:
    """One kind's figures summed over its answers (step_probe's shape)."""
    out = {name: sum(a[name] for a in answers) for name in ("steps", "new_tokens", "decode_s", "draft_s", "verify_s")}
    out["answers"] = sum(a["answers"] for a in answers)
    host = [a["host_s"] for a in answers]
    out["host_s"] = None if None in host else sum(host)
    methods: dict[str, dict] = {}
    for a in answers:
        for name, m in a["methods"].items():
            row = methods.setdefault(name, {"steps": 0, "drafted": 0, "accepted": 0, "host_s": 0.0})
            for key in ("steps", "drafted", "accepted"):
                row[key] += m[key]
            row["host_s"] = None if row["host_s"] is None or m["host_s"] is None else row["host_s"] + m["host_s"]
    out["methods"] = methods
    return out


def summary(answers: dict[str, list[list[dict]]]) -> dict:
    """kind -> [prompt -> its runs] to kind -> per-step figures (each answer's fastest run, summed over the
    prompts), and DFlash over plain where both ran."""
    out: dict = {}
    for kind in step_probe.KINDS:
        if kind in answers:
            out[kind] = per_step(total([fastest(runs) for runs in answers[kind]]))
    if "plain" in out and "dflash" in out and out["plain"]["tokens_per_s"]:
        out["dflash_over_plain"] = out["dflash"]["tokens_per_s"] / out["plain"]["tokens_per_s"]
    return out


RATIOS = {  # the ratio's name -> (kind, figure)
    "plain step": ("plain", "verify_ms"),
    "verify 16": ("dflash", "verify_ms"),
    "draft 15": ("dflash", "draft_ms"),
    "dflash step": ("dflash", "step_ms"),
    "mtp verify": ("mtp", "verify_ms"),
    "mtp draft": ("mtp", "draft_ms"),
    "lookup step": ("lookup", "step_ms"),
    "auto step": ("auto", "step_ms"),
}


def ratios(this: dict, earlier: dict) -> dict:
    """This tree's per-step figures over the earlier tree's, for the kinds both have."""
    out = {}
    for name, (kind, figure) in RATIOS.items():
        if kind in this and kind in earlier and earlier[kind][figure]:
            out[name] = this[kind][figure] / earlier[kind][figure]
    return out


def run(rev: str, *, threads: int, prompts: int, tokens: int, pairs: int, log=print) -> dict:
    """The comparison with commit `rev`: each tree's answers, their figures and the ratios (module docstring)."""
    commit = resolve(rev)
    head = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    answers: dict[str, dict[str, list[list[dict]]]] = {"this": {}, "earlier": {}}
    with worktree(commit) as earlier_tree:
        served: dict[str, Served] = {}
        try:
            for side, tree in (("earlier", earlier_tree), ("this", ROOT)):
                log(f"loading the {side} tree's engines")
                served[side] = Served(tree, threads=threads, prompts=prompts, tokens=tokens)
            kinds = {side: p.ready["kinds"] for side, p in served.items()}
            count = min(p.ready["prompts"] for p in served.values())
            for side in served:
                answers[side] = {kind: [[] for _ in range(count)] for kind in kinds[side]}
            turn = 0
            for pair in range(pairs):
                for index in range(count):
                    for kind in kinds["this"]:
                        sides = [side for side in ("earlier", "this") if kind in kinds[side]]
                        for side in sides if turn % 2 == 0 else sides[::-1]:
                            answers[side][kind][index].append(served[side].ask(kind, index))
                        turn += 1
                log(f"pair {pair + 1}/{pairs} done")
        finally:
            for p in served.values():
                p.close()
    this, before = summary(answers["this"]), summary(answers["earlier"])
    return {
        "setup": {
            "against": rev,
            "earlier_commit": commit,
            "this_commit": head,
            "this_tree_modified": dirty,
            "threads": threads,
            "prompts": count,
            "tokens": tokens,
            "pairs": pairs,
            "measure": "bench/step_probe.py in a process per tree, both loaded; the trees take turns answer by "
            "answer; each answer's fastest of `pairs` runs counts",
        },
        "this": this,
        "earlier": before,
        "ratios": ratios(this, before),
        "answers": answers,
    }


def format_report(f: dict) -> str:
    s = f["setup"]
    lines = [
        f"this tree ({s['this_commit'][:9]}{', modified' if s['this_tree_modified'] else ''}) against "
        f"{s['against']} ({s['earlier_commit'][:9]}): the demo pair, {s['prompts']} code prompts, {s['tokens']} new "
        f"tokens at most, greedy, {s['threads']} thread(s); the trees in turn answer by answer, the fastest of "
        f"{s['pairs']} runs of each answer",
        "per step, this tree over the earlier one (below 1: faster now):",
    ]
    for name, ratio in f["ratios"].items():
        kind, figure = RATIOS[name]
        lines.append(
            f"  {name:<12} {ratio:5.2f}x   ({f['this'][kind][figure]:.3f} ms against {f['earlier'][kind][figure]:.3f} ms)"
        )
    for side in ("this", "earlier"):
        if "dflash_over_plain" in f[side]:
            lines.append(f"DFlash over plain, {side} tree: {f[side]['dflash_over_plain']:.2f}x (decode tok/s)")
    for side in ("this", "earlier"):
        host = {kind: v["host_us"] for kind, v in f[side].items() if isinstance(v, dict) and "host_us" in v}
        if host:
            lines.append(
                f"host time per step, {side} tree (the loop around the model calls): "
                + ", ".join(f"{kind} {us:.0f} µs" for kind, us in host.items())
            )
            auto = f[side].get("auto", {}).get("host_us_by_method")
            if auto:
                lines.append("  auto by method: " + ", ".join(f"{m} {us:.0f} µs" for m, us in auto.items()))
    return "\n".join(lines)
