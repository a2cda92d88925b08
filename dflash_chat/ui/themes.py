"""Theme files (TOML) -> Textual Theme objects.

Shipped themes live in themes/ (the source tree) or dflash_chat/themes (a wheel);
users drop more into paths.user_themes_dir(). A file that cannot be read
becomes a message for a notification, never an exception.
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

from textual.color import Color, ColorParseError
from textual.theme import Theme

from dflash_chat import paths

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_THEME = "dflash-dark"
COLOR_FIELDS = (
    "primary",
    "secondary",
    "warning",
    "error",
    "success",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "boost",
)
KNOWN_FIELDS = {f.name for f in fields(Theme)}
MAX_THEME_BYTES = 256 * 1024  # a theme is a few hundred bytes; past this it is not one


class ThemeFileError(Exception):
    pass


@dataclass
class ThemeSet:
    themes: list[Theme] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    broken: dict[str, str] = field(default_factory=dict)  # file stem -> why it was skipped

    @property
    def names(self) -> set[str]:
        return {theme.name for theme in self.themes}


def shipped_themes_dir() -> Path:
    package = Path(__file__).resolve().parent.parent
    installed = package / "themes"
    return installed if installed.is_dir() else package.parent / "themes"


def load_theme_file(path: Path) -> Theme:
    data = _read(path)
    unknown = sorted(set(data) - KNOWN_FIELDS)
    if unknown:
        raise ThemeFileError(f"unknown keys {', '.join(unknown)}")
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name.strip():
        raise ThemeFileError("'name' must be text")
    if "primary" not in data:
        raise ThemeFileError("it needs at least a 'primary' colour")
    for key in COLOR_FIELDS:
        if key in data:
            _check_color(key, data[key])
    variables = data.get("variables", {})
    if not isinstance(variables, dict) or not all(isinstance(v, str) for v in variables.values()):
        raise ThemeFileError("[variables] must map names to text values")
    for key, value in variables.items():
        _check_variable(key, value)
    if not isinstance(data.get("dark", True), bool):
        raise ThemeFileError("'dark' must be true or false")
    try:
        theme = Theme(**{**data, "name": name.strip()})
        theme.to_color_system()  # fails here, not at paint time, on values Textual rejects
    except (TypeError, ValueError, ColorParseError) as exc:
        raise ThemeFileError(str(exc)) from None
    return theme


def _read(path: Path) -> dict:
    """The file's TOML, read only if it is a regular file of a theme's size (a FIFO would block the start,
    a huge file fill memory); anything else is a ThemeFileError in words."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise ThemeFileError("it is not a regular file")
        if info.st_size > MAX_THEME_BYTES:
            raise ThemeFileError(f"it is {info.st_size // 1024} KiB, too large for a theme file")
        with open(path, "rb") as handle:
            raw = handle.read(MAX_THEME_BYTES + 1)
    except OSError as exc:
        raise ThemeFileError(f"cannot read it ({exc.strerror or 'unreadable'})") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ThemeFileError(f"it is not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ThemeFileError(f"cannot read it ({exc})") from None


def _check_variable(key: str, value: str) -> None:
    """A [variables] value must be what Textual takes where that variable goes, or it fails the whole
    stylesheet at start: text styles ('bold underline') for *-style names, colours for the rest."""
    if not isinstance(key, str) or not key.replace("-", "").replace("_", "").isalnum():
        raise ThemeFileError(f"[variables] name {key!r} is not a variable name (letters, digits and '-')")
    if any(c in value for c in ";{}$\n") or not value.strip():
        raise ThemeFileError(f"[variables] {key} = {value!r} is not a single value")
    properties = ("text-style",) if key.endswith("style") else ("color", "background")
    if not any(_parses(prop, value) for prop in properties):
        example = '"bold underline"' if key.endswith("style") else '"#5FA8D3" or "#5FA8D3 35%"'
        raise ThemeFileError(f"[variables] {key} = {value!r} is not a valid value (try {example})")


def _parses(prop: str, value: str) -> bool:
    from textual.css.stylesheet import Stylesheet, StylesheetError

    sheet = Stylesheet()
    sheet.add_source(f"Screen {{ {prop}: {value}; }}", read_from=("theme", ""))
    try:
        sheet.parse()
    except (StylesheetError, ValueError):
        return False
    return True


def _check_color(key: str, value: object) -> None:
    if not isinstance(value, str):
        raise ThemeFileError(f"'{key}' must be a colour like \"#5FA8D3\"")
    try:
        Color.parse(value)
    except ColorParseError:
        raise ThemeFileError(f"'{key}' = {value!r} is not a colour (try \"#5FA8D3\")") from None


def discover_themes(user_dir: Path | None = None) -> ThemeSet:
    """Shipped themes first, then the user's (a user theme may replace a shipped one by name)."""
    found = ThemeSet()
    for directory in (shipped_themes_dir(), user_dir or paths.user_themes_dir()):
        try:
            found_paths = sorted(directory.glob("*.toml")) if directory.is_dir() else []
        except OSError as exc:
            found.problems.append(
                f"the themes folder {directory} cannot be read ({exc.strerror or exc}); its themes are not offered."
            )
            continue
        for path in found_paths:
            try:
                found.themes.append(load_theme_file(path))
            except ThemeFileError as exc:
                message = f"theme file {path} was skipped: {exc}. Fix or remove it."
                found.problems.append(message)
                found.broken[path.stem] = message
    return found
