"""Synthetic tool-use chats that teach the demo target to call tools: random tools, a request that names one
of them (its words) and the values of its arguments, the call the request asks for in the Qwen3-Coder form
(runtime/tool_calls.py: `render_call`), the tool's result, and a text answer that quotes the result.

Names are made of words from the standard library's function names, split in two by a hash of the word:
training chats draw their names and string values from one part, the held-out chats (`heldout_chats`, seed
HELDOUT_SEED) from the other, so no held-out tool or parameter name is ever trained on and the model must
copy names from the tools it is given rather than recall them. A tool is a verb and one or two words
(`fetch_quota_header`), with 1-3 parameters (string, integer, number, boolean or enum; the first required,
the others required or optional at random). 1-3 tools are offered: the one asked for and decoys, which
often share its verb or a word. A request names the tool's words and every required parameter with its
value, and some of the optional ones; the call holds exactly those, in the order the request names them.
A share of the requests (PARALLEL_SHARE, when two or more tools are offered) asks for a second tool too:
answered with both calls, one after the other (parallel calls).
"""

from __future__ import annotations

import json
import keyword
import random
import re
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dflash_chat.runtime.tool_calls import ToolSpec, render_call
from dflash_chat.train.corpus import SKIP_DIRS, Conversation, stdlib_root

HELDOUT_SEED = 104_729  # the held-out chats' seed: far from the recipe's small --seed values
HELDOUT_SHARE = 5  # one word in HELDOUT_SHARE (by hash) is kept for held-out names
PARALLEL_SHARE = 0.2  # of the requests with two or more tools offered, those that ask for two calls

VERBS = (
    "get", "set", "find", "list", "create", "delete", "update", "send", "fetch", "search", "convert",
    "compute", "check", "open", "close", "start", "stop", "add", "remove", "count", "read", "write", "load",
    "save", "book", "cancel", "schedule", "translate", "resize", "rename", "move", "copy", "sort", "merge",
    "split", "encode", "decode", "scan", "query", "submit", "register", "validate", "render", "export",
)  # fmt: skip
MODIFIERS = ("max", "min", "user", "target", "source", "new", "default", "first", "last", "page", "base")
ENUM_MEMBERS = (
    "fast", "slow", "low", "high", "asc", "desc", "json", "text", "csv", "xml", "red", "green", "blue",
    "small", "medium", "large", "daily", "weekly", "monthly", "auto", "manual", "left", "right", "north",
    "south", "east", "west", "draft", "final", "public", "private", "full", "short", "plain", "html",
    "metric", "imperial",
)  # fmt: skip
TYPES = ("string", "integer", "number", "boolean", "enum")
EXTENSIONS = ("txt", "json", "csv", "py", "log")

REQUESTS = (
    "{Intent} with {args}.",
    "Please {intent}: {args}.",
    "Can you {intent}? Use {args}.",
    "I need to {intent} ({args}).",
    "{Intent}, {args}.",
    "Could you {intent} for me with {args}?",
)
SECOND_REQUESTS = (" Then {intent} with {args}.", " Also {intent}: {args}.", " And {intent} ({args}).")
ARGUMENT_FORMS = ("{p} {v}", "{p} = {v}", "{p} set to {v}", "{p}: {v}", "{p} of {v}")
OBJECT_ANSWERS = ("Done. {pairs}.", "{name} returned {pairs}.", "The result: {pairs}.", "Here is what I got: {raw}")
TEXT_ANSWERS = ("The tool says: {text}", "Result: {text}", '{name} returned "{text}".')
REASONING = "The user wants to {intent}. I will call {name}."


class Words(NamedTuple):
    """The words names are made of: `train` for training chats, `heldout` for held-out ones (disjoint)."""

    train: list[str]
    heldout: list[str]


class Call(NamedTuple):
    name: str
    arguments: dict


