"""Tool calls read out of answer text as Qwen3.6/3.8 write them: whole, streamed in any split, converted by
the tool's schema, and malformed blocks left as text."""

from __future__ import annotations

import json
import random
import re

import pytest

from dflash_chat.runtime.tool_calls import (
    CallStream,
    ToolCall,
    ToolSpec,
    call_opening,
    new_call_id,
    parse_calls,
    parse_forced,
    render_call,
)

WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
)
WRITE = ToolSpec(
    "write_file",
    "Write a file.",
    {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}},
)
TOOLS = [WEATHER, WRITE]

# Exactly as the models write them: a newline after each tag, one around each value.
PARIS = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
CODE = 'def f(a, b):\n    """a < b && b > 0: &amp; stays"""\n    s = "</parameter> and </tool_call> are text here"\n    return a < b\n'
WRITE_CALL = f"<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/f.py\n</parameter>\n<parameter=content>\n{CODE}\n</parameter>\n</function>\n</tool_call>"
HERMES = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n</tool_call>'


def whole(text: str, tools=TOOLS) -> tuple[str, list[tuple[str, dict]]]:
    content, calls = parse_calls(text, tools)
    return content, [(c.name, c.args()) for c in calls]


def streamed(pieces: list[str], tools=TOOLS) -> tuple[list[list[str | ToolCall]], list[str | ToolCall]]:
    stream = CallStream(tools)
    return [stream.feed(p) for p in pieces], stream.flush()


def assembled(outs: list[list[str | ToolCall]], tail: list[str | ToolCall]) -> tuple[str, list[tuple[str, dict]]]:
    items = [i for out in outs for i in out] + tail
    return "".join(i for i in items if isinstance(i, str)), [
        (i.name, i.args()) for i in items if isinstance(i, ToolCall)
    ]


def one_param(schema: dict, value: str, name: str = "x"):
    """The value of parameter `name` of a call to a tool whose `x` has `schema`."""
    tool = ToolSpec("t", "", {"type": "object", "properties": {"x": schema}})
    text = f"<tool_call>\n<function=t>\n<parameter={name}>\n{value}\n</parameter>\n</function>\n</tool_call>"
    content, calls = parse_calls(text, [tool])
    assert content == "" and len(calls) == 1
    return calls[0].args()[name]


# --- whole text -----------------------------------------------------------------------------------------


def test_a_single_call_with_its_values_typed_by_the_schema():
    content, calls = parse_calls(PARIS, TOOLS)
    assert content == ""
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Paris", "days": 3}')]
    assert re.fullmatch(r"call_[0-9a-f]{24}", calls[0].id)


def test_text_before_calls_is_content_and_the_whitespace_between_and_after_them_goes():
    text = f"Let me check both.\n\n{PARIS}\n\n{HERMES}\n"
    assert whole(text) == (
        "Let me check both.",
        [("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Rome", "days": 2})],
    )


def test_text_after_a_call_keeps_what_precedes_the_call():
    assert whole(f"Checking.\n{PARIS}\nDone.")[0] == "Checking.\nDone."


def test_a_multi_line_value_is_kept_verbatim_less_one_newline_each_side():
    content, calls = whole(WRITE_CALL)
    assert content == "" and calls == [("write_file", {"path": "src/f.py", "content": CODE})]


def test_a_value_keeps_its_own_blank_lines_and_indentation():
    value = "\n\n    indented\n\n"
    text = f"<tool_call>\n<function=write_file>\n<parameter=content>\n{value}\n</parameter>\n</function>\n</tool_call>"
    assert whole(text)[1] == [("write_file", {"content": value})]


def test_an_empty_value_and_a_call_without_parameters():
    text = "<tool_call>\n<function=write_file>\n<parameter=content>\n\n</parameter>\n</function>\n</tool_call>"
    assert whole(text)[1] == [("write_file", {"content": ""})]
    assert whole("<tool_call>\n<function=get_weather>\n</function>\n</tool_call>")[1] == [("get_weather", {})]


def test_a_value_without_its_newlines_and_a_call_without_function_end_still_read():
    text = "<tool_call><function=get_weather><parameter=city>Oslo</parameter><parameter=days>1</parameter></tool_call>"
    assert whole(text)[1] == [("get_weather", {"city": "Oslo", "days": 1})]


