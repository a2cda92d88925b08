"""Offline training text: chat turns built from the Python standard library and the pydoc topics.

Every machine with Python has these, so the demo pair can be rebuilt anywhere without a download.
A conversation is a list of {"role", "content"} messages; the assistant's last message may carry a
short `reasoning` (rendered as a <think> block). The same seed gives the same corpus on the same
Python version.
"""

from __future__ import annotations

import ast
import random
import sysconfig
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

MAX_ANSWER_LINES = 40
MAX_TOPIC_CHARS = 1200
# Folders of the stdlib that are tests, vendored code or platform glue rather than readable modules.
SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "ensurepip", "turtledemo", "__pycache__"}

FUNCTION_QUESTIONS = (
    "Show the function `{name}` from module `{module}`.",
    "How is `{module}.{name}` implemented?",
    "Write the source of `{name}` in `{module}`.",
)
METHOD_QUESTIONS = (
    "Show the method `{name}` from module `{module}`.",
    "How is the method `{name}` in `{module}` written?",
)
CLASS_QUESTIONS = (
    "Show the class `{name}` from module `{module}`.",
    "How does `{module}` define the class `{name}`?",
)
DOC_QUESTIONS = ("What does `{module}.{name}` do?", "Explain `{name}` from `{module}`.")
TOPIC_QUESTIONS = ("What does the `{topic}` statement do?", "Explain {topic} in Python.", "Tell me about `{topic}`.")
REASONING = (
    "The user wants {what}. I will answer with the code from the standard library.",
    "This is about {what}. A short answer with the source is enough.",
)


@dataclass
class Conversation:
    messages: list[dict]
    reasoning: str | None = None  # the last assistant turn's thinking, if any
    tags: set[str] = field(default_factory=set)
    subject: tuple[str, str] | None = None  # (module, name) asked about; ("pydoc", topic) for a topic
    summary: str | None = None  # the first sentence of the subject's docstring, lower-cased, if short
    tools: list[dict] | None = None  # the tools offered (OpenAI's shape), as the template takes them

    @property
    def prompt_messages(self) -> list[dict]:
        return self.messages[:-1]

    @property
    def answer(self) -> str:
        return self.messages[-1]["content"]


@dataclass
class Corpus:
    train: list[Conversation]
    heldout: list[Conversation]


@dataclass(frozen=True)
class _Item:
    module: str
    name: str
    kind: str  # "function" | "method" | "class" | "topic"
    body: str
    doc: str | None = None


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_items(root: Path | None = None, max_files: int | None = None) -> list[_Item]:
    """Top-level functions and classes of the stdlib's pure-Python modules, in a stable order."""
    root = root or stdlib_root()
    files = sorted(p for p in root.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(root).parts[:-1]))
    items: list[_Item] = []
    for path in files[:max_files]:
        module = _module_name(path.relative_to(root))
        items.extend(_items_of(path, module))
    return items


def topic_items() -> list[_Item]:
    from pydoc_data.topics import topics

    return [_Item("pydoc", name, "topic", _trim_topic(text)) for name, text in sorted(topics.items())]


