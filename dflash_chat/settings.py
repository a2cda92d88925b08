"""The user's settings: a typed object read from and written to config.toml.
One file past 500 lines: reading, checking and editing the one file in place share its parse and its rules.

config.toml is the user's file. Reading never writes it. A write (an explicit change: `--set`, the
settings screen, a theme picked in the palette) edits only the keys that changed, in place, with
tomlkit: comments, order, formatting and every key and table this module does not know (the model
catalog keeps `[models]` entries here) stay byte for byte. Writes go to a temporary file beside
config.toml, then os.replace, so a crash never leaves half a file; the file keeps its permissions,
and a config.toml that is a symlink stays one (its target is rewritten).

A value that cannot be used is refused with a message that names the key and what it accepts: at
once for `--set` and the settings screen; when read from the file, `load` refuses it and `read`
(the app) reports it and uses the default meanwhile.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import tempfile
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import tomlkit
from tomlkit.exceptions import TOMLKitError

from dflash_chat import mcp_config, paths
from dflash_chat.engine import rules
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


class SettingsError(UserError):
    """A setting is unknown or its value is out of range; the message says which and why."""


@dataclass(frozen=True)
class Settings:
    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    min_p: float = 0.0
    max_new_tokens: int = 1024
    system_prompt: str = ""
    thinking: bool = False
    theme: str = "dflash-dark"
    model: str = ""
    drafter: str = ""
    context_length: int = 8192
    decode: str = "auto"  # the decode path: auto (CUDA graphs on a GPU), graphs or fixed (engine/spec.py)
    draft: str | int = "auto"  # drafts each step verifies: "auto", "off" or a number (engine/draft_length.py)
    speculate: str = "auto"  # which method drafts: "auto", "dflash", "mtp", "lookup" or "none" (engine/speculation.py)
    vision: str = "auto"  # the vision tower: "auto" (loaded where it fits, models/hardware.py) or "off"
    previews: str = "auto"  # how attached images are previewed: auto, kitty, sixel or blocks (ui/terminal_graphics.py)
    # MiB of prompt checkpoints kept so a branching request resumes near the branch (engine/prefix_cache.py)
    prefix_cache_mib: int = rules.PREFIX_CACHE_MIB_DEFAULT
    # MiB of host memory for conversations another request displaced, so they resume later (engine/parked.py)
    prefix_cache_ram_mib: int = rules.PREFIX_CACHE_RAM_MIB_DEFAULT
    # binding id -> keys, e.g. {"toggle-thinking": "ctrl+t"}; the ids are in ui/keymap.py
    keymap: dict[str, str] = field(default_factory=dict)
    # name -> URL of an OpenAI-compatible server, for `dflash-chat --endpoint NAME`
    endpoints: dict[str, str] = field(default_factory=dict)
    # the MCP servers chats may use, the rounds of tool calls per message, the time one call may run
    mcp: mcp_config.McpSettings = field(default_factory=mcp_config.McpSettings)

    def sampling(self) -> SamplingParams:
        """How the app's answers are sampled: the one value that goes down to the engine's step."""
        return SamplingParams.of(self)


MAX_CONFIG_BYTES = 1024 * 1024  # a settings file is a few lines; past this it is not one
OTHER_TABLES = ("models",)  # kept in config.toml by the model catalog (models/catalog.py)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise rules.Invalid(f"must be text, got {value!r}")
    return value


def _name(value: Any) -> str:
    value = _text(value).strip()
    if not value:
        raise rules.Invalid("cannot be empty")
    return value


def _typed_table(value: Any, shape: str) -> Any:
    """A table typed on one line (--set, the settings screen): "a=x;b=y" -> {"a": "x", "b": "y"}."""
    if not isinstance(value, str):
        return value
    pairs = [item.split("=", 1) for item in value.split(";") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise rules.Invalid(f"must look like '{shape}'")
    return {name.strip(): entry.strip() for name, entry in pairs}


def _keymap(value: Any) -> dict[str, str]:
    value = _typed_table(value, "binding-id=keys;other-id=keys")  # e.g. "toggle-thinking=ctrl+t;stop=escape"
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in value.items()
    ):
        raise rules.Invalid('must be a table of binding-id = "keys" (e.g. toggle-thinking = "ctrl+k")')
    return {k: v.strip() for k, v in value.items()}


def _endpoints(value: Any) -> dict[str, str]:
    value = _typed_table(value, "name=http://host:port/v1;other=http://...")
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and k.strip() and isinstance(v, str) for k, v in value.items()
    ):
        raise rules.Invalid('must be a table of name = "URL" (e.g. big-box = "http://10.0.0.5:8000/v1")')
    for name, url in value.items():
        if not url.strip().lower().startswith(("http://", "https://")):
            raise rules.Invalid(f"{name} must be an http:// or https:// URL, got {url!r}")
    return {k.strip(): v.strip() for k, v in value.items()}


def _one_of(*options: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        text = str(value).strip().lower()
        if text not in options:
            raise rules.Invalid(f"must be one of {', '.join(options)}, got {value!r}")
        return text

    return check


DECODE_PATHS = ("auto", "graphs", "fixed")
PREVIEWS = ("auto", "kitty", "sixel", "blocks")  # the previews setting (ui/terminal_graphics.py reads it)
OLD_DECODE_NAMES = {"eager": "fixed"}  # the variable-shape eager steps are gone; the fixed ones run uncaptured


def _decode(value: Any) -> str:
    text = str(value).strip().lower()
    return _one_of(*DECODE_PATHS)(OLD_DECODE_NAMES.get(text, text))


VALIDATORS: dict[str, Callable[[Any], Any]] = {
    "temperature": rules.TEMPERATURE.parse,
    "top_p": rules.TOP_P.parse,
    "top_k": rules.TOP_K.parse,
    "min_p": rules.MIN_P.parse,
    "max_new_tokens": rules.MAX_NEW_TOKENS.parse,
    "system_prompt": _text,
    "thinking": rules.switch,
    "theme": _name,
    "model": _text,
    "drafter": _text,
    "context_length": rules.Number(int, 256, 1_048_576).parse,
    "decode": _decode,
    "draft": rules.draft,
    "speculate": rules.speculate,
    "vision": rules.vision,
    "previews": _one_of(*PREVIEWS),
    "prefix_cache_mib": rules.PREFIX_CACHE_MIB.parse,
    "prefix_cache_ram_mib": rules.PREFIX_CACHE_RAM_MIB.parse,
    "keymap": _keymap,
    "endpoints": _endpoints,
    "mcp": mcp_config.check_table,
}

DESCRIPTIONS: dict[str, str] = {
    "temperature": "sampling temperature, 0 = greedy (0-2)",
    "top_p": "nucleus sampling mass (greater than 0, at most 1; 1 = off)",
    "top_k": "keep the k likeliest tokens (0 = off)",
    "min_p": "drop tokens less likely than min_p times the likeliest (0-1, 0 = off)",
    "max_new_tokens": "longest answer, in tokens",
    "system_prompt": "text sent as the system message (empty = none)",
    "thinking": "let the model think before answering (on/off)",
    "theme": "colour theme name",
    "model": "pair name (dflash-chat models) or model folder/GGUF; empty: pick for this GPU",
    "drafter": "DFlash drafter folder/GGUF (empty: the pair's or demo's own; else MTP and lookup draft)",
    "context_length": "tokens of context the model keeps",
    "decode": "decode path: auto (CUDA graphs on a GPU, the same steps uncaptured elsewhere), graphs, or fixed "
    "(uncaptured; eager is an older name for it)",
    "draft": "drafts each step verifies: auto (picked per step for speed), off (plain decoding), or a number "
    f"1-{rules.MAX_DRAFT} (at most the drafter's block - 1)",
    "speculate": "which method drafts: auto (chosen per step among those the model has, for speed), dflash (the "
    "drafter), mtp (the model's own MTP layer), lookup (copied from the chat), none (plain decoding)",
    "vision": "the model's vision tower, which reads images: auto (loaded where it fits beside the model and its "
    "context; `dflash-chat models` says whether it does) or off (never loaded: its memory goes to the context)",
    "previews": "how an attached image's chip shows it: auto (the image itself where the terminal draws images: "
    "kitty and Ghostty, or sixel in WezTerm, iTerm2, foot, mlterm, contour and Konsole; else coloured half-blocks), "
    "kitty, sixel or blocks",
    "prefix_cache_mib": "MiB of prompt checkpoints kept on the model's device so a request that shares only the start of "
    "an earlier one (the same system prompt and tools) resumes there instead of prefilling it again (0 = off)",
    "prefix_cache_ram_mib": "MiB of host memory for whole conversations set aside while another one (a second chat, "
    "an agent's side request with its own system prompt) holds the model, so each resumes where it left off "
    "(0 = off)",
    "keymap": "key overrides: binding-id=keys;other-id=keys",
    "endpoints": "named OpenAI-compatible servers: name=URL;other=URL (dflash-chat --endpoint NAME)",
    "mcp": "MCP tool servers ([mcp.servers.NAME] with command/args/env or url, enabled), rounds and timeout",
}

KEYS = tuple(f.name for f in fields(Settings))
TABLES = ("keymap", "endpoints")  # settings held as a TOML table; `--set TABLE.ENTRY=VALUE` edits one entry


def parse_value(key: str, value: Any) -> Any:
    """Validate one setting given as typed text or as a TOML value; SettingsError says what is wrong."""
    if key not in VALIDATORS:
        raise SettingsError(f"unknown setting {key!r}; known settings: {', '.join(KEYS)}")
    try:
        return VALIDATORS[key](value)
    except rules.Invalid as exc:
        raise SettingsError(str(exc) if key == "mcp" else f"{key} {exc}") from None


def as_text(key: str, value: Any) -> str:
    """A setting as typed on one line (the settings screen): tables as 'a=x;b=y', the rest as str()."""
    if key in TABLES:
        return ";".join(f"{name}={entry}" for name, entry in value.items())
    return str(value)


def parse_assignment(
    text: str,
    keymap: Mapping[str, str] | None = None,
    endpoints: Mapping[str, str] | None = None,
    mcp: mcp_config.McpSettings | None = None,
) -> tuple[str, Any]:
    """'key=value' (as given to --set) -> (key, typed value). 'keymap.ID=KEYS' changes one entry of
    `keymap` (the current one) and returns the whole table; 'keymap.ID=' removes that entry. The same
    for 'endpoints.NAME=URL', and 'mcp.…' edits one value of `mcp` (mcp_config.apply)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise SettingsError(f"--set takes key=value, got {text!r} (e.g. --set temperature=0.2)")
    key = key.strip()
    table, dot, entry = key.partition(".")
    if table == "mcp":
        try:
            return "mcp", mcp_config.apply(mcp or mcp_config.McpSettings(), entry.strip(), value)
        except rules.Invalid as exc:
            raise SettingsError(f"--set {key}: {exc}") from None
    if dot and table in TABLES and entry.strip():
        entries = dict({"keymap": keymap, "endpoints": endpoints}[table] or {})
        entries.pop(entry.strip(), None)
        if value.strip():
            entries[entry.strip()] = value.strip()
        return table, parse_value(table, entries)
    return key, parse_value(key, value)