def test_the_hermes_json_form_with_arguments_as_an_object_or_a_json_text():
    as_text = '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Lyon\\"}"}\n</tool_call>'
    assert whole(HERMES)[1] == [("get_weather", {"city": "Rome", "days": 2})]
    assert whole(as_text)[1] == [("get_weather", {"city": "Lyon"})]
    assert whole('<tool_call>{"name": "get_weather"}</tool_call>')[1] == [("get_weather", {})]


@pytest.mark.parametrize(
    "block",
    [
        "<tool_call>\n<function=get_weather>\nParis\n</function>\n</tool_call>",  # text outside a parameter
        "<tool_call>\n<function=get weather>\n</function>\n</tool_call>",  # not a name
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',  # bad JSON
        '<tool_call>\n{"name": "get_weather", "arguments": {"days": NaN}}\n</tool_call>',  # not JSON either
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        "<tool_call>\n<function=delete_everything>\n</function>\n</tool_call>",  # not among the tools
        "<tool_call> is the tag that opens a call",
    ],
)
def test_a_block_that_is_not_a_call_stays_in_the_content_verbatim(block):
    assert whole(f"Before. {block} After.") == (f"Before. {block} After.", [])


def test_a_malformed_block_does_not_hide_a_good_call_after_it():
    bad = "<tool_call>\n<function=get_weather>\noops\n</function>\n</tool_call>"
    assert whole(f"{bad}\n{PARIS}") == (bad, [("get_weather", {"city": "Paris", "days": 3})])


def test_an_unclosed_block_at_the_end_is_content():
    cut = PARIS[: PARIS.index("</parameter>\n<parameter=days>")]
    assert whole(f"Sure.\n{cut}") == (f"Sure.\n{cut.rstrip()}", [])
    assert whole(f"Sure.\n{PARIS}\n<tool_call>\n") == (
        "Sure.\n<tool_call>",
        [("get_weather", {"city": "Paris", "days": 3})],
    )


def test_any_name_is_a_call_when_no_tools_are_given_and_values_stay_text():
    assert whole(PARIS, tools=[]) == ("", [("get_weather", {"city": "Paris", "days": "3"})])


def test_a_call_inside_think_is_never_parsed():
    text = f"<think>\nI could call:\n{PARIS}\n</think>\n\n{HERMES}"
    content, calls = whole(text)
    assert content == f"<think>\nI could call:\n{PARIS}\n</think>"
    assert calls == [("get_weather", {"city": "Rome", "days": 2})]
    assert whole(f"<think>\n{PARIS}") == (f"<think>\n{PARIS}", [])  # unclosed: all of it thinking


def test_values_are_never_unescaped_or_trimmed_beyond_the_format():
    value = " a &amp; b &lt; c <b>bold</b> "
    text = f"<tool_call>\n<function=write_file>\n<parameter=content>\n{value}\n</parameter>\n</function>\n</tool_call>"
    assert whole(text)[1] == [("write_file", {"content": value})]


# --- values by the schema -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "value", "expected"),
    [
        ({"type": "string"}, "5", "5"),
        ({"type": "string"}, "null", "null"),
        ({"type": "integer"}, "5", 5),
        ({"type": "integer"}, "-12", -12),
        ({"type": "integer"}, "5.0", 5),
        ({"type": "integer"}, "5.5", "5.5"),
        ({"type": "integer"}, "five", "five"),
        ({"type": "number"}, "2.5", 2.5),
        ({"type": "number"}, "3", 3),
        ({"type": "number"}, "1e3", 1000.0),
        ({"type": "number"}, "nan", "nan"),
        ({"type": "number"}, "1_000", "1_000"),
        ({"type": "boolean"}, "true", True),
        ({"type": "boolean"}, "False", False),
        ({"type": "boolean"}, "yes", "yes"),
        ({"type": "null"}, "null", None),
        ({"type": "object"}, '{"a": [1, {"b": null}]}', {"a": [1, {"b": None}]}),
        ({"type": "object"}, "{'a': 1}", "{'a': 1}"),
        ({"type": "object"}, "[1, 2]", "[1, 2]"),
        ({"type": "array", "items": {"type": "integer"}}, "[1, 2, 3]", [1, 2, 3]),
        ({"type": "array"}, "[1, NaN]", "[1, NaN]"),
        ({"type": ["integer", "null"]}, "null", None),
        ({"type": ["string", "integer"]}, "7", 7),
        ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, "7", 7),
        ({"anyOf": [{"type": "string"}, {"type": "null"}]}, "null", None),
        ({"anyOf": [{"type": "string"}, {"type": "null"}]}, "Paris", "Paris"),
        ({"oneOf": [{"type": "boolean"}, {"type": "array"}]}, '["a"]', ["a"]),
        ({"enum": [1, 2, 3]}, "2", 2),
        ({"enum": ["1", "2"]}, "2", "2"),
        ({"type": "string", "enum": ["celsius", "fahrenheit"]}, "celsius", "celsius"),
        ({"properties": {"a": {"type": "integer"}}}, '{"a": 1}', {"a": 1}),  # an object by its shape
        ({"type": "int"}, "4", 4),  # the loose names some tools use
        ({}, "5", "5"),
    ],
)
def test_a_value_converts_by_its_schema_and_stays_text_when_it_does_not(schema, value, expected):
    got = one_param(schema, value)
    assert got == expected and type(got) is type(expected)


