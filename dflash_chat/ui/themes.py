"""Theme files (TOML) -> Textual Theme objects.

Shipped themes live in themes/ (the source tree) or dflash_chat/themes (a wheel);
users drop more into paths.user_themes_dir(). A file that cannot be read
becomes a message for a notification, never an exception.
"""

from __future__ import annotations

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
    "primary", "secondary", "warning", "error", "success", "accent",
    "foreground", "background", "surface", "panel", "boost",
)
KNOWN_FIELDS = {f.name for f in fields(Theme)}


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
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ThemeFileError(f"cannot read it ({exc})") from None
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
    if not isinstance(data.get("dark", True), bool):
        raise ThemeFileError("'dark' must be true or false")
    try:
        theme = Theme(**{**data, "name": name.strip()})
        theme.to_color_system()  # fails here, not at paint time, on values Textual rejects
    except (TypeError, ValueError, ColorParseError) as exc:
        raise ThemeFileError(str(exc)) from None
    return theme


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
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.toml")):
            try:
                found.themes.append(load_theme_file(path))
            except ThemeFileError as exc:
                message = f"theme file {path} was skipped: {exc}. Fix or remove it."
                found.problems.append(message)
                found.broken[path.stem] = message
    return found