def flag(key: str) -> Callable[[str], Any]:
    """An argparse `type` that checks a command-line flag with the rules of setting `key`:
    `--max-tokens 0` fails as `max_new_tokens = 0` would, before anything loads."""
    return _argparse_type(VALIDATORS[key], key)


def rule_flag(rule: rules.Number) -> Callable[[str], Any]:
    """An argparse `type` for a flag that is no setting, checked by its rule (engine/rules.py)."""
    return _argparse_type(rule.parse, "a whole number" if rule.kind is int else "a number")


def ranged(kind: type, low: float, high: float) -> Callable[[str], Any]:
    """An argparse `type` for a number flag that has no rule of its own, worded like the rules."""
    return rule_flag(rules.Number(kind, low, high))


def _argparse_type(check: Callable[[Any], Any], name: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return check(text)
        except rules.Invalid as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name  # argparse names the type in some messages
    return parse


# reading


def _read_text(path: Path) -> str:
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError
        if not stat.S_ISREG(info.st_mode):  # a FIFO or a device would block or never end
            raise SettingsError(f"{path} is not a regular file; move it away")
        if info.st_size > MAX_CONFIG_BYTES:
            raise SettingsError(
                f"{path} is {info.st_size // 1024} KiB, far too large for a settings file; move it away"
            )
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return ""
    except IsADirectoryError:
        raise SettingsError(f"{path} is a folder, not a settings file; move it away") from None
    except OSError as exc:
        raise SettingsError(f"{path} cannot be read ({exc.strerror or exc})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SettingsError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); fix or delete it") from None


BOM = "\ufeff"  # some editors (Notepad) begin a UTF-8 file with it: read past it, and a write keeps it


def _document(path: Path, text: str | None = None) -> dict[str, Any]:
    """The file's content (`text`: as already read); SettingsError in the one wording its readers and writers use."""
    try:
        return tomllib.loads((_read_text(path) if text is None else text).removeprefix(BOM))
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path} is not valid TOML ({exc}); fix or delete it") from None


