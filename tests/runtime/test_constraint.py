"""The constraint an answer is held to (runtime/constraint.py, engine/structured.py): generated schemas whose every
answer validates, schemas refused in words (never a traceback, never a silent free answer), the keywords the
grammar would not enforce named, and an `allOf` of objects merged."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dflash_chat
from dflash_chat.engine.constraint import GrammarError, json_tag
from dflash_chat.engine.structured import Grammars, allowed_tokens
from dflash_chat.runtime.constraint import check_schema, held_schema, read_schema

DEMO = Path(dflash_chat.__file__).parent / "demo_data" / "target"


@pytest.fixture(scope="module")
def grammars():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(DEMO))
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return tokenizer, Grammars(tokenizer, len(tokenizer), (end,))


def errors(text: str, schema: dict) -> list[str]:
    """What jsonschema finds wrong with the JSON `text` for `schema` (none: valid)."""
    return [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(json.loads(text))]


def _random_answer(grammars: Grammars, tokenizer, schema: dict, seed: int, most: int = 400) -> str | None:
    """A random walk through what the grammar allows (each token drawn among the allowed ones, the end taken as
    soon as it is allowed with probability 1/3): the text of a finished answer, or None when it ran past `most`
    tokens (a string the walk never closed)."""
    rng = random.Random(seed)
    matcher = grammars.matcher(json_tag(schema, thinking=False))
    row = torch.zeros(1, grammars.words, dtype=torch.int32)
    end = grammars.stop_ids[0]
    tokens: list[int] = []
    for _ in range(most):
        matcher.fill_row(row, 0)
        allowed = allowed_tokens(row, grammars.vocab_size)[0].nonzero().flatten().tolist()
        assert allowed, "a grammar with no way on"
        if end in allowed and (len(allowed) == 1 or rng.random() < 1 / 3):
            return tokenizer.decode(tokens)
        # prefer short tokens (punctuation, digits) so that strings and numbers close
        choice = min(rng.sample(allowed, min(len(allowed), 6)), key=lambda t: len(tokenizer.decode([t])))
        assert matcher.raw.accept_token(choice)
        tokens.append(choice)
    return None


LEAF = st.one_of(
    st.just({"type": "string", "maxLength": 6}),
    st.just({"type": "integer", "minimum": -5, "maximum": 50}),
    st.just({"type": "number"}),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(
        lambda values: {"enum": values},
        st.lists(st.sampled_from(["a", "b c", 1, 2.5, True, None]), min_size=1, max_size=3, unique=True),
    ),
    st.builds(lambda v: {"const": v}, st.sampled_from(["x", 7, False])),
    st.just({"type": "string", "pattern": "^[a-c]{1,3}$"}),
    st.just({"type": "string", "format": "date"}),
)


def _object(children):
    names = st.lists(st.sampled_from(["id", "name", "tags", "size", "kind"]), min_size=1, max_size=3, unique=True)

    def build(keys, parts, required, closed):
        schema = {"type": "object", "properties": dict(zip(keys, parts, strict=False))}
        schema["required"] = [k for k, r in zip(keys, required, strict=False) if r]
        if closed:
            schema["additionalProperties"] = False
        return schema

    return names.flatmap(
        lambda keys: st.builds(
            build,
            st.just(keys),
            st.lists(children, min_size=len(keys), max_size=len(keys)),
            st.lists(st.booleans(), min_size=len(keys), max_size=len(keys)),
            st.booleans(),
        )
    )


SCHEMAS = st.recursive(
    LEAF,
    lambda children: st.one_of(
        _object(children),
        st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n}, children, st.integers(0, 3)),
        st.builds(lambda parts: {"anyOf": parts}, st.lists(children, min_size=1, max_size=3)),
    ),
    max_leaves=6,
).map(
    lambda node: (
        node if node.get("type") == "object" else {"type": "object", "properties": {"v": node}, "required": ["v"]}
    )
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=SCHEMAS, seed=st.integers(0, 10**6))
def test_every_answer_held_to_a_generated_schema_validates(grammars, schema, seed):
    tokenizer, engine = grammars
    text = _random_answer(engine, tokenizer, held_schema(schema, "schema"), seed)
    # a walk that never closed a string is cut (None), never reported as valid
    assert text is None or errors(text, schema) == [], text


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"not": {"type": "string"}}, "'not'"),
        ({"type": "object", "if": {}, "then": {}}, "'if'"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "'dependentRequired'"),
        ({"type": "array", "contains": {"const": 5}}, "'contains'"),
        ({"type": "array", "uniqueItems": True}, "'uniqueItems'"),
        ({"type": "object", "patternProperties": {"^x": {}}}, "'patternProperties'"),
        ({"type": "object", "properties": {"a": {"unevaluatedProperties": False}}}, "schema.properties.a"),
        ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "'schema.allOf[1].type' differs"),
    ],
)
def test_keywords_the_grammar_would_not_enforce_are_refused_by_name(schema, words):
    with pytest.raises(GrammarError, match=words.replace("[", r"\[").replace("]", r"\]")):
        held_schema(schema, "schema")


def test_an_allof_of_objects_is_merged_and_held(grammars):
    tokenizer, engine = grammars
    schema = {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"const": "x"}}, "required": ["b"]},
        ]
    }
    held = held_schema(schema, "schema")
    assert held == {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"const": "x"}},
        "required": ["a", "b"],
    }
    for seed in range(5):
        text = _random_answer(engine, tokenizer, held, seed)
        assert text is None or errors(text, schema) == [], text


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength"),
        ({"enum": []}, "enum"),
        ({"$ref": "#/$defs/missing"}, "missing"),
        ({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(600)}}, "over 0.5 s to compile"),
    ],
)
def test_a_schema_that_cannot_be_held_is_a_grammar_error_in_words(grammars, schema, words):
    """(The compile-time bound is shortened here: the 600 optional properties take seconds, past 0.5 s.)"""
    _, engine = grammars
    with pytest.raises(GrammarError, match=words) as refused:
        engine.compile(json_tag(schema, thinking=False), timeout=0.5)
        engine.matcher(json_tag(schema, thinking=False))
    assert "Traceback" not in str(refused.value) and "\n" not in str(refused.value)


def test_recursive_references_deep_nesting_and_odd_patterns_are_held(grammars):
    tokenizer, engine = grammars
    node = {"type": "object", "properties": {"next": {"$ref": "#"}, "v": {"type": "integer"}}, "required": ["v"]}
    deep: dict = {"type": "integer"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"a": deep}, "required": ["a"]}
    finished = 0
    for schema in (
        node,
        deep,
        {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}, "required": ["s"]},
        {"type": "object", "properties": {"s": {"type": "string", "format": "no-such-format"}}, "required": ["s"]},
    ):
        for seed in range(3):
            text = _random_answer(engine, tokenizer, schema, seed)
            assert text is None or errors(text, schema) == [], text
            finished += text is not None
    assert finished > 0  # some walks ended, and each was valid


def test_read_schema_takes_inline_json_or_a_file_and_says_what_is_wrong(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"type": "object"}')
    assert read_schema(str(path)).schema == {"type": "object"}
    assert read_schema('{"type": "integer"}').schema == {"type": "integer"}
    with pytest.raises(GrammarError, match="not a valid JSON schema"):
        check_schema({"type": 5}, "x")
    with pytest.raises(GrammarError, match="cannot read"):
        read_schema(str(tmp_path / "nope.json"))


def test_a_compile_past_its_bound_is_ended_with_its_process_and_the_next_one_runs(grammars):
    """xgrammar's compile cannot be interrupted: it runs in a child process, which a compile past its bound ends
    (no core left busy with it); the next compile starts a new one."""
    _, engine = grammars
    engine.worker.ready()
    started = engine.worker.started
    slow = {"type": "object", "properties": {f"q{i}": {"type": "string"} for i in range(700)}}
    with pytest.raises(GrammarError, match="over 0.5 s to compile"):
        engine.compile(json_tag(slow, thinking=False), timeout=0.5)
    assert not engine.worker.alive
    fresh = {"type": "object", "properties": {"bound": {"type": "boolean"}}, "required": ["bound"]}
    assert engine.matcher(json_tag(fresh, thinking=False)).forced_run(4)  # compiled, and it works
    assert engine.worker.started == started + 1 and engine.worker.alive


def test_engines_of_one_vocabulary_share_one_compile_worker_and_others_get_their_own(grammars):
    """A child costs seconds of a core to start (xgrammar imports torch): a second engine of the same tokenizer
    compiles in the first one's child; another vocabulary has its own, and one past the SHARED_MOST latest is
    closed, its holder's next compile starting it again."""
    from dflash_chat.engine import compile_worker

    tokenizer, first = grammars
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    first.worker.ready()
    child = first.worker._process
    again = Grammars(tokenizer, len(tokenizer), (end,))
    assert again.worker is first.worker and again.worker._process is child
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    assert again.matcher(json_tag(schema, thinking=False)).forced_run(4) and first.worker._process is child
    others = [Grammars(tokenizer, len(tokenizer), (end + 1 + i,)) for i in range(compile_worker.SHARED_MOST)]
    assert len({id(g.worker) for g in others}) == compile_worker.SHARED_MOST and first.worker not in [
        g.worker for g in others
    ]
    assert not first.worker.alive  # closed as the oldest of three vocabularies
    started = first.worker.started
    fresh = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert first.matcher(json_tag(fresh, thinking=False)).forced_run(4)
    assert first.worker.alive and first.worker.started == started + 1


