"""Copy tasks that teach the demo target to copy: a code block or a paragraph from the corpus is given in the
request and asked back whole, as it is or lightly edited (an identifier renamed, the indent changed, a value
changed; in a paragraph, a word replaced). The answer is the whole block after the edit, so most of it is
the prompt's own text again: what prompt lookup drafts.

Training tasks are cut from the corpus's training chats and name their new identifiers from the tool chats'
training words; held-out tasks (`heldout_copy_tasks`) from its held-out chats (code the target never saw) with
held-out words, so a held-out rename's new name was never trained on either.
"""

from __future__ import annotations

import builtins
import io
import keyword
import random
import re
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass

from dflash_chat.train.corpus import Conversation

MAX_CODE_LINES = 16  # of a code block given: the first lines of a longer one
MAX_CHARS = 640  # of a block given (code or paragraph), cut at a line or sentence end before it
MIN_CHARS = 60  # shorter blocks are left out: there is little to copy
INDENTS = (2, 8)  # the widths a reindent asks for (the corpus's code is indented by 4)
NEW_VALUES = (0, 1, 2, 3, 5, 8, 10, 16, 32, 42, 64, 100, 128, 255, 256, 1000, 1024)
EDITS = ("repeat", "rename", "reindent", "value")
EDIT_WEIGHTS = (0.4, 0.25, 0.15, 0.2)  # of code tasks; a paragraph is repeated or has a word replaced
PROSE_SHARE = 0.3  # of the training tasks, paragraphs (most corpus answers are code)
RANDOM_WORDS = (8, 40)  # words in a random-word block
RANDOM_LINES = (2, 8)  # lines in a random code block
RANDOM_CODE_LINES = (
    "{a}_{b} = {c}({d}, {n})",
    "    return {a}.{b}({c}, {n})",
    "if {a} > {n}:",
    "    {a} += {b}_{c}",
    "def {a}_{b}({c}, {d}={n}):",
    "        {a}[{n}] = {b}",
    "for {a} in {b}_{c}:",
)
HELDOUT_COPY_SEED = 7_919  # the held-out tasks' seed: far from the recipe's small --seed values

CODE_REQUESTS = {
    "repeat": ("Repeat this code exactly:", "Copy this code, unchanged:", "Write this code out again as it is:"),
    "rename": (
        "Rename `{old}` to `{new}` in this code and show all of it:",
        "In this code, change the name `{old}` to `{new}` everywhere. Give the whole code:",
    ),
    "reindent": (
        "Reindent this code with {width} spaces per level and show all of it:",
        "Rewrite this code indented by {width} spaces instead of 4, whole:",
    ),
    "value": (
        "Change every {old} to {new} in this code and show all of it:",
        "Replace the value {old} with {new} in this code. Give the whole code:",
    ),
}
PROSE_REQUESTS = {
    "repeat": ("Repeat this paragraph word for word:", "Copy this text exactly:"),
    "rename": (
        "Replace the word `{old}` with `{new}` in this paragraph and give all of it:",
        "In this text, write `{new}` wherever it says `{old}`. Give the whole text:",
    ),
}
_NOT_NAMES = set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins)) | {"self", "cls"}
_NAME = re.compile(r"\b[A-Za-z_]\w*\b")
_NUMBER = re.compile(r"(?<![\w.])\d+(?![\w.])")  # an integer literal, not part of a name or a float


@dataclass(frozen=True)
class CopyTask:
    """A block to copy, what to do to it, and the answer: the whole block after the edit."""

    kind: str  # "code" or "prose"
    edit: str  # one of EDITS
    source: str  # the block as the request gives it
    request: str  # the user's message: the instruction, then the block
    answer: str  # the assistant's: the edited block (code in a python fence)


def copy_tasks(conversations: Sequence[Conversation], words: Sequence[str], count: int, seed: int) -> list[CopyTask]:
    """`count` tasks cut from random conversations' answers (a PROSE_SHARE of them from paragraphs), new
    names made of `words`; none when the conversations hold no block."""
    rng = random.Random(seed)
    blocks = [b for b in (source_block(c) for c in conversations) if b is not None]
    by_kind = {kind: [b for b in blocks if b[0] == kind] for kind in ("code", "prose")}
    out = []
    for _ in range(count if blocks else 0):
        kind = "prose" if rng.random() < PROSE_SHARE else "code"
        out.append(copy_task(rng, *rng.choice(by_kind[kind] or blocks), words))
    return out


def random_copy_tasks(words: Sequence[str], count: int, seed: int) -> list[CopyTask]:
    """`count` tasks whose block is made of random `words`, half a list of words (edited as a paragraph), half
    lines of code (edited as code): nothing in them can be guessed, only copied from the request. They teach
    copying faster than the corpus's blocks, most of whose tokens a language model guesses without it."""
    rng = random.Random(seed)
    out = []
    for _ in range(count if words else 0):
        if rng.random() < 0.5:
            text = " ".join(rng.choice(words) for _ in range(rng.randint(*RANDOM_WORDS)))
            out.append(copy_task(rng, "prose", text, words))
        else:
            lines = [_random_line(rng, words) for _ in range(rng.randint(*RANDOM_LINES))]
            out.append(copy_task(rng, "code", "\n".join(lines), words))
    return out


def _random_line(rng: random.Random, words: Sequence[str]) -> str:
    a, b, c, d = (rng.choice(words) for _ in range(4))
    form = rng.choice(RANDOM_CODE_LINES)
    return form.format(a=a, b=b, c=c, d=d, n=rng.choice(NEW_VALUES + (7, 12, 99)))