def _from_file(key: str, value: Any) -> Any:
    if key == "keymap" and not isinstance(value, Mapping):  # the typed form is for the command line
        raise SettingsError('keymap must be a table: a [keymap] section with lines like toggle-thinking = "ctrl+k"')
    if key == "endpoints" and not isinstance(value, Mapping):
        raise SettingsError('endpoints must be a table: an [endpoints] section with lines like big-box = "http://..."')
    return parse_value(key, value)


def read(path: Path | None = None) -> tuple[Settings, list[str]]:
    """Settings for the app and what in the file cannot be used: each such value is left at its
    default meanwhile, and stays in the file for the user to fix; a bad entry of [mcp] is skipped alone.
    Never raises for the file's content."""
    path = path or paths.config_file()
    try:
        document = _document(path)
    except SettingsError as exc:
        return Settings(), [f"{exc}. Using the default settings meanwhile."]
    values: dict[str, Any] = {}
    problems: list[str] = []
    defaults = Settings()
    for key, value in document.items():
        if key in OTHER_TABLES:
            continue
        if key == "mcp":
            values[key], skipped = mcp_config.read_table(value)
            problems += [f"{path}: {problem}" for problem in skipped]
            continue
        if key not in VALIDATORS:
            problems.append(f"{path}: unknown setting {key!r} is ignored (known: {', '.join(KEYS)})")
            continue
        try:
            values[key] = _from_file(key, value)
        except SettingsError as exc:
            problems.append(f"{path}: {exc}; fix or remove that line (using {getattr(defaults, key)!r} meanwhile)")
    return Settings(**values), problems


