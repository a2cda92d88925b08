"""`dflash-chat bench --tools`: whether the demo target calls tools it has never seen, and what DFlash2 gains
on those turns.

The held-out tool chats ship beside the demo pair (demo_data/tool_prompts.json, written by the training
recipe's tools stage): random tools whose names were drawn from words no training chat uses, with a seed
apart from training's (train/tool_corpus.py). Four classes of turns, each with the chat template and the
tools offered, thinking off:
- call: a request that names a tool's words and its arguments' values (a fifth of those offered two or more
  tools ask for a second tool too); right when the answer holds exactly the calls asked for, to those tools
  in order, with arguments their schemas accept (train/tool_checks.py); exact when they are the values the
  request named;
- no_tool: a held-out code question of the demo's corpus with tools offered that do not fit it; right when
  it is answered in text, without a call;
- result: a one-call request, its call and the tool's result; right when the text answer quotes each of the
  result's values;
- prose: the plain English questions of `bench --demo` without tools, for DFlash2's acceptance beside
  the tool turns'.

As `bench --demo` does (bench/demo_pair.py), one loaded target decodes every turn plainly (draft off) and
with the DFlash2 drafter at a fixed 16-token verify and at `auto`, in turn per prompt, greedy (the outputs
must be identical) and sampled at the app's defaults (seed i for a class's i-th prompt). The right shares
count every engine's answers: each is drawn from the target's distribution.

Beside them, the call class's requests once more with the answer held to the call grammar (engine/structured.py,
built as serve builds it: runtime/constraint.py), by DFlash2 at `auto`: `tool_choice` required (a call from the
first token) and auto (free text until the model opens a call, the call then held), with the unconstrained
answer beside them: the share of requests answered with a well-formed call (its arguments JSON), of right calls
(the tools asked for, arguments their schemas accept) and of exact ones (the arguments asked for), each counted
only for answers that finished, and the share cut at the token limit (a value never closed: never a call).
"""

from __future__ import annotations

from collections.abc import Sequence

from dflash_chat.bench.demo_pair import (
    DRAFTS,
    PLAIN,
    Sampling,
    bench_prompts,
    class_figures,
    draft_key,
    draft_label,
    interleaved_runs,
    leg_header,
    run_setup,
    warm_up,
)
from dflash_chat.train.tool_corpus import ToolChat, call_turns, chat_of_record, result_turns

KIND = "dflash2"  # the demo's drafter (demo.json), the one measured here
CLASSES = {
    "call": "requests for held-out tools: right = the calls asked for, the right tools, arguments their schemas accept",
    "no_tool": "held-out code questions with tools offered that do not fit: right = a text answer, no call",
    "result": "the answer after a tool's result: right = text that quotes each of the result's values",
    "prose": "prose questions without tools (as in bench --demo)",
}


def heldout_chats() -> list[ToolChat]:
    """The held-out tool chats shipped beside the demo pair."""
    from dflash_chat.models.demo import demo_tool_chats

    return [chat_of_record(r) for r in demo_tool_chats()]


Turns = Sequence[tuple[list[dict], "ToolChat | None"]]  # the turns to answer, and the tool chat they come from


def tool_turns(chats: list[ToolChat], per_class: int) -> dict[str, Turns]:
    """Per tool class, the turns of at most `per_class` chats."""
    calls = [c for c in chats if c.call is not None][:per_class]
    return {
        "call": [(call_turns(c), c) for c in calls],
        "no_tool": [(call_turns(c), c) for c in chats if c.call is None][:per_class],
        "result": [(result_turns(c), c) for c in calls if not c.more],
    }


def prompt_ids(tokenizer, turns: list[dict], chat: ToolChat | None) -> list[int]:
    """The prompt as the app builds it, with the chat's tools offered, thinking off."""
    from dflash_chat.runtime.prompt import build_prompt
    from dflash_chat.runtime.tool_use import ToolUse

    tool_use = ToolUse(chat.tools) if chat is not None else None
    return build_prompt(tokenizer, turns, thinking=False, tool_use=tool_use).ids


def answer_text(tokenizer, tokens: list[int]) -> str:
    """An answer's text without its end token."""
    return tokenizer.decode(tokens, skip_special_tokens=True)


def right_shares(
    target_dir, chats: list[ToolChat], per_class: int, *, device: str = "cpu", max_new_tokens: int = 96
) -> dict[str, float]:
    """Each tool class's right share over the turns of its first `per_class` chats, decoded greedily and
    plainly by the target in `target_dir` (the tools stage's check of what it trained)."""
    import torch

    from dflash_chat.bench.comparison import generate
    from dflash_chat.engine.load import load_pair
    from dflash_chat.engine.sampling_params import SamplingParams

    pair = load_pair(target_dir, None, device=device, dtype=torch.float32, draft="off")
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    shares = {}
    for name, items in tool_turns(chats, per_class).items():
        right = 0
        for turns, chat in items:
            pair.engine.reset()
            run = generate(pair.engine, prompt_ids(pair.tokenizer, turns, chat), params)
            right += judge(name, answer_text(pair.tokenizer, run.tokens), chat)["right"]
        shares[name] = right / len(items) if items else 0.0
    return shares


