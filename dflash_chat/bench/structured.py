"""`dflash-chat bench --structured`: answers held to a grammar on the demo pair (engine/structured.py).

Two classes of held-out tasks: JSON answers to schemas shaped as real ones are (a workflow, a Kubernetes
deployment, a function call's arguments, a package manifest, a list of records, a nested config: none of them
was trained on), and forced tool calls (`tool_choice` required) on the held-out tool chats shipped beside the
demo pair (tool names no training chat used). Each task is answered by every drafting method in turn (plain,
DFlash, MTP, lookup, auto), held to its grammar, greedy and sampled, and once more by auto with the grammar's
forced-token drafts switched off; and once by plain decoding without the grammar, as a user of a runtime
without constrained decoding gets it.

Figures, per class and leg: the share of answers valid for their schema (jsonschema; a call's arguments for
its tool's) with and without the constraint, the share cut at the token limit inside a value the model never
closed (never counted valid), each method's tokens per step (tau) and speedup over plain constrained decoding,
tau with and without forced drafts, and the constraint's host time as a share of decoding. Beside them: the
grammar's mask cost per token (p50, p99) walking those answers on the real vocabularies, Qwen3's (151k) and
Qwen3.5/3.6's (248k), and each schema's compile time. Greedy constrained answers must be the same under every method (`identical`).

A third class, the held-out schemas (heldout_schemas.json beside this module: shaped as JSONSchemaBench collects
real ones, none used while building the grammars), as a client's `response_format` gives them: the share
accepted (each refusal with its one-line reason, serve's 400), and of one greedy answer each within a few tokens,
the share of finished answers valid for the schema, the share cut at the limit apart (never valid).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from dflash_chat.bench.structured_masks import mask_costs

METHODS = ("none", "dflash", "mtp", "lookup", "auto")
NO_FORCING = "auto-no-forced"  # auto with the grammar's forced-token drafts switched off

SCHEMAS: dict[str, tuple[str, dict]] = {
    "workflow": (
        "Write a CI workflow that runs the tests on every push, as JSON.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "on": {"type": "string", "enum": ["push", "pull_request", "schedule"]},
                "jobs": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "runs_on": {"enum": ["ubuntu-latest", "macos-latest"]},
                            "steps": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 3},
                        },
                        "required": ["runs_on", "steps"],
                        "additionalProperties": False,
                    },
                    "minItems": 1,
                    "maxItems": 2,
                },
            },
            "required": ["name", "on", "jobs"],
            "additionalProperties": False,
        },
    ),
    "deployment": (
        "Describe a Kubernetes deployment of a small web server as JSON.",
        {
            "type": "object",
            "properties": {
                "apiVersion": {"const": "apps/v1"},
                "kind": {"const": "Deployment"},
                "metadata": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "pattern": "^[a-z][a-z0-9-]{0,30}$"},
                        "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 20}},
                    },
                    "required": ["name"],
                },
                "spec": {
                    "type": "object",
                    "properties": {"replicas": {"type": "integer", "minimum": 1, "maximum": 10}},
                    "required": ["replicas"],
                },
            },
            "required": ["apiVersion", "kind", "metadata", "spec"],
        },
    ),
    "arguments": (
        "What is the weather in Lisbon tomorrow? Give the lookup's arguments as JSON.",
        {
            "type": "object",
            "properties": {
                "location": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["location", "unit"],
            "additionalProperties": False,
        },
    ),
    "manifest": (
        "Write a package manifest for a small Python library as JSON.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z_]{1,20}$"},
                "version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"},
                "private": {"type": "boolean"},
                "dependencies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4},
            },
            "required": ["name", "version"],
            "additionalProperties": False,
        },
    ),
    "records": (
        "List three books with their year as JSON.",
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "title": {"type": "string", "maxLength": 40},
                    "year": {"type": "integer", "minimum": 1000, "maximum": 2100},
                },
                "required": ["title", "year"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 3,
        },
    ),
    "config": (
        "Give a logging configuration as JSON.",
        {
            "type": "object",
            "properties": {
                "level": {"enum": ["debug", "info", "warning", "error"]},
                "handlers": {
                    "type": "object",
                    "properties": {
                        "file": {
                            "anyOf": [
                                {"type": "null"},
                                {
                                    "type": "object",
                                    "properties": {"path": {"type": "string", "maxLength": 30}},
                                    "required": ["path"],
                                },
                            ]
                        },
                        "console": {"type": "boolean"},
                    },
                    "required": ["console"],
                },
            },
            "required": ["level", "handlers"],
        },
    ),
}


@dataclass
class Answer:
    valid: bool
    cut: bool
    tokens: list[int]
    steps: int
    decode_s: float
    constraint_s: float
    forced: int
    masks: int


def run(*, prompts: int, max_new_tokens: int, legs, device: str = "cpu") -> dict:
    """Every task of both classes (at most `prompts` of each) by every method and leg; see the module docstring."""
    from dflash_chat.engine.load import load_pair
    from dflash_chat.models.demo import demo_paths

    pair = load_pair(*demo_paths(), device=device, max_context=4096)
    tasks = {"json": _json_tasks(pair, prompts), "calls": _call_tasks(pair, prompts)}
    compile_s = _compile_times(pair, tasks)
    figures: dict = {"setup": {"prompts": prompts, "max_new_tokens": max_new_tokens}, "legs": [], "identical": True}
    for leg in legs:
        leg_figures: dict = {"temperature": leg.temperature, "classes": {}}
        for name, class_tasks in tasks.items():
            rows: dict[str, list[Answer]] = {m: [] for m in (*METHODS, NO_FORCING, "unconstrained")}
            for i, task in enumerate(class_tasks):
                params = leg.params(max_new_tokens, i)
                for method in (*METHODS, NO_FORCING):
                    rows[method].append(_answer(pair, task, params, method, held=True))
                rows["unconstrained"].append(_answer(pair, task, params, "none", held=False))
                if params.greedy and any(rows[m][-1].tokens != rows["none"][-1].tokens for m in METHODS):
                    figures["identical"] = False
            leg_figures["classes"][name] = _class_figures(rows)
        figures["legs"].append(leg_figures)
    figures["compile_s"] = compile_s
    ran = {task.label for task in tasks["json"]}
    figures["masks"] = mask_costs({name: schema for name, (_, schema) in SCHEMAS.items() if name in ran})
    figures["heldout"] = heldout(pair, min(max_new_tokens, HELDOUT_TOKENS))
    return figures


HELDOUT_FILE = "heldout_schemas.json"  # beside this module: 15 real-world-shaped schemas no grammar was built on
HELDOUT_TOKENS = 48  # each held-out answer's budget: the figure is the share refused and the share valid


def heldout_schemas() -> dict[str, dict]:
    from pathlib import Path

    return json.loads((Path(__file__).parent / HELDOUT_FILE).read_text())


def heldout(pair, max_new_tokens: int) -> dict:
    """The held-out schemas (shaped as JSONSchemaBench collects them: GitHub workflows and configs, Kubernetes
    objects, calls' arguments, manifests) as `response_format` gives them: the share accepted (each refusal with
    its one-line reason, serve's 400), and one greedy answer by the demo to each accepted one within
    `max_new_tokens`: the share of finished answers valid for the schema (jsonschema), and the share cut at
    the limit (a value never closed: never counted valid)."""
    from dflash_chat.engine.constraint import GrammarError
    from dflash_chat.engine.sampling_params import SamplingParams
    from dflash_chat.runtime.constraint import OutputFormat, answer_constraint, check_schema, held_schema
    from dflash_chat.runtime.prompt import build_prompt

    schemas = heldout_schemas()
    refused: dict[str, str] = {}
    answers: list[Answer] = []
    for name, schema in schemas.items():
        ask = f"Give the {name.replace('-', ' ')} as JSON."
        prompt = build_prompt(pair.tokenizer, [{"role": "user", "content": ask}], thinking=False)
        try:
            check_schema(schema, name)
            constraint = answer_constraint(prompt, None, OutputFormat(held_schema(schema, name), name))
            pair.grammars.matcher(constraint)
        except GrammarError as exc:
            refused[name] = str(exc)
            continue
        task = Task(prompt.ids, constraint, _json_check(schema), name)
        answers.append(_answer(pair, task, SamplingParams(max_new_tokens=max_new_tokens), "auto", held=True))
    finished = [a for a in answers if not a.cut]
    return {
        "schemas": len(schemas),
        "accepted": 1 - len(refused) / len(schemas),
        "refused": refused,
        "max_new_tokens": max_new_tokens,
        "answers": len(answers),
        "finished": len(finished),
        "valid": sum(a.valid for a in finished) / len(finished) if finished else None,
        "cut": sum(a.cut for a in answers) / len(answers) if answers else 0.0,
    }


@dataclass(frozen=True)
class Task:
    prompt: list[int]
    constraint: object  # engine/constraint.Constraint
    check: Callable[[str], bool]  # valid for its schema
    label: str


def _json_tasks(pair, prompts: int) -> list[Task]:
    from dflash_chat.runtime.constraint import OutputFormat, answer_constraint
    from dflash_chat.runtime.prompt import build_prompt

    out = []
    for name, (ask, schema) in list(SCHEMAS.items())[:prompts]:
        prompt = build_prompt(pair.tokenizer, [{"role": "user", "content": ask}], thinking=False)
        constraint = answer_constraint(prompt, None, OutputFormat(schema, name))
        out.append(Task(prompt.ids, constraint, _json_check(schema), name))
    return out


def _json_check(schema: dict):
    import jsonschema

    def check(text: str) -> bool:
        try:
            jsonschema.validate(json.loads(text), schema)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True

    return check


def _call_tasks(pair, prompts: int) -> list[Task]:
    """Forced calls (tool_choice required) on the held-out tool chats that ask for one."""
    from dflash_chat.models.demo import demo_tool_chats
    from dflash_chat.runtime.constraint import answer_constraint
    from dflash_chat.runtime.prompt import build_prompt
    from dflash_chat.runtime.tool_calls import ToolSpec
    from dflash_chat.runtime.tool_use import ToolUse

    out = []
    for record in [r for r in demo_tool_chats() if r.get("call")][:prompts]:
        tools = tuple(ToolSpec.of_openai(tool) for tool in record["tools"])
        use = ToolUse(tools, "required")
        turns = [{"role": "user", "content": record["request"]}]
        prompt = build_prompt(pair.tokenizer, turns, thinking=False, tool_use=use)
        constraint = answer_constraint(prompt, use, None)
        out.append(Task(prompt.ids, constraint, _call_check(prompt.opening, tools), record["request"][:40]))
    return out


def _call_check(opening: str, tools):
    import jsonschema

    from dflash_chat.runtime.tool_calls import parse_calls

    by_name = {tool.name: tool for tool in tools}

    def check(text: str) -> bool:
        _, calls = parse_calls(opening + text, tools)
        if not calls:
            return False
        for call in calls:
            try:
                jsonschema.validate(call.args(), by_name[call.name].parameters or {"type": "object"})
            except (ValueError, KeyError, jsonschema.ValidationError):
                return False
        return True

    return check


def _answer(pair, task: Task, params, method: str, *, held: bool) -> Answer:
    from dflash_chat.engine.events import Finished, Step

    engine = pair.engine
    engine.set_speculate("auto" if method == NO_FORCING else method)
    grammar = pair.grammars.matcher(task.constraint) if held else None
    if grammar is not None and method == NO_FORCING:
        grammar.forcing = False
    tokens: list[int] = []
    finished = None
    for event in engine.generate(task.prompt, params, grammar=grammar):
        if isinstance(event, Step):
            tokens += event.token_ids
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    stats = finished.stats
    text = pair.tokenizer.decode([t for t in tokens if t not in engine.stop_ids(params)])
    return Answer(
        valid=task.check(text) and finished.reason == "stop",
        cut=finished.reason == "length",
        tokens=tokens,
        steps=stats.steps,
        decode_s=stats.decode_s,
        constraint_s=stats.constraint_s,
        forced=stats.forced_drafts,
        masks=grammar.masks if grammar is not None else 0,
    )


def _class_figures(rows: dict[str, list[Answer]]) -> dict:
    plain = rows["none"]
    plain_rate = sum(len(a.tokens) for a in plain) / max(sum(a.decode_s for a in plain), 1e-9)
    out: dict = {}
    for method, answers in rows.items():
        n = len(answers)
        tokens = sum(len(a.tokens) for a in answers)
        steps = sum(a.steps for a in answers)
        decode = sum(a.decode_s for a in answers)
        out[method] = {
            "answers": n,
            "valid": sum(a.valid for a in answers) / n if n else 0.0,
            "cut": sum(a.cut for a in answers) / n if n else 0.0,
            "tau": (tokens - n) / steps if steps else 0.0,  # decode steps: the prefill's first token is not one
            "speedup": (tokens / decode) / plain_rate if decode else 0.0,
            "forced_drafts": sum(a.forced for a in answers),
            "constraint_share": sum(a.constraint_s for a in answers) / decode if decode else 0.0,
            "constraint_us_per_token": 1e6 * sum(a.constraint_s for a in answers) / max(tokens, 1),
        }
    return out


def _compile_times(pair, tasks: dict) -> dict:
    """Seconds each task's grammar took to compile, cold (a fresh grammar engine for the tokenizer), in its compile
    process and back (engine/compile_worker.py)."""
    from dflash_chat.engine.structured import Grammars

    out = {}
    for name, class_tasks in tasks.items():
        seconds = []
        for task in class_tasks:
            fresh = Grammars(pair.tokenizer, pair.grammars.vocab_size, pair.grammars.stop_ids)
            fresh.worker.ready()  # its compile process started: what a compile costs, not a process start
            start = time.perf_counter()
            fresh.compile(task.constraint)
            seconds.append(time.perf_counter() - start)
            fresh.worker.close()
        out[name] = {"median": statistics.median(seconds), "max": max(seconds)}
    return out


def format_report(figures: dict) -> str:
    lines = ["Answers held to a grammar on the demo pair (dflash_chat/bench/structured.py)"]
    for leg in figures["legs"]:
        lines.append(f"\ntemperature {leg['temperature']}")
        for name, rows in leg["classes"].items():
            lines.append(f"  {name}: method   valid  cut   tau   speedup  forced  constraint")
            for method, f in rows.items():
                lines.append(
                    f"    {method:16} {f['valid']:5.0%} {f['cut']:5.0%} {f['tau']:5.2f} {f['speedup']:7.2f}x "
                    f"{f['forced_drafts']:6d} {f['constraint_share']:6.1%} ({f['constraint_us_per_token']:.0f} us/token)"
                )
    for name, masks in figures["masks"].items():
        if "p50_us" in masks:
            lines.append(
                f"mask on {name}'s {masks['vocabulary']}-token vocabulary: p50 {masks['p50_us']:.0f} us, "
                f"p99 {masks['p99_us']:.0f} us over {masks['masks']} masks"
            )
        else:
            lines.append(f"mask on {name}'s vocabulary: skipped ({masks['skipped']})")
    for name, c in figures["compile_s"].items():
        lines.append(f"compile ({name}): median {c['median'] * 1000:.0f} ms, max {c['max'] * 1000:.0f} ms")
    lines += _heldout_lines(figures["heldout"])
    lines.append(f"greedy answers identical under every method: {figures['identical']}")
    return "\n".join(lines)


def _heldout_lines(h: dict) -> list[str]:
    valid = "no answer finished" if h["valid"] is None else f"{h['valid']:.0%} of the {h['finished']} finished valid"
    lines = [
        f"held-out schemas: {h['accepted']:.0%} of {h['schemas']} accepted; greedy answers within "
        f"{h['max_new_tokens']} tokens: {valid}, {h['cut']:.0%} of {h['answers']} cut at the limit"
    ]
    lines += [f"  refused {name}: {reason}" for name, reason in h["refused"].items()]
    return lines