def load(path: Path | None = None) -> Settings:
    """Settings from config.toml (defaults for anything missing); SettingsError for anything that cannot be used."""
    path = path or paths.config_file()
    document = _document(path)
    values = {}
    for key, value in document.items():
        if key not in VALIDATORS:
            continue  # another part's table ([models]) or a key of no use; read() reports the latter
        try:
            values[key] = _from_file(key, value)
        except SettingsError as exc:
            raise SettingsError(f"{path}: {exc}; fix or remove that line") from None
    return Settings(**values)


# writing


def changes(old: Settings, new: Settings) -> dict[str, Any]:
    """The settings `new` changes from `old` (what a form edited), to pass to `update`."""
    return {key: getattr(new, key) for key in KEYS if getattr(new, key) != getattr(old, key)}


def update(changes: Mapping[str, Any], path: Path | None = None) -> Path:
    """Write exactly these settings (validated values) into config.toml; nothing else in it changes."""
    path = path or paths.config_file()
    if not changes:
        return path
    text = _read_text(path)
    bom = BOM if text.startswith(BOM) else ""
    _document(path, text)  # a broken file is refused in the words the app and doctor use
    try:
        document = tomlkit.parse(text[len(bom) :])
    except TOMLKitError as exc:  # what tomllib takes and tomlkit does not
        raise SettingsError(f"{path} is not valid TOML ({exc}); fix or delete it") from None
    for key, value in changes.items():
        parse_value(key, value)
        if key == "mcp":
            _set_mcp(document, value)
        elif key in TABLES:
            _set_table(document, key, value)
        elif not _same(_held(document, key), value):  # an equal value keeps the user's spelling of it
            document[key] = value
    new_text = bom + document.as_string()
    if new_text != text:
        _write_atomically(path, new_text)
    return path