def heldout_copy_tasks(conversations: Sequence[Conversation], words: Sequence[str], count: int) -> list[CopyTask]:
    """`count` tasks from the (held-out) conversations, one per block in turn, seeded by HELDOUT_COPY_SEED."""
    rng = random.Random(HELDOUT_COPY_SEED)
    blocks = [b for b in (source_block(c) for c in conversations) if b is not None]
    return [copy_task(rng, *blocks[i % len(blocks)], words) for i in range(count if blocks else 0)]


def source_block(conversation: Conversation) -> tuple[str, str] | None:
    """(kind, block): the code of an answer that is one python block (its first MAX_CODE_LINES lines), else
    the answer's first paragraph of MIN_CHARS or more; cut to MAX_CHARS. None when there is neither."""
    answer = conversation.answer.strip()
    if answer.startswith("```python\n") and answer.endswith("\n```"):
        lines = answer[len("```python\n") : -len("\n```")].splitlines()[:MAX_CODE_LINES]
        code = _cut("\n".join(lines), "\n")
        return ("code", code) if len(code) >= MIN_CHARS else None
    for paragraph in answer.split("\n\n"):
        text = _cut(" ".join(paragraph.split()), ". ")
        if len(text) >= MIN_CHARS and "```" not in text:
            return "prose", text
    return None


def _cut(text: str, at: str) -> str:
    """`text` up to MAX_CHARS, cut after the last `at` before it when longer."""
    if len(text) <= MAX_CHARS:
        return text
    end = text.rfind(at, 0, MAX_CHARS)
    return text[: end + (1 if at == ". " else 0)] if end > 0 else text[:MAX_CHARS]


def copy_task(rng: random.Random, kind: str, block: str, words: Sequence[str]) -> CopyTask:
    """A random edit of `block` (another when the drawn one does not apply to it; a repeat when none does)."""
    if kind == "code":
        drawn = rng.choices(EDITS, EDIT_WEIGHTS)[0]
        order = [drawn] + rng.sample([e for e in EDITS if e != drawn], len(EDITS) - 1) if drawn != "repeat" else []
    else:
        order = ["word"] if rng.random() < 0.35 else []
    made = next((m for m in (EDITORS[e](rng, block, words) for e in order if e != "repeat") if m), None)
    edit, fields, answer = made or ("repeat", {}, block)
    instruction = rng.choice((CODE_REQUESTS if kind == "code" else PROSE_REQUESTS)[edit]).format(**fields)
    shown = f"```python\n{block}\n```" if kind == "code" else block
    request = f"{instruction}\n\n{shown}" if rng.random() < 0.8 else f"{shown}\n\n{instruction}"
    return CopyTask(kind, edit, block, request, f"```python\n{answer}\n```" if kind == "code" else answer)


def _rename(rng: random.Random, block: str, words: Sequence[str]) -> tuple[str, dict, str] | None:
    """Every whole-word use of one name the code holds (outside comments and strings) renamed, in comments
    and strings too, to one made of `words` that the block does not hold."""
    return _replace(rng, block, words, _code_names(block))


def _replace_word(rng: random.Random, block: str, words: Sequence[str]) -> tuple[str, dict, str] | None:
    """Every whole-word use of one word of a paragraph replaced by one made of `words`."""
    return _replace(rng, block, words, set(_NAME.findall(block)))


def _replace(rng: random.Random, block: str, words: Sequence[str], names: set[str]) -> tuple[str, dict, str] | None:
    candidates = sorted(n for n in names if n not in _NOT_NAMES and len(n) >= 3)
    if not candidates or not words:
        return None
    old = rng.choice(candidates)
    new = "_".join(rng.sample(list(words), rng.choice((1, 2))))
    if re.search(rf"\b{re.escape(new)}\b", block):
        return None
    return "rename", {"old": old, "new": new}, re.sub(rf"\b{re.escape(old)}\b", new, block)


def _code_names(code: str) -> set[str]:
    """The names Python's tokenizer finds in `code`; for code it cannot read (a block cut short inside a
    string), the names of its lines without their comments."""
    try:
        return {t.string for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type == tokenize.NAME}
    except (tokenize.TokenError, SyntaxError):
        return {n for line in code.splitlines() for n in _NAME.findall(line.split("#")[0])}


def _reindent(rng: random.Random, block: str, words: Sequence[str]) -> tuple[str, dict, str] | None:
    """Each line's indent of 4-space levels at another width (the rest of a level's spaces kept)."""
    if not re.search(r"^    \S", block, re.M):
        return None
    width = rng.choice(INDENTS)

    def line(text: str) -> str:
        spaces = len(text) - len(text.lstrip(" "))
        return " " * (spaces // 4 * width + spaces % 4) + text[spaces:]

    return "reindent", {"width": width}, "\n".join(line(t) for t in block.split("\n"))


def _change_value(rng: random.Random, block: str, words: Sequence[str]) -> tuple[str, dict, str] | None:
    """Every use of one integer literal changed to another value."""
    numbers = sorted(set(_NUMBER.findall(block)), key=int)
    if not numbers:
        return None
    old = rng.choice(numbers)
    new = str(rng.choice([v for v in NEW_VALUES if str(v) != old]))
    edited = re.sub(rf"(?<![\w.]){old}(?![\w.])", new, block)
    return "value", {"old": old, "new": new}, edited


EDITORS = {"word": _replace_word, "rename": _rename, "reindent": _reindent, "value": _change_value}


def copy_conversation(task: CopyTask) -> Conversation:
    """The task as a training conversation (no thinking)."""
    messages = [{"role": "user", "content": task.request}, {"role": "assistant", "content": task.answer}]
    return Conversation(messages, None, {"copy", task.kind, task.edit})
