"""The dflash-chat Textual app: themes, keymap, command palette and the screens."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.theme import Theme

from dflash_chat import paths
from dflash_chat import settings as settings_module
from dflash_chat.chat.history import HistoryStore
from dflash_chat.chat.model_source import ModelSource, Pick
from dflash_chat.settings import Settings
from dflash_chat.ui.chat_screen import COMMANDS, ChatScreen
from dflash_chat.ui.history_screen import HistoryScreen
from dflash_chat.ui.settings_screen import SettingsScreen
from dflash_chat.ui.themes import DEFAULT_THEME, discover_themes


class DFlashChatApp(App):
    TITLE = "dflash-chat"
    CSS_PATH = "app.tcss"
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", id="quit", priority=True)]

    def __init__(self, settings: Settings, source: ModelSource | Pick | None = None, *,
                 history_path: Path | None = None, export_dir: Path | None = None,
                 user_themes: Path | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.export_dir = export_dir
        self.keymap: dict[str, str] = {}
        self.store, self.history_note = HistoryStore.open_or_recover(history_path or paths.history_db())
        found = discover_themes(user_themes)
        self.theme_problems = found.problems
        for theme in found.themes:
            self.register_theme(theme)
        self.chat = ChatScreen(settings, self.store, source, self.store.recent_prompts())

    def get_default_screen(self) -> Screen:
        return self.chat

    def on_mount(self) -> None:
        fallback = DEFAULT_THEME if DEFAULT_THEME in self.available_themes else "textual-dark"
        self.theme = self.settings.theme if self.settings.theme in self.available_themes else fallback
        if self.theme != self.settings.theme:
            self.notify(f"Theme {self.settings.theme!r} was not found; using {fallback}.", severity="warning")
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        self._apply_keymap(self.settings.keymap)
        for problem in self.theme_problems:
            self.notify(problem, severity="warning", timeout=15)
        if self.history_note:
            self.notify(self.history_note, severity="error", timeout=20)

    def on_unmount(self) -> None:
        if self.chat.turn is not None:
            self.chat.turn.cancel.set()  # thread workers cannot be killed: let the loop see the flag
        self.store.close()

    # keymap and palette

    def _apply_keymap(self, keymap: dict[str, str]) -> None:
        known = {binding_id for binding_id, *_ in COMMANDS} | {"quit"}
        unknown = sorted(set(keymap) - known)
        if unknown:
            self.notify(f"keymap: unknown binding ids {', '.join(unknown)}; known: {', '.join(sorted(known))}",
                        severity="warning", timeout=15)
        self.keymap = {k: v for k, v in keymap.items() if k in known}
        self.set_keymap(self.keymap)

    def key_for(self, binding_id: str, default: str) -> str:
        return self.keymap.get(binding_id, default).split(",")[0]

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if screen is not self.chat:
            return
        for binding_id, keys, action, title, help_text in COMMANDS:
            yield SystemCommand(title, f"{help_text} ({self.key_for(binding_id, keys)})",
                                lambda action=action: self.chat.run_action(action))

    # themes

    def _remember_theme(self, theme: Theme) -> None:
        if theme.name == self.settings.theme:
            return
        self.settings = replace(self.settings, theme=theme.name)
        self.chat.settings = replace(self.chat.settings, theme=theme.name)
        try:
            settings_module.save(self.settings)
        except (OSError, settings_module.SettingsError) as exc:  # e.g. config.toml was broken meanwhile
            self.notify(f"Could not save the theme choice: {exc}", severity="error", timeout=15)

    # screens

    @work
    async def action_open_history(self) -> None:
        chosen = await self.push_screen_wait(HistoryScreen(self.store, self.export_dir))
        await self.chat.conversation_deleted()
        if chosen is not None:
            await self.chat.open_conversation(chosen)

    @work
    async def action_open_settings(self) -> None:
        saved = await self.push_screen_wait(SettingsScreen(self.settings, list(self.available_themes)))
        if saved is None:
            return
        self.settings = saved
        self.chat.apply_settings(saved)
        if saved.theme != self.theme and saved.theme in self.available_themes:
            self.theme = saved.theme
        self._apply_keymap(saved.keymap)
        self.notify("Settings saved")