def judge(name: str, text: str, chat: ToolChat | None) -> dict[str, bool]:
    """What a class checks of one answer."""
    from dflash_chat.train.tool_checks import answered_in_text, judge_call, quotes_result

    if chat is None:
        return {}
    if name == "call":
        verdict = judge_call(text, chat)
        return {"right_tool": verdict.right_tool, "right": verdict.valid, "exact": verdict.exact}
    if name == "result":
        return {"right": quotes_result(text, chat)}
    return {"right": answered_in_text(text, chat)}


def run(*, prompts: int, max_new_tokens: int, legs: list[Sampling], device: str = "cpu", repeats: int = 1) -> dict:
    """Every class and leg, plain and DFlash2 decoding: the checks' shares, acceptance and speed, as one
    JSON-ready dict."""
    import torch

    from dflash_chat.bench.comparison import Comparison, _divergence, median_run
    from dflash_chat.engine.draft_length import Records
    from dflash_chat.engine.load import load_drafter, load_pair
    from dflash_chat.engine.spec import Engine
    from dflash_chat.models.demo import demo_paths

    target_dir, drafter_dir = demo_paths(KIND)
    plain = load_pair(target_dir, None, device=device, dtype=torch.float32, draft="off")
    target = plain.engine.target
    engines = {
        draft_key(KIND, draft): Engine(
            target,
            load_drafter(drafter_dir, target),
            max_context=plain.engine.max_context,
            draft=draft,
            end_ids=plain.engine.end_ids,
        )
        for draft in DRAFTS
    }
    tok = plain.tokenizer
    classes = tool_turns(heldout_chats(), prompts)
    classes["prose"] = [([{"role": "user", "content": q}], None) for q in bench_prompts()["prose"][:prompts]]

    every = ((PLAIN, plain.engine), *engines.items())
    records = {key: Records() for key, _ in every}
    warm_up(every, prompt_ids(tok, *classes["call"][0]), legs, max_new_tokens, records)

    figures = {}
    identical = True
    for leg in legs:
        per_class = {}
        for name, items in classes.items():
            comparisons = {key: Comparison() for key in engines}
            checks: dict[str, list[dict[str, bool]]] = {key: [] for key, _ in every}
            for i, (chat_turns, chat) in enumerate(items):
                prompt = prompt_ids(tok, chat_turns, chat)
                runs = interleaved_runs(every, prompt, leg.params(max_new_tokens, i), records, repeats)
                chosen = {key: median_run(r) for key, r in runs.items()}
                for key, run in chosen.items():
                    checks[key].append(judge(name, answer_text(tok, run.tokens), chat))
                for key, c in comparisons.items():
                    c.ar.append(chosen[PLAIN])
                    c.spec.append(chosen[key])
                    if leg.greedy and chosen[key].tokens != chosen[PLAIN].tokens:
                        c.divergences.append(
                            _divergence(plain.engine, i, prompt, chosen[PLAIN].tokens, chosen[key].tokens)
                        )
            if leg.greedy:
                identical &= all(c.identical for c in comparisons.values())
            per_class[name] = {
                "title": CLASSES[name],
                **class_figures(comparisons, leg.greedy),
                "checks": check_shares(checks),
            }
        held = constrained_calls(
            engines[draft_key(KIND, "auto")], tok, plain.grammars, classes["call"], leg, max_new_tokens
        )
        figures[leg.key] = {**leg_header(leg), "classes": per_class, "constrained": held}
    setup = {
        **run_setup(plain.device, classes, max_new_tokens, repeats),
        "drafter": KIND,
        "tool_names": "held out: drawn from words no training chat's names use (train/tool_corpus.py)",
        "shares": "over every engine's answers (plain and DFlash2's, each drawn from the target's distribution)",
        "classes": CLASSES,
    }
    return {"setup": setup, "temperatures": figures, "identical": identical, "goals": goals(figures)}


HELD = {"unconstrained": None, "required": "required", "auto": "auto"}  # figure: the answer's `tool_choice`


def constrained_calls(engine, tokenizer, grammars, items: Turns, leg: Sampling, max_new_tokens: int) -> dict:
    """The call requests `items` answered by `engine` free and held to the call grammar per HELD (see the module
    docstring): per figure, its answers and the shares well-formed, right and cut."""
    from dflash_chat.engine.events import Finished, Step
    from dflash_chat.runtime.constraint import answer_constraint
    from dflash_chat.runtime.prompt import build_prompt
    from dflash_chat.runtime.tool_use import ToolUse

    out = {}
    for figure, choice in HELD.items():
        verdicts = []
        for i, (turns, chat) in enumerate(items):
            assert chat is not None, "a call request comes from a tool chat"
            use = ToolUse(chat.tools, choice or "auto")
            prompt = build_prompt(tokenizer, turns, thinking=False, tool_use=use)
            grammar = grammars.matcher(answer_constraint(prompt, use, None)) if choice else None
            engine.reset()
            tokens, reason = [], None
            for event in engine.generate(prompt.ids, leg.params(max_new_tokens, i), grammar=grammar):
                if isinstance(event, Step):
                    tokens += event.token_ids
                elif isinstance(event, Finished):
                    reason = event.reason
            verdicts.append(call_verdict(prompt.opening + answer_text(tokenizer, tokens), chat, reason == "length"))
        out[figure] = {
            "answers": len(verdicts),
            **{k: _share(verdicts, k) for k in ("well_formed", "right", "exact", "cut")},
        }
    return out


