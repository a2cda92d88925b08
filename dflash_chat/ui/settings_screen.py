"""Settings as a form; Save validates every field and writes config.toml atomically."""

from __future__ import annotations

from dataclasses import replace

from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Label, Select, Static, Switch

from dflash_chat import settings as settings_module
from dflash_chat.engine.rules import VISION_WORDS
from dflash_chat.errors import UserError, one_line
from dflash_chat.runtime.model_source import drafter_value, model_value
from dflash_chat.settings import DECODE_PATHS, DESCRIPTIONS, PREVIEWS, Settings, SettingsError
from dflash_chat.ui.notices import PlainNotices

TEXT_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_new_tokens",
    "system_prompt",
    "model",
    "drafter",
    "context_length",
    "draft",
    "speculate",
    "endpoints",
)


class SettingsScreen(PlainNotices, Screen[Settings | None]):
    """Dismisses with the saved Settings, or None when left without saving."""

    BINDINGS = [
        Binding("ctrl+s", "save", "Save", id="settings-save", priority=True),
        Binding("escape", "close", "Back", id="settings-close"),
    ]

    def __init__(self, current: Settings, theme_names: list[str]) -> None:
        super().__init__()
        self.current = current
        self.theme_names = sorted(set(theme_names) | {current.theme})

    def compose(self):
        yield Label("Settings", id="settings-title")
        with VerticalScroll(id="settings-form"):
            for key in TEXT_FIELDS:
                with Horizontal(classes="field"):
                    yield Label(key, classes="field-name")
                    yield Input(
                        settings_module.as_text(key, getattr(self.current, key)),
                        id=f"field-{key}",
                        placeholder=DESCRIPTIONS[key],
                        tooltip=DESCRIPTIONS[key],
                    )
            with Horizontal(classes="field"):
                yield Label("thinking", classes="field-name")
                yield Switch(self.current.thinking, id="field-thinking")
            with Horizontal(classes="field"):
                yield Label("theme", classes="field-name")
                yield Select(
                    [(name, name) for name in self.theme_names],
                    value=self.current.theme,
                    allow_blank=False,
                    id="field-theme",
                )
            with Horizontal(classes="field"):
                yield Label("decode", classes="field-name")
                yield Select(
                    [(name, name) for name in DECODE_PATHS],
                    value=self.current.decode,
                    allow_blank=False,
                    id="field-decode",
                    tooltip=DESCRIPTIONS["decode"],
                )
            with Horizontal(classes="field"):
                yield Label("vision", classes="field-name")
                yield Select(
                    [(name, name) for name in VISION_WORDS],
                    value=self.current.vision,
                    allow_blank=False,
                    id="field-vision",
                    tooltip=DESCRIPTIONS["vision"],
                )
            with Horizontal(classes="field"):
                yield Label("previews", classes="field-name")
                yield Select(
                    [(name, name) for name in PREVIEWS],
                    value=self.current.previews,
                    allow_blank=False,
                    id="field-previews",
                    tooltip=DESCRIPTIONS["previews"],
                )
            yield Static("", id="settings-errors", markup=False)  # quotes what was typed
            with Horizontal(id="settings-buttons"):
                yield Button("Save (ctrl+s)", variant="primary", id="save")
                yield Button("Cancel (esc)", id="cancel")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#settings-errors", Static).display = False
        self.query_one(f"#field-{TEXT_FIELDS[0]}", Input).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.action_close()

    def collect(self) -> tuple[Settings, list[str]]:
        values, errors = {}, []
        for key in TEXT_FIELDS:
            try:
                values[key] = settings_module.parse_value(key, self.query_one(f"#field-{key}", Input).value)
            except SettingsError as exc:
                errors.append(str(exc))
        if "model" in values:
            try:
                values["model"] = model_value(values["model"])
            except UserError as exc:
                errors.append(f"model: {exc}")
        if "drafter" in values:
            values["drafter"] = drafter_value(values["drafter"])
        values["thinking"] = self.query_one("#field-thinking", Switch).value
        values["theme"] = self.query_one("#field-theme", Select).value
        values["decode"] = self.query_one("#field-decode", Select).value
        values["vision"] = self.query_one("#field-vision", Select).value
        values["previews"] = self.query_one("#field-previews", Select).value
        return replace(self.current, **values), errors

    def action_save(self) -> None:
        new, errors = self.collect()
        if errors:
            self._not_saved(errors)
            return
        try:
            settings_module.update(settings_module.changes(self.current, new))  # only what was edited here
        except (OSError, SettingsError) as exc:
            # the file is the problem, not a field: the edits stay on screen, and the focus leaves the fields so
            # that keys typed next (meant for the chat) change nothing here
            self._not_saved(
                [
                    f"{one_line(exc, 'saving config.toml')}. Your edits are kept here: fix the file and "
                    "press ctrl+s again, or esc to leave without saving"
                ]
            )
            self.query_one("#save", Button).focus()
            return
        self.dismiss(new)

    def _not_saved(self, errors: list[str]) -> None:
        """Why nothing was saved: every reason under the form, the first in a notice, each saying "Not saved"."""
        box = self.query_one("#settings-errors", Static)
        box.update("\n".join(f"Not saved: {error}" for error in errors))
        box.display = True
        self.notify("Not saved: " + errors[0], severity="error")

    def action_close(self) -> None:
        self.dismiss(None)