def test_a_grammar_the_child_compiled_is_compiled_here_and_a_failure_here_is_words(grammars, monkeypatch):
    """The child only proves the compile ends in time: the grammar used is compiled in this process (xgrammar's JSON
    of a compiled grammar was 134 MB for Claude Code's tools); should that fail, it is a GrammarError in one line."""
    from dflash_chat.engine import compile_worker

    tokenizer, _ = grammars
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    fresh = Grammars(tokenizer, len(tokenizer), (end,))
    compiled: list[str] = []
    real = compile_worker.compile_grammar

    def spy(compiler, kind, spec):
        compiled.append(kind)
        return real(compiler, kind, spec)

    monkeypatch.setattr(compile_worker, "compile_grammar", spy)  # the parent's; the child runs its own module
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    assert fresh.matcher(json_tag(schema, thinking=False)).forced_run(4) and compiled == ["json_schema"]

    def broken(compiler, kind, spec):
        raise RuntimeError("the compiler broke\nits long story")

    monkeypatch.setattr(compile_worker, "compile_grammar", broken)
    other = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    with pytest.raises(GrammarError, match="the compiler broke$"):
        fresh.compile(json_tag(other, thinking=False))


HELD_OUT = json.loads((Path(dflash_chat.__file__).parent / "bench" / "heldout_schemas.json").read_text())


