from __future__ import annotations

import pytest
from textual.color import Color

from dflash_chat.ui.themes import ThemeFileError, discover_themes, load_theme_file, shipped_themes_dir


def luminance(color: str) -> float:
    def channel(value: int) -> float:
        c = value / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = Color.parse(color).rgb
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_shipped_themes_load_and_are_readable():
    themes = {t.name: t for t in discover_themes(shipped_themes_dir() / "no-user-themes").themes}
    assert set(themes) == {"dflash-dark", "dflash-light", "dflash-high-contrast"}
    assert themes["dflash-dark"].dark and not themes["dflash-light"].dark
    for theme in themes.values():
        assert contrast(theme.foreground, theme.background) >= 7, theme.name  # WCAG AAA body text
        assert contrast(theme.primary, theme.background) >= 3, theme.name
    assert contrast(themes["dflash-high-contrast"].foreground, themes["dflash-high-contrast"].background) >= 20


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("name = 'x'\nprimary = \n", "cannot read it"),
        ("name = 'x'\nprimary = '#fff'\nsparkle = true\n", "unknown keys sparkle"),
        ("name = 'x'\n", "needs at least a 'primary'"),
        ("name = 'x'\nprimary = 'blurple'\n", "not a colour"),
        ("name = 'x'\nprimary = '#fff'\n[variables]\nborder = 3\n", "[variables]"),
        ("name = 'x'\nprimary = '#fff'\ndark = 'yes'\n", "'dark' must be true or false"),
    ],
)
def test_broken_theme_files_say_what_is_wrong(tmp_path, text, fragment):
    path = tmp_path / "t.toml"
    path.write_text(text)
    with pytest.raises(ThemeFileError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        load_theme_file(path)


def test_name_defaults_to_the_file_name(tmp_path):
    path = tmp_path / "sunset.toml"
    path.write_text("primary = '#ff8800'\n")
    assert load_theme_file(path).name == "sunset"