def test_a_parameter_the_schema_does_not_name_stays_text():
    assert one_param({"type": "integer"}, "5", name="other") == "5"


# --- streams --------------------------------------------------------------------------------------------

FORCED_OPENING = call_opening("get_weather")
SAMPLES = {
    "text and two calls": f"Let me look that up.\n\n{PARIS}\n{WRITE_CALL}\n",
    "hermes then text": f"{HERMES}\n\nThat is all. <b>ok</b> & <tool_",
    "malformed, think, good": f"<think>{PARIS}</think>\n<tool_call>\n<function=x y>\n</tool_call> <tool_call>{HERMES}",
    "unclosed at the end": f"One moment.\n{PARIS[:-20]}",
    "unknown tool": f"{PARIS.replace('get_weather', 'nope')}\n{PARIS}",
    "forced": FORCED_OPENING + PARIS[len(FORCED_OPENING) :],
}


@pytest.mark.parametrize("name", list(SAMPLES))
def test_a_stream_split_anywhere_gives_what_the_whole_text_gives(name):
    text = SAMPLES[name]
    expected = whole(text)
    for at in range(len(text) + 1):
        outs, tail = streamed([text[:at], text[at:]])
        assert assembled(outs, tail) == expected, at
        first = "".join(i for i in outs[0] if isinstance(i, str))
        assert expected[0].startswith(first), at  # nothing streamed is ever taken back
    assert assembled(*streamed(list(text))) == expected  # one character at a time


def test_streamed_content_never_holds_a_partial_tag_or_call_text():
    text = SAMPLES["text and two calls"]
    for at in range(len(text) + 1):
        outs, tail = streamed([text[:at], text[at:]])
        for item in outs[0] + outs[1] + tail:
            assert not isinstance(item, str) or "<" not in item


def test_a_call_comes_out_the_moment_its_block_closes_and_content_at_once():
    stream = CallStream(TOOLS)
    assert stream.feed("Checking the ") == ["Checking the"]
    assert stream.feed("weather. <tool") == [" weather."]
    assert stream.feed(PARIS[len("<tool") : -1]) == []
    [call] = stream.feed(">")
    assert isinstance(call, ToolCall) and call.args() == {"city": "Paris", "days": 3}
    assert stream.calls == 1
    assert stream.feed("\n\n") == [] and stream.flush() == []


def test_a_held_maybe_tag_comes_out_when_it_is_not_one():
    stream = CallStream(TOOLS)
    assert stream.feed("a <tool_") == ["a"]
    assert stream.feed("cal") == []
    assert stream.feed("culator>") == [" <tool_calculator>"]
    assert stream.feed(" x <") == [" x"] and stream.flush() == [" <"]


def test_a_long_file_written_through_a_call_streams_in_small_pieces():
    content = "    if a < b:  # </parameter> in a line of code\n" * 1000
    text = render_call("write_file", {"path": "big.py", "content": content}) + "\n" + PARIS
    stream = CallStream(TOOLS)
    items = [i for at in range(0, len(text), 7) for i in stream.feed(text[at : at + 7])] + stream.flush()
    assert [(i.name, i.args()) for i in items if isinstance(i, ToolCall)] == [
        ("write_file", {"path": "big.py", "content": content}),
        ("get_weather", {"city": "Paris", "days": 3}),
    ]
    assert len(items) == 2


def test_the_stream_counts_its_calls_for_a_caller_that_stops_after_one():
    stream = CallStream(TOOLS)
    stream.feed(f"{PARIS}\n{HERMES}")
    assert stream.calls == 2


