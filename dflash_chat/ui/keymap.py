"""Every shortcut of the app by binding id, and the user's [keymap] checked against them.

Plain data and checks, no Textual import: `dflash-chat --set keymap...` validates with it before
any UI exists. `resolve()` turns the user's overrides into the ones that can be applied: an
unknown id, a key that is not a key, a key the message box needs or a key two actions would
share is refused with a line that says why, and that action keeps its default key, so no action
is ever left without a key.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Command:
    id: str
    keys: str  # default keys, comma-separated
    action: str
    title: str  # in the palette and the footer
    help: str
    footer: bool = False


# the chat screen's commands; the palette and the footer read this
COMMANDS = (
    Command(
        "toggle-thinking", "ctrl+t", "toggle_thinking", "Toggle thinking", "Thinking on/off for the next answer", True
    ),
    Command("stop", "escape", "stop", "Stop generation", "Stop the answer being written (it is kept)", True),
    Command("new-chat", "ctrl+n", "new_chat", "New chat", "Start a new conversation", True),
    Command("history", "ctrl+o", "history", "History", "Open, rename, delete or export saved chats", True),
    Command("tools", "f3", "tools", "Tools", "MCP servers, and the tools this chat offers", True),
    Command(
        "attach-image",
        "f4",
        "attach_image",
        "Attach image",
        "Attach an image to the next message by its path (or type /image PATH, or paste the path)",
    ),
    Command("regenerate", "ctrl+r", "regenerate", "Regenerate", "Write the last answer again"),
    Command("copy-answer", "ctrl+l", "copy_answer", "Copy last answer", "Copy the last answer to the clipboard"),
    Command("copy-code", "ctrl+b", "copy_code", "Copy last code block", "Copy the last code block of the last answer"),
    Command("focus-switch", "ctrl+f", "focus_switch", "Switch focus", "Move between the message box and the chat"),
    Command("toggle-panel", "f2", "toggle_panel", "Toggle side panel", "Show or hide the stats panel"),
    Command(
        "settings",
        "ctrl+s",
        "settings",
        "Settings",
        "Edit sampling, system prompt, theme, model, decode path and endpoints",
        True,
    ),
)
QUIT = Command("quit", "ctrl+q", "quit", "Quit", "Quit the app")
ALL = (*COMMANDS, QUIT)
IDS = tuple(c.id for c in ALL)

# keys the message box and the app itself need: never given to a command
RESERVED = {
    "enter": "sending the message",
    "shift+enter": "a new line",
    "ctrl+j": "a new line",
    "up": "earlier prompts",
    "down": "earlier prompts",
    "tab": "moving the focus",
    "shift+tab": "moving the focus",
    "ctrl+p": "the command palette",
    "ctrl+c": "copying",
    "ctrl+v": "pasting",
    "ctrl+x": "cutting",
}
MODIFIERS = ("alt", "ctrl", "hyper", "meta", "shift", "super")
NAMED_KEYS = {
    "escape",
    "enter",
    "tab",
    "space",
    "backspace",
    "delete",
    "insert",
    "home",
    "end",
    "pageup",
    "pagedown",
    "up",
    "down",
    "left",
    "right",
    *(f"f{n}" for n in range(1, 25)),
}


class BadKey(ValueError):
    """A key string that cannot be a shortcut; the message says why."""


def canonical(key: str) -> str:
    """'Shift+Ctrl+K' -> 'ctrl+shift+k': modifiers sorted as Textual writes them; BadKey if it is no key."""
    parts = [part.strip() for part in key.strip().split("+")]
    *mods, name = parts
    mods = [m.lower() for m in mods]
    if not name:
        raise BadKey(f"{key!r} is not a key (write keys like ctrl+k, f5 or escape)")
    unknown = [m for m in mods if m not in MODIFIERS]
    if unknown:
        raise BadKey(f"{key!r}: {unknown[0]!r} is not a modifier (use {', '.join(MODIFIERS)})")
    if len(set(mods)) != len(mods):
        raise BadKey(f"{key!r} repeats a modifier")
    if len(name) > 1:
        name = name.lower()
        if name not in NAMED_KEYS and not _unicode_key(name):
            raise BadKey(f"{key!r}: {name!r} is not a key name (e.g. f5, escape, home, pageup, question_mark)")
    elif mods and mods != ["shift"]:
        name = name.lower()
    if not mods or mods == ["shift"]:
        if len(name) == 1 or _unicode_key(name):
            raise BadKey(f"{key!r} types a character in the message box; add a modifier (e.g. ctrl+{name.lower()})")
    return "+".join([*sorted(mods), name])


def _unicode_key(name: str) -> bool:
    """Textual names punctuation keys by their Unicode names: 'question_mark', 'left_square_bracket'."""
    try:
        unicodedata.lookup(name.replace("_", " "))
    except KeyError:
        return False
    return True


def split_keys(keys: str) -> list[str]:
    return [k for k in (part.strip() for part in keys.split(",")) if k]


@dataclass
class Resolved:
    """The overrides that can be applied (binding id -> canonical keys) and why others were not."""

    keymap: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def keys(self, binding_id: str) -> str:
        return self.keymap.get(binding_id) or _default(binding_id)

    def first_key(self, binding_id: str) -> str:
        return split_keys(self.keys(binding_id))[0]


def _default(binding_id: str) -> str:
    return next(c.keys for c in ALL if c.id == binding_id)


def check_entry(binding_id: str, keys: str) -> str:
    """One override on its own -> its canonical keys; BadKey says what is wrong."""
    if binding_id not in IDS:
        raise BadKey(f"unknown binding id {binding_id!r} (known: {', '.join(IDS)})")
    if not isinstance(keys, str) or not split_keys(keys):
        raise BadKey(f'{binding_id} needs keys, e.g. {binding_id} = "{_default(binding_id)}"')
    canon = []
    for key in split_keys(keys):
        c = canonical(key)
        if c in RESERVED:
            raise BadKey(f"{binding_id} = {keys!r}: {c} is kept for {RESERVED[c]}")
        if c not in canon:
            canon.append(c)
    return ",".join(canon)


def resolve(overrides: Mapping[str, str]) -> Resolved:
    """Apply what can be applied; every refusal is a line in `problems` and leaves that action its default keys."""
    result = Resolved()
    for binding_id, keys in overrides.items():
        try:
            result.keymap[binding_id] = check_entry(binding_id, keys)
        except BadKey as exc:
            result.problems.append(f"keymap: {exc}")
    while clash := _first_clash(result):
        key, holders = clash
        user = [b for b in holders if b in result.keymap]
        if not user:  # cannot happen: the defaults never share a key
            break
        loser = user[-1]  # the later override gives way: defaults never move unless asked to
        others = [b for b in holders if b != loser]
        del result.keymap[loser]
        result.problems.append(
            f'keymap: {loser} = "{overrides[loser]}" was not applied: {key} is also '
            f"{' and '.join(others)}'s key; {loser} keeps {_default(loser)}"
        )
    return result


def _first_clash(resolved: Resolved) -> tuple[str, list[str]] | None:
    holders: dict[str, list[str]] = {}
    for command in ALL:
        for key in split_keys(resolved.keys(command.id)):
            holders.setdefault(key, []).append(command.id)
    return next(((key, ids) for key, ids in holders.items() if len(ids) > 1), None)