@pytest.mark.slow(seconds=30)
def test_held_out_real_world_schemas_are_held_or_refused_in_words_and_finished_answers_validate(grammars):
    """15 schemas shaped as JSONSchemaBench collects them (GitHub workflows and configs, Kubernetes objects, function
    calls' arguments, manifests; written for this test, none used while building the grammars): at least 90 % are
    held, the rest refused in one line that names the part (serve's 400), and every answer that random walks
    through a held one finish validates (jsonschema)."""
    tokenizer, engine = grammars
    refused, finished = {}, 0
    for name, schema in HELD_OUT.items():
        try:
            check_schema(schema, name)
            held = held_schema(schema, name)
            engine.matcher(json_tag(held, thinking=False, label=name))
        except GrammarError as exc:
            refused[name] = str(exc)
            continue
        for seed in range(2):
            text = _random_answer(engine, tokenizer, held, seed, most=250)
            assert text is None or errors(text, schema) == [], (name, text)
            finished += text is not None
    assert len(refused) <= 0.1 * len(HELD_OUT), refused
    assert all(reason.startswith(f"'{name}") and "\n" not in reason for name, reason in refused.items())
    assert finished >= len(HELD_OUT)  # most walks ended, each valid


def test_a_length_beside_a_pattern_is_refused_and_beside_a_format_is_held():
    """The grammar engine reads a string's length past a pattern or a format: a length beside a pattern is refused
    in words; beside a format (an annotation) the length is held and the format given up."""
    with pytest.raises(GrammarError, match="write the length into the pattern"):
        held_schema({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}, "s")
    assert held_schema({"type": "string", "format": "uri", "maxLength": 9}, "s") == {"type": "string", "maxLength": 9}
