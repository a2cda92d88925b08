"""The user's settings: a typed object read from and written to config.toml.

The file is shared: the model catalog keeps its own `[models]` entries in it, so
writing keeps every key and table this module does not know. Writes go to a
temporary file beside config.toml, then os.replace, so a crash never leaves
half a file. Invalid values are refused with a message that names the key and
what it accepts.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import tomli_w

from dflash_chat import paths
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
    max_new_tokens: int = 1024
    system_prompt: str = ""
    thinking: bool = False
    theme: str = "dflash-dark"
    model: str = ""
    drafter: str = ""
    context_length: int = 8192
    # binding id -> keys, e.g. {"toggle-thinking": "ctrl+t"}; see ui/app.py for the ids
    keymap: dict[str, str] = field(default_factory=dict)


def _number(kind: type, low: float | None, high: float | None) -> Callable[[str, Any], Any]:
    def check(key: str, value: Any) -> Any:
        if isinstance(value, bool):
            raise SettingsError(f"{key} must be a number, not {value!r}")
        if isinstance(value, str):
            try:
                value = kind(value.strip())
            except ValueError:
                raise SettingsError(f"{key} must be {_kind_name(kind)}, got {value!r}") from None
        if kind is int and isinstance(value, float):
            if not value.is_integer():
                raise SettingsError(f"{key} must be a whole number, got {value!r}")
            value = int(value)
        if not isinstance(value, (int, float)):
            raise SettingsError(f"{key} must be {_kind_name(kind)}, got {value!r}")
        value = kind(value)
        if low is not None and value < low or high is not None and value > high:
            raise SettingsError(f"{key} must be between {low} and {high}, got {value}")
        return value

    return check


def _kind_name(kind: type) -> str:
    return "a whole number" if kind is int else "a number"


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise SettingsError(f"{key} must be text, got {value!r}")
    return value


def _name(key: str, value: Any) -> str:
    value = _text(key, value).strip()
    if not value:
        raise SettingsError(f"{key} cannot be empty")
    return value


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "on", "yes", "1"):
            return True
        if lowered in ("false", "off", "no", "0"):
            return False
    raise SettingsError(f"{key} must be on or off (true/false), got {value!r}")


def _keymap(key: str, value: Any) -> dict[str, str]:
    if isinstance(value, str):
        # command-line form: "toggle-thinking=ctrl+t;stop=escape"
        pairs = [item.split("=", 1) for item in value.split(";") if item.strip()]
        if any(len(pair) != 2 for pair in pairs):
            raise SettingsError(f"{key} must look like 'binding-id=keys;other-id=keys'")
        value = {name.strip(): keys.strip() for name, keys in pairs}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in value.items()
    ):
        raise SettingsError(f"{key} must be a table of binding id = \"keys\"")
    return dict(value)


VALIDATORS: dict[str, Callable[[str, Any], Any]] = {
    "temperature": _number(float, 0.0, 2.0),
    "top_p": _number(float, 0.01, 1.0),
    "top_k": _number(int, 0, 100_000),
    "max_new_tokens": _number(int, 1, 1_000_000),
    "system_prompt": _text,
    "thinking": _flag,
    "theme": _name,
    "model": _text,
    "drafter": _text,
    "context_length": _number(int, 256, 1_048_576),
    "keymap": _keymap,
}

DESCRIPTIONS: dict[str, str] = {
    "temperature": "sampling temperature, 0 = greedy (0-2)",
    "top_p": "nucleus sampling mass (0.01-1, 1 = off)",
    "top_k": "keep the k likeliest tokens (0 = off)",
    "max_new_tokens": "longest answer, in tokens",
    "system_prompt": "text sent as the system message (empty = none)",
    "thinking": "let the model think before answering (on/off)",
    "theme": "colour theme name",
    "model": "pair name (dflash-chat models) or model folder/GGUF; empty: pick for this GPU",
    "drafter": "DFlash drafter directory (empty = plain decoding)",
    "context_length": "tokens of context the model keeps",
    "keymap": "key overrides: binding-id=keys;other-id=keys",
}

KEYS = tuple(f.name for f in fields(Settings))


def parse_value(key: str, value: Any) -> Any:
    """Validate one setting given as text or as a TOML value; SettingsError says what is wrong."""
    if key not in VALIDATORS:
        known = ", ".join(KEYS)
        raise SettingsError(f"unknown setting {key!r}; known settings: {known}")
    return VALIDATORS[key](key, value)


def parse_assignment(text: str) -> tuple[str, Any]:
    """'key=value' (as given to --set) -> (key, typed value)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise SettingsError(f"--set takes key=value, got {text!r} (e.g. --set temperature=0.2)")
    key = key.strip()
    return key, parse_value(key, value)


def _read_document(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{path} is not valid TOML ({exc}); fix or delete it") from None


def load(path: Path | None = None) -> Settings:
    """Settings from config.toml (defaults for anything missing)."""
    path = path or paths.config_file()
    document = _read_document(path)
    values = {}
    for key in KEYS:
        if key in document:
            try:
                values[key] = parse_value(key, document[key])
            except SettingsError as exc:
                raise SettingsError(f"{path}: {exc}; fix or remove that line") from None
    return Settings(**values)


def save(settings: Settings, path: Path | None = None) -> Path:
    """Write `settings` into config.toml, keeping every other key and table already there."""
    path = path or paths.config_file()
    document = _read_document(path)
    defaults = Settings()
    for key in KEYS:
        value = getattr(settings, key)
        if value == getattr(defaults, key):
            document.pop(key, None)
        else:
            document[key] = value
    _write_atomically(path, tomli_w.dumps(document))  # tomli-w writes bare keys before tables
    return path


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