def test_random_texts_and_splits_never_raise_and_always_agree():
    rng = random.Random(7)
    parts = ["<tool_call>", "</tool_call>", "<function=get_weather>", "<parameter=days>", "</parameter>"]
    parts += ["</function>", "<think>", "</think>", "\n", " ", "5", "Paris", "<", "{", '"name"', PARIS, HERMES]
    for _ in range(150):
        text = "".join(rng.choice(parts) for _ in range(rng.randrange(1, 12)))
        expected = whole(text)
        cuts = sorted(rng.sample(range(len(text) + 1), min(rng.randrange(1, 8), len(text) + 1)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert assembled(*streamed(pieces)) == expected, text


# --- writing calls, forced calls, the types -------------------------------------------------------------


def test_render_call_writes_the_models_form_and_reads_back_typed():
    tool = ToolSpec(
        "t",
        "",
        {
            "type": "object",
            "properties": {
                "s": {"type": "string"},
                "i": {"type": "integer"},
                "f": {"type": "number"},
                "b": {"type": "boolean"},
                "n": {"type": ["string", "null"]},
                "o": {"type": "object"},
                "a": {"type": "array"},
            },
        },
    )
    args = {"s": "two\nlines <&>", "i": 3, "f": 0.5, "b": False, "n": None, "o": {"k": ["v", 1]}, "a": [1, "x"]}
    text = render_call("t", args)
    assert text.startswith("<tool_call>\n<function=t>\n<parameter=s>\ntwo\nlines <&>\n</parameter>\n")
    assert '<parameter=o>\n{"k": ["v", 1]}\n</parameter>' in text and text.endswith("</function>\n</tool_call>")
    content, [call] = parse_calls(text, [tool])
    assert content == "" and call.args() == args and json.loads(call.arguments) == args


def test_render_call_matches_what_the_model_writes():
    assert render_call("get_weather", {"city": "Paris", "days": 3}) == PARIS


def test_the_forced_opening_and_the_models_continuation_parse_as_one_call():
    assert call_opening(None) == "<tool_call>\n"
    assert call_opening("get_weather") == "<tool_call>\n<function=get_weather>\n"
    generated = "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    content, [call] = parse_forced(call_opening("get_weather"), generated, TOOLS)
    assert content == "" and call.args() == {"city": "Paris", "days": 3}
    stream = CallStream(TOOLS)  # as a stream: the opening fed first, nothing comes of it yet
    assert stream.feed(call_opening(None)) == []
    assert [type(i) for i in stream.feed("<function=get_weather>\n" + generated)] == [ToolCall]


def test_a_forced_call_the_model_breaks_is_content_opening_included():
    assert parse_forced(call_opening(None), "I can't call a tool here.", TOOLS) == (
        "<tool_call>\nI can't call a tool here.",
        [],
    )


def test_tool_spec_to_and_from_openais_shape():
    item = WEATHER.as_openai()
    assert item == {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER.parameters},
    }
    assert ToolSpec.of_openai(item) == WEATHER
    assert ToolSpec.of_openai({"name": "bare"}) == ToolSpec("bare")
    assert ToolSpec("bare").as_openai() == {"type": "function", "function": {"name": "bare", "parameters": {}}}
    with pytest.raises(ValueError):
        ToolSpec.of_openai({"type": "function", "function": {"description": "no name"}})


def test_a_call_id_and_arguments():
    ids = {new_call_id() for _ in range(100)}
    assert len(ids) == 100 and all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids)
    assert ToolCall("call_1", "t", '{"a": 1}').args() == {"a": 1}
    with pytest.raises(ValueError):
        ToolCall("call_1", "t", "[1]").args()


def test_one_blank_at_each_end_of_a_value_is_the_formats_as_the_call_grammar_reads_it():
    """The grammar (engine/constraint.py) takes one whitespace character of any kind on each side of a value as
    the format's: a value written with spaces instead of the newlines reads the same, and only one goes."""
    tools = [ToolSpec("f", "", {"type": "object", "properties": {"a": {"type": "string"}}})]
    for written, value in (("\nhi\n", "hi"), (" hi ", "hi"), ("\thi\n", "hi"), ("\n  hi\n\n", "  hi\n"), ("hi", "hi")):
        _, calls = parse_calls(
            f"<tool_call>\n<function=f>\n<parameter=a>{written}</parameter>\n</function>\n</tool_call>", tools
        )
        assert calls and calls[0].args() == {"a": value}, written