@dataclass(frozen=True)
class ToolChat:
    """One request with tools offered, and what answers it: the call (None: no tool fits, the answer is
    text), the tool's result, and the text answer after it (or the whole answer when there is no call)."""

    tools: tuple[ToolSpec, ...]
    request: str
    call: Call | None
    result: str = ""
    answer: str = ""
    reasoning: str | None = None
    intent: str = field(default="", compare=False)  # the tool's words as the request says them
    more: tuple[Call, ...] = ()  # the calls the request asks for after `call` (parallel calls)

    @property
    def calls(self) -> tuple[Call, ...]:
        """Every call the request asks for, in order."""
        return () if self.call is None else (self.call, *self.more)


def word_pools(max_files: int | None = None, min_count: int = 3) -> Words:
    """Lower-case words of 3-9 letters that the standard library's function names are made of (at least
    `min_count` times; no verbs of VERBS, no keywords), split in two by a hash of the word."""
    root = stdlib_root()
    files = sorted(p for p in root.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(root).parts[:-1]))
    counts: Counter[str] = Counter()
    for path in files[:max_files]:
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for name in re.findall(r"^\s*def ([A-Za-z_]\w*)", source, re.M):
            counts.update(w for w in name.split("_") if w.isalpha() and w.islower() and 3 <= len(w) <= 9)
    words = sorted(w for w, n in counts.items() if n >= min_count and w not in VERBS and not keyword.iskeyword(w))
    heldout = [w for w in words if is_heldout_word(w)]
    return Words([w for w in words if not is_heldout_word(w)], heldout)


def is_heldout_word(word: str) -> bool:
    return zlib.crc32(word.encode()) % HELDOUT_SHARE == 0


def training_chats(words: Words, count: int, seed: int) -> list[ToolChat]:
    """`count` chats whose names and string values come from the training words."""
    rng = random.Random(seed)
    return [random_chat(rng, words.train) for _ in range(count)]


def heldout_chats(words: Words, count: int, questions: Sequence[Conversation] = ()) -> list[ToolChat]:
    """`count` chats whose names and string values come from the held-out words (seed HELDOUT_SEED), then
    one chat per question of `questions` (held-out corpus questions) that no tool offered answers."""
    rng = random.Random(HELDOUT_SEED)
    chats = [random_chat(rng, words.heldout) for _ in range(count)]
    return chats + [no_tool_chat(rng, words.heldout, q) for q in questions]


def no_tool_chat(rng: random.Random, words: list[str], conversation: Conversation) -> ToolChat:
    """A corpus question with 1-3 random tools offered, none of which it needs: answered as the corpus does."""
    tools = _tools(rng, words, rng.randint(1, 3))
    question = conversation.prompt_messages[-1]["content"]
    return ToolChat(tools, question, None, answer=conversation.answer, reasoning=conversation.reasoning)


def random_chat(rng: random.Random, words: list[str]) -> ToolChat:
    """A request for one of 1-3 random tools (and now and then a second one), its calls, a result and the
    answer quoting it."""
    tools = _tools(rng, words, rng.randint(1, 3))
    tool = rng.choice(tools)
    intent = _intent(rng, tool)
    args = _arguments(rng, words, tool)
    request = rng.choice(REQUESTS).format(
        intent=intent, Intent=intent[0].upper() + intent[1:], args=_argument_text(rng, args)
    )
    more: tuple[Call, ...] = ()
    if len(tools) > 1 and rng.random() < PARALLEL_SHARE:
        second = rng.choice([t for t in tools if t.name != tool.name])
        second_args = _arguments(rng, words, second)
        request += rng.choice(SECOND_REQUESTS).format(
            intent=_intent(rng, second), args=_argument_text(rng, second_args)
        )
        more = (Call(second.name, second_args),)
    result = _result(rng, words)
    reasoning = REASONING.format(intent=intent, name=tool.name) if rng.random() < 0.15 else None
    return ToolChat(
        tools, request, Call(tool.name, args), result, quoting_answer(rng, tool.name, result), reasoning, intent, more
    )


def _intent(rng: random.Random, tool: ToolSpec) -> str:
    """The tool's words as a request says them: its verb, now and then "the", its other words."""
    verb_and_words = tool.name.split("_")
    return " ".join(verb_and_words[:1] + (["the"] if rng.random() < 0.5 else []) + verb_and_words[1:])


