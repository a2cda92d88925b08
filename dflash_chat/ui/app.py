"""The dflash-chat Textual app: themes, keymap, command palette and the screens."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.theme import Theme

from dflash_chat import paths
from dflash_chat import settings as settings_module
from dflash_chat.chat.backends.base import Backend
from dflash_chat.chat.backends.local import LocalBackend
from dflash_chat.chat.history import HistoryStore
from dflash_chat.chat.tools.servers import ToolServers
from dflash_chat.errors import UserError, one_line
from dflash_chat.runtime.endpoint import Endpoint
from dflash_chat.runtime.model_source import ModelSource, Pick
from dflash_chat.settings import Settings
from dflash_chat.ui import keymap, paste
from dflash_chat.ui.chat_screen import ChatScreen
from dflash_chat.ui.history_screen import HistoryScreen
from dflash_chat.ui.settings_screen import SettingsScreen
from dflash_chat.ui.themes import DEFAULT_THEME, discover_themes
from dflash_chat.ui.widgets import image_preview

STYLESHEET = Path(__file__).with_name("app.tcss")  # every rule of the app's look, screens and widgets alike
STICKY_S = 7 * 24 * 3600  # a notice about the user's own files stays until dismissed (click it, or the palette)


class DFlashChatApp(App):
    TITLE = "dflash-chat"
    CSS_PATH = STYLESHEET
    BINDINGS = [Binding(keymap.QUIT.keys, keymap.QUIT.action, keymap.QUIT.title, id=keymap.QUIT.id, priority=True)]

    def __init__(
        self,
        settings: Settings,
        source: ModelSource | Pick | Endpoint | None = None,
        *,
        history_path: Path | None = None,
        export_dir: Path | None = None,
        user_themes: Path | None = None,
        problems: Sequence[str] = (),
        backend: Backend | None = None,
    ) -> None:
        """`source`: model files, a Pick to choose and fetch, or a server (`--endpoint`).
        `problems`: what could not be used from config.toml (settings.read), shown until dismissed.
        `backend`: what answers (chat/backends/); by default the engine in this process loading `source`, or
        the server it names."""
        super().__init__()
        paste.install()  # before the driver starts reading the terminal
        self.export_dir = export_dir
        self.problems = list(problems)
        self.keys = keymap.Resolved()
        self._fallback_theme: str | None = None  # shown because the chosen one cannot be: not a choice to save
        self.store, self.history_note = HistoryStore.open_or_recover(history_path or paths.history_db())
        found = self.theme_files = discover_themes(user_themes)
        for theme in found.themes:
            self.register_theme(theme)
        if backend is None:
            backend = _backend_for(settings, source)
        servers = ToolServers(settings.mcp, self.store.path.parent)  # their logs beside the history
        self.chat = ChatScreen(settings, self.store, backend, self._recent_prompts(), servers)

    def on_exit_app(self) -> None:
        """Before the screens go: the terminal frees the images of the chips' previews (ui/widgets/image_preview.py)."""
        for preview in self.chat.query(image_preview.ImagePreview):
            preview.release()

    def post_display_hook(self) -> None:
        """After each frame: the sixel previews it painted are drawn over their cells (ui/widgets/image_preview.py)."""
        image_preview.draw_due()

    @property
    def settings(self) -> Settings:
        """The settings in use: the chat screen's (its apply_settings keeps the backend's in step)."""
        return self.chat.settings

    def _recent_prompts(self) -> list[str]:
        try:
            return self.store.recent_prompts()
        except UserError:  # the history cannot be read just now: Up/Down starts empty
            return []

    def get_default_screen(self) -> Screen:
        return self.chat

    def on_mount(self) -> None:
        for problem in self.problems:
            self.warn(problem)
        for stem, problem in self.theme_files.broken.items():
            if stem != self.settings.theme or stem in self.available_themes:  # else said with the theme below
                self.warn(problem)
        self._show_theme(self.settings.theme)
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        self._apply_keymap(self.settings.keymap)
        if self.history_note:
            self.warn(self.history_note, severity="error")

    def warn(self, message: str, severity: SeverityLevel = "warning") -> None:
        """A notice that stays until dismissed: it asks the user to fix something of theirs."""
        self.notify(message, severity=severity, timeout=STICKY_S, markup=False)

    def on_unmount(self) -> None:
        self.chat.action_stop()  # thread workers cannot be killed: the answer's loop must see the flag
        self.chat.backend.close()  # a remote backend's workers return now, whatever the network does
        self.chat.servers.close()  # the tool servers are asked to stop; nothing waits for them
        self.store.close()

    # keymap and palette

    def _apply_keymap(self, overrides: dict[str, str]) -> None:
        """Apply what can be of the user's [keymap]; each refusal is a notice, and that action keeps its key."""
        self.keys = keymap.resolve(overrides)
        for problem in self.keys.problems:
            self.warn(problem)
        self.set_keymap(self.keys.keymap)

    def key_for(self, binding_id: str) -> str:
        return self.keys.first_key(binding_id)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if self._notifications:
            yield SystemCommand("Dismiss notifications", "Close every notification shown", self.clear_notifications)
        if screen is not self.chat:
            return
        for command in keymap.COMMANDS:
            yield SystemCommand(
                command.title,
                f"{command.help} ({self.key_for(command.id)})",
                lambda action=command.action: self.chat.run_action(action),
            )

    # themes

    def _show_theme(self, name: str) -> None:
        """Show the theme the settings name; one that cannot be used is reported and left in config.toml."""
        if name in self.available_themes:
            self.theme = name
            return
        fallback = DEFAULT_THEME if DEFAULT_THEME in self.available_themes else "textual-dark"
        if self.theme != fallback:
            self._fallback_theme = fallback
            self.theme = fallback
        why = (
            self.theme_files.broken.get(name)
            or f"there is no theme of that name (theme files go in {paths.user_themes_dir()})."
        )
        self.warn(
            f"Theme {name!r} cannot be used: {why} Showing {fallback} meanwhile; config.toml still says "
            f"theme = {name!r} (pick another with Ctrl+P > Theme, or fix the file)."
        )

    def _remember_theme(self, theme: Theme) -> None:
        """A theme the user picked (the palette's theme picker) is saved; the fallback shown at start is not."""
        if theme.name == self._fallback_theme:
            self._fallback_theme = None
            return
        if theme.name == self.settings.theme:
            return
        self.chat.apply_settings(replace(self.settings, theme=theme.name))
        try:
            settings_module.update({"theme": theme.name})
        except (OSError, settings_module.SettingsError) as exc:  # e.g. config.toml was broken meanwhile
            self.warn(f"Could not save the theme choice: {one_line(exc, 'saving config.toml')}", severity="error")

    # screens

    @work
    async def action_open_history(self) -> None:
        chosen = await self.push_screen_wait(HistoryScreen(self.store, self.export_dir, self.chat.images))
        await self.chat.conversation_deleted()
        if chosen is not None:
            await self.chat.open_conversation(chosen)

    @work
    async def action_open_tools(self) -> None:
        from dflash_chat.ui.tools_screen import ToolsScreen

        conversation = self.chat.conversation
        chosen = await self.push_screen_wait(ToolsScreen(self.chat.servers, conversation.tools))
        self.chat.tools_chosen(conversation, chosen)

    @work
    async def action_open_settings(self) -> None:
        saved = await self.push_screen_wait(SettingsScreen(self.settings, list(self.available_themes)))
        if saved is None:
            return
        previous = self.settings
        self.chat.apply_settings(saved)
        if saved.theme != self.theme and saved.theme in self.available_themes:
            self.theme = saved.theme
        if saved.keymap != previous.keymap:
            self._apply_keymap(saved.keymap)
        self.notify("Settings saved")


def _backend_for(settings: Settings, source: ModelSource | Pick | Endpoint | None) -> Backend:
    """The engine in this process for model files or a Pick; a server's backend for an Endpoint."""
    if isinstance(source, Endpoint):
        from dflash_chat.chat.backends.remote import HttpBackend  # httpx loads only for a remote chat

        return HttpBackend(source)
    return LocalBackend(settings, source)