def build_corpus(
    seed: int = 0, heldout: int = 64, max_files: int | None = None, thinking_share: float = 0.25
) -> Corpus:
    """Chat turns from the stdlib and pydoc topics; `heldout` conversations about unseen items are kept apart."""
    rng = random.Random(seed)
    items = stdlib_items(max_files=max_files) + topic_items()
    rng.shuffle(items)
    # Hold out whole items (not just phrasings), so evaluation prompts ask about code the target never saw.
    held = [i for i in items if i.kind == "function"][:heldout]
    held_names = {(i.module, i.name) for i in held}
    train_items = [i for i in items if (i.module, i.name) not in held_names]
    train = [_conversation(i, rng, thinking_share) for i in train_items]
    # A few two-turn chats, so the model sees history in the template.
    for _ in range(len(train) // 10):
        first, second = rng.sample(train, 2)
        train.append(Conversation(first.messages + second.messages, second.reasoning, {"multi"}))
    rng.shuffle(train)
    test = [_conversation(i, rng, thinking_share=0.0) for i in held]
    return Corpus(train=train, heldout=test)


def _conversation(item: _Item, rng: random.Random, thinking_share: float) -> Conversation:
    if item.kind == "topic":
        question = rng.choice(TOPIC_QUESTIONS).format(topic=item.name)
        answer = item.body
        what = f"the `{item.name}` topic"
    elif item.doc and rng.random() < 0.25:
        question = rng.choice(DOC_QUESTIONS).format(module=item.module, name=item.name)
        answer = item.doc
        what = f"what `{item.name}` does"
    else:
        templates = {"function": FUNCTION_QUESTIONS, "method": METHOD_QUESTIONS}.get(item.kind, CLASS_QUESTIONS)
        question = rng.choice(templates).format(module=item.module, name=item.name)
        answer = f"```python\n{item.body}\n```"
        what = f"the source of `{item.name}`"
    reasoning = rng.choice(REASONING).format(what=what) if rng.random() < thinking_share else None
    messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    summary = _summary(item.doc) if answer == item.doc else None
    return Conversation(messages, reasoning, {item.kind}, (item.module, item.name), summary)


def _summary(doc: str) -> str | None:
    """'Return the sum...' -> 'return the sum...': the first sentence, when it is short and one line."""
    first = doc.split(".")[0].strip()
    if 10 < len(first) < 80 and "\n" not in first:
        return first[0].lower() + first[1:]
    return None


def _module_name(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _items_of(path: Path, module: str) -> list[_Item]:
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    items = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            items.append(_item(source, node, module, node.name, "class"))
            methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            items.extend(_item(source, m, module, f"{node.name}.{m.name}", "method") for m in methods)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            items.append(_item(source, node, module, node.name, "function"))
    return [i for i in items if i is not None]


def _item(
    source: str, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, module: str, name: str, kind: str
) -> _Item | None:
    segment = ast.get_source_segment(source, node)
    if not segment:
        return None
    if kind == "method":
        segment = textwrap.dedent(" " * node.col_offset + segment)
    body = "\n".join(segment.splitlines()[:MAX_ANSWER_LINES])
    doc = ast.get_docstring(node)
    doc = doc.strip()[:MAX_TOPIC_CHARS] if doc and len(doc) > 20 else None
    return _Item(module, name, kind, body, doc)


def _trim_topic(text: str) -> str:
    text = text.strip()
    if len(text) <= MAX_TOPIC_CHARS:
        return text
    cut = text.rfind("\n\n", 0, MAX_TOPIC_CHARS)
    return text[: cut if cut > 0 else MAX_TOPIC_CHARS]


FREE_FORM_QUESTIONS = (
    "Write a function that {summary}.",
    "How do I use `{module}`?",
    "Give an example of `{module}.{name}`.",
    "What is `{name}` for?",
    "Write a class like `{name}`.",
    "Explain {topic} with an example.",
    "How do I {summary} in Python?",
)


def free_form_prompts(conversations: list[Conversation], rng: random.Random, count: int) -> list[Conversation]:
    """Questions phrased unlike the corpus (as users ask them), about the same subjects.

    Only the prompt matters: they are for the target to answer in its own words, so the drafter also
    learns how the target answers questions outside the corpus's phrasings.
    """
    topics = [c.subject[1] for c in conversations if c.subject and "topic" in c.tags]
    subjects = [c.subject for c in conversations if c.subject and "topic" not in c.tags]
    summaries = [c.summary for c in conversations if c.summary]
    have = {"summary": summaries, "module": subjects, "name": subjects, "topic": topics}
    templates = [t for t in FREE_FORM_QUESTIONS if all(have[k] for k in have if "{" + k + "}" in t)]
    out = []
    for _ in range(count if templates else 0):
        template = rng.choice(templates)
        module, name = rng.choice(subjects) if subjects else ("", "")
        question = template.format(
            summary=rng.choice(summaries) if summaries else "",
            module=module,
            name=name.split(".")[-1],
            topic=rng.choice(topics) if topics else "",
        )
        out.append(
            Conversation([{"role": "user", "content": question}, {"role": "assistant", "content": ""}], None, {"free"})
        )
    return out