def _tools(rng: random.Random, words: list[str], count: int) -> tuple[ToolSpec, ...]:
    """`count` tools with distinct names; after the first, each shares its verb or a word half the time."""
    first = _tool(rng, words, rng.choice(VERBS), [rng.choice(words) for _ in range(rng.choice((1, 1, 2)))])
    tools = [first]
    while len(tools) < count:
        verb, *rest = first.name.split("_")
        draw = rng.random()
        if draw < 0.35:
            tool = _tool(rng, words, verb, [rng.choice(words)])
        elif draw < 0.55:
            tool = _tool(rng, words, rng.choice(VERBS), rest)
        else:
            tool = _tool(rng, words, rng.choice(VERBS), [rng.choice(words) for _ in range(rng.choice((1, 1, 2)))])
        if all(tool.name != t.name for t in tools):
            tools.append(tool)
    rng.shuffle(tools)
    return tuple(tools)


def _tool(rng: random.Random, words: list[str], verb: str, nouns: list[str]) -> ToolSpec:
    """A tool named verb_noun(s) with 1-3 parameters, the first required."""
    properties: dict[str, dict] = {}
    required: list[str] = []
    for i in range(rng.randint(1, 3)):
        name = _parameter_name(rng, words)
        if name in properties:
            continue
        properties[name] = _schema(rng, name)
        if i == 0 or rng.random() < 0.5:
            required.append(name)
    description = f"{verb.capitalize()} the {' '.join(nouns)}."
    parameters = {"type": "object", "properties": properties, "required": required}
    return ToolSpec("_".join([verb, *nouns]), description, parameters)


def _parameter_name(rng: random.Random, words: list[str]) -> str:
    return rng.choice(words) if rng.random() < 0.65 else f"{rng.choice(MODIFIERS)}_{rng.choice(words)}"


def _schema(rng: random.Random, name: str) -> dict:
    kind = rng.choice(TYPES)
    schema: dict[str, Any] = {"type": "string" if kind == "enum" else kind}
    if kind == "enum":
        schema["enum"] = rng.sample(ENUM_MEMBERS, rng.randint(2, 4))
    if rng.random() < 0.2:
        schema["description"] = f"The {name.replace('_', ' ')}."
    return schema


def _arguments(rng: random.Random, words: list[str], tool: ToolSpec) -> dict:
    """The arguments a request gives: every required parameter and half the optional ones, in the order
    the request names them (the schema's, shuffled now and then)."""
    required = tool.parameters["required"]
    names = [n for n in tool.parameters["properties"] if n in required or rng.random() < 0.5]
    if rng.random() < 0.3:
        rng.shuffle(names)
    return {n: random_value(rng, words, tool.parameters["properties"][n]) for n in names}


def random_value(rng: random.Random, words: list[str], schema: dict) -> Any:
    """A value of the schema's type: an enum member, a word-made string, a boolean or a number."""
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema["type"]
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "integer":
        low, high = rng.choice(((0, 20), (0, 1000), (-100, 100), (1000, 99999)))
        return rng.randint(low, high)
    if kind == "number":
        return round(rng.uniform(-50, 500), rng.choice((1, 2)))
    return _string_value(rng, words)


def _string_value(rng: random.Random, words: list[str]) -> str:
    word, draw = rng.choice(words), rng.random()
    if draw < 0.35:
        return word
    if draw < 0.55:
        return f"{word} {rng.choice(words)}"
    if draw < 0.7:
        return word.capitalize()
    if draw < 0.85:
        return f"{word}/{rng.choice(words)}.{rng.choice(EXTENSIONS)}"
    return f"{word}-{rng.randint(1, 999)}"


def _argument_text(rng: random.Random, args: dict) -> str:
    """The arguments as a request says them: each parameter's words (or its name) and its value."""
    phrases = []
    for name, value in args.items():
        said = name.replace("_", " ") if rng.random() < 0.6 else name
        phrases.append(rng.choice(ARGUMENT_FORMS).format(p=said, v=value_text(value, quoted=True)))
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]


def value_text(value: Any, *, quoted: bool = False) -> str:
    """A value as text: a string as it is (in double quotes when `quoted`), anything else as JSON."""
    if isinstance(value, str):
        return f'"{value}"' if quoted else value
    return json.dumps(value)