def _held(document: Any, key: str) -> Any:
    """What the file says for `key` (as a plain value), or None."""
    item = document.get(key)
    return item.unwrap() if hasattr(item, "unwrap") else item


def _same(held: Any, value: Any) -> bool:
    return type(held) is type(value) and held == value  # `thinking = 1` is not `true`


def _set_table(document: Any, key: str, entries: Mapping[str, str]) -> None:
    """Edit the table's entries in place (comments stay); an empty one removes the table."""
    if not entries:
        document.pop(key, None)
        return
    table = document.get(key)
    if not isinstance(table, MutableMapping):  # tomlkit's tables are
        document[key] = dict(entries)
        return
    for name in [name for name in table if name not in entries]:
        del table[name]
    for name, value in entries.items():
        if table.get(name) != value:
            table[name] = value


def _set_mcp(document: Any, new: mcp_config.McpSettings) -> None:
    """Edit only the values of [mcp] that differ from what the file holds (read as the app reads it: an entry
    it skips is never touched, unless `new` sets it); tables are made where a value needs one."""
    old, _ = mcp_config.read_table(_held(document, "mcp") or {})
    for path, value in mcp_config.edits(old, new):
        *tables, leaf = ("mcp", *path)
        parent = document
        for name in tables:
            child = parent.get(name)
            if not isinstance(child, MutableMapping):
                if value is mcp_config.DELETE:
                    break
                child = parent[name] = tomlkit.table(is_super_table=name in ("mcp", "servers"))
            parent = child
        else:
            if value is mcp_config.DELETE:
                parent.pop(leaf, None)
            elif isinstance(value, Mapping):
                _set_entries(parent, leaf, value)
            else:
                parent[leaf] = value
    _drop_empty(document, ("mcp", "servers"))


def _set_entries(parent: Any, key: str, entries: Mapping[str, str]) -> None:
    """A small table (a server's env) edited entry by entry where the file has it, else written inline."""
    held = parent.get(key)
    if not isinstance(held, MutableMapping):
        inline = tomlkit.inline_table()
        inline.update(entries)
        parent[key] = inline
        return
    for name in [name for name in held if name not in entries]:
        del held[name]
    for name, value in entries.items():
        if held.get(name) != value:
            held[name] = value


def _drop_empty(document: Any, path: tuple[str, ...]) -> None:
    """Remove the tables along `path` that an edit left empty (deepest first)."""
    tables = [document]
    for name in path:
        child = tables[-1].get(name)
        if not isinstance(child, MutableMapping):
            break
        tables.append(child)
    for depth in range(len(tables) - 1, 0, -1):
        if not tables[depth]:
            tables[depth - 1].pop(path[depth - 1], None)


def _write_atomically(path: Path, text: str) -> None:
    target = Path(os.path.realpath(path))  # a symlinked config.toml stays a symlink
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = _mode_for(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mode_for(path: Path) -> int:
    """The file's own permissions, or what a new file gets under the umask."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