def call_verdict(text: str, chat: ToolChat, cut: bool) -> dict[str, bool]:
    """Of one answer to a call request: a well-formed call (each call's arguments JSON), the right calls (the tools
    asked for, arguments their schemas accept), exact ones (the arguments asked for), cut at the limit; an answer
    cut is none of the first three."""
    from dflash_chat.runtime.tool_calls import parse_calls
    from dflash_chat.train.tool_checks import judge_call

    _, calls = parse_calls(text, chat.tools)
    formed = bool(calls)
    for call in calls:
        try:
            call.args()
        except ValueError:
            formed = False
    verdict = judge_call(text, chat)
    return {
        "well_formed": formed and not cut,
        "right": verdict.valid and not cut,
        "exact": verdict.exact and not cut,
        "cut": cut,
    }


def check_shares(checks: dict[str, list[dict[str, bool]]]) -> dict:
    """Each check's share of the answers: over all engines ("all") and per engine."""
    out: dict = {}
    pooled = [c for answers in checks.values() for c in answers]
    for name in sorted({k for c in pooled for k in c}):
        out[name] = {"all": _share(pooled, name), **{key: _share(answers, name) for key, answers in checks.items()}}
    return out


def _share(answers: list[dict[str, bool]], name: str) -> float:
    return sum(a[name] for a in answers) / len(answers) if answers else 0.0


def goals(figures: dict) -> dict:
    """The tools issue's goals, per leg: at least 80% right calls; DFlash2's τ (a fixed 16-token verify) on
    call turns above its τ on prose."""
    key = draft_key(KIND, 15)
    out = {}
    for leg_key, leg in figures.items():
        classes = leg["classes"]
        right = classes["call"]["checks"]["right"]["all"]
        call_tau, prose_tau = classes["call"]["drafts"][key]["tau"], classes["prose"]["drafts"][key]["tau"]
        out[leg_key] = {
            "right_calls": right,
            "right_calls_met": right >= 0.8,
            "tau_call": call_tau,
            "tau_prose": prose_tau,
            "tau_met": call_tau > prose_tau,
        }
    return out


def format_report(f: dict) -> str:
    s = f["setup"]
    counts = ", ".join(f"{n} {name}" for name, n in s["prompts_per_class"].items())
    lines = [
        "embedded demo pair: tool calls on held-out tools, plain decoding and the DFlash2 drafter",
        f"turns: {counts}; {s['max_new_tokens']} new tokens at most, thinking off, {s['device']} {s['dtype']}",
        "right: the class's check, over every engine's answers; τ: tokens per step; speed: decode tok/s over plain's",
    ]
    for leg in f["temperatures"].values():
        title = Sampling(leg["temperature"], leg["top_p"], leg["top_k"]).title
        lines += ["", title + ("" if leg["greedy"] else ", seed = the prompt's index in its class")]
        for name, c in leg["classes"].items():
            checks = c["checks"]
            shown = ", ".join(f"{check} {v['all']:.0%}" for check, v in checks.items())
            lines.append(
                f"  {name}: {c['prompts']} turns{'; ' + shown if shown else ''}; plain {c['plain']['tokens_per_s']:.1f} tok/s"
            )
            for key, d in c["drafts"].items():
                lines.append(
                    f"    {draft_label(key):<16} {d['tokens_per_s']:7.1f} tok/s  {d['speedup']:5.2f}x  τ {d['tau']:5.2f}"
                    + (f"  identical: {'yes' if d['identical'] else 'NO'}" if d["identical"] is not None else "")
                )
        lines.append("  call requests held to the call grammar (DFlash2 auto; well-formed / right / exact / cut):")
        for figure, h in leg["constrained"].items():
            lines.append(
                f"    {figure:<14} {h['answers']} answers: {h['well_formed']:.0%} / {h['right']:.0%} / "
                f"{h['exact']:.0%} / {h['cut']:.0%}"
            )
    lines.append("")
    for leg_key, g in f["goals"].items():
        lines.append(
            f"goals at temperature {leg_key}: right calls {g['right_calls']:.0%} (80%: {'met' if g['right_calls_met'] else 'NOT met'}); "
            f"DFlash2 τ on calls {g['tau_call']:.2f} vs prose {g['tau_prose']:.2f} ({'met' if g['tau_met'] else 'NOT met'})"
        )
    lines.append(f"identical greedy output: {'yes' if f['identical'] else 'NO: DFlash2 changed the output (a bug)'}")
    return "\n".join(lines)