def _result(rng: random.Random, words: list[str]) -> str:
    """What a tool answers: a JSON object of one or two fields (most often), or a line of text."""
    if rng.random() < 0.3:
        return rng.choice(
            (f"ok: {rng.choice(words)}", f"{rng.randint(1, 99)} {rng.choice(words)}", _string_value(rng, words))
        )
    fields = {}
    for _ in range(rng.randint(1, 2)):
        fields[rng.choice(words)] = random_value(rng, words, {"type": rng.choice(TYPES[:4])})
    return json.dumps(fields)


def result_values(result: str) -> list[str]:
    """The texts an answer that quotes `result` holds: each field's value of a JSON object, else the text."""
    try:
        value = json.loads(result)
    except ValueError:
        return [result]
    if isinstance(value, dict):
        return [value_text(v) for v in value.values()]
    return [result]


def quoting_answer(rng: random.Random, name: str, result: str) -> str:
    """A text answer after the tool's `result` that quotes it (`result_values` are all in it)."""
    try:
        fields = json.loads(result)
    except ValueError:
        fields = None
    if not isinstance(fields, dict):
        return rng.choice(TEXT_ANSWERS).format(text=result, name=name)
    pairs = " and ".join(f"{key} is {value_text(value)}" for key, value in fields.items())
    return rng.choice(OBJECT_ANSWERS).format(pairs=pairs, raw=result, name=name)


def names(chats: list[ToolChat]) -> set[str]:
    """Every tool and parameter name the chats offer."""
    out = set()
    for chat in chats:
        for tool in chat.tools:
            out.add(tool.name)
            out.update(tool.parameters.get("properties", {}))
    return out


# --- chats as the template's turns -----------------------------------------------------------------------


def template_tools(chat: ToolChat) -> list[dict]:
    return [tool.as_openai() for tool in chat.tools]


def call_turns(chat: ToolChat) -> list[dict]:
    """The turns before the call: the user's request."""
    return [{"role": "user", "content": chat.request}]


def result_turns(chat: ToolChat) -> list[dict]:
    """The turns before the answer that quotes the result: the request, the (first) call, the tool's result."""
    assert chat.call is not None, "only a chat with a call has a result"
    call = {"type": "function", "function": {"name": chat.call.name, "arguments": chat.call.arguments}}
    return [
        *call_turns(chat),
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": chat.result},
    ]


def calls_text(calls: Sequence[Call]) -> str:
    """Calls as the model writes them, one after the other (as the chat template joins them)."""
    return "\n".join(render_call(*call) for call in calls)


def call_conversation(chat: ToolChat) -> Conversation:
    """The request answered with its calls (or in text, when no tool fits), as a training conversation."""
    answer = calls_text(chat.calls) if chat.call is not None else chat.answer
    tag = "tool_call" if chat.call is not None else "no_tool"
    messages = [*call_turns(chat), {"role": "assistant", "content": answer}]
    return Conversation(messages, chat.reasoning, {tag}, tools=template_tools(chat))


def result_conversation(chat: ToolChat) -> Conversation:
    """The tool's result answered in text that quotes it, as a training conversation."""
    messages = [*result_turns(chat), {"role": "assistant", "content": chat.answer}]
    return Conversation(messages, None, {"tool_result"}, tools=template_tools(chat))


# --- the held-out file -----------------------------------------------------------------------------------


def chat_record(chat: ToolChat) -> dict:
    """A held-out chat as the shipped JSON holds it (`chat_of_record` reads it back)."""
    call = None if chat.call is None else {"name": chat.call.name, "arguments": chat.call.arguments}
    more = [{"name": c.name, "arguments": c.arguments} for c in chat.more]
    return {"tools": template_tools(chat), "request": chat.request, "call": call, "more": more, "result": chat.result}


def chat_of_record(record: dict) -> ToolChat:
    call = record.get("call")
    return ToolChat(
        tuple(ToolSpec.of_openai(t) for t in record["tools"]),
        record["request"],
        None if call is None else Call(call["name"], dict(call["arguments"])),
        record.get("result", ""),
        more=tuple(Call(c["name"], dict(c["arguments"])) for c in record.get("more", ())),
    )
