"""The saved conversations: search, open, rename, delete (with the files of its images that no other chat holds),
export to Markdown (a chat's images copied beside it).

The search field (/ moves to it) filters the list as you type: chats whose title, or one of whose messages,
holds every word typed (chat/history_search.py: SQLite FTS5, or LIKE where FTS5 is missing). Enter or Down
goes from the field to the list.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rich.text import Text
from textual import events, on, work
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Label
from textual.widgets.data_table import RowKey

from dflash_chat.chat.conversation import Conversation
from dflash_chat.chat.history import HistoryStore
from dflash_chat.chat.images import ImageStore
from dflash_chat.chat.markdown import export_filename, export_markdown
from dflash_chat.errors import UserError
from dflash_chat.ui.dialogs import ConfirmDialog, TextDialog
from dflash_chat.ui.notices import PlainNotices


def when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


def row_conversation(key: RowKey) -> int:
    """The conversation a row shows (every row is added with its conversation's id as key)."""
    assert key.value is not None
    return int(key.value)


class HistoryScreen(PlainNotices, Screen[int | None]):
    """Dismisses with the id of the conversation to open, or None."""

    BINDINGS = [
        Binding("enter", "open", "Open", id="history-open"),
        Binding("r", "rename", "Rename", id="history-rename"),
        Binding("d,delete", "delete", "Delete", id="history-delete"),
        Binding("e", "export", "Export", id="history-export"),
        Binding("slash", "search", "Search", id="history-search"),
        Binding("escape", "close", "Back", id="history-close"),
    ]

    def __init__(self, store: HistoryStore, export_dir: Path | None = None, images: ImageStore | None = None) -> None:
        super().__init__()
        self.store = store
        self.export_dir = export_dir or Path.cwd()
        self.images = images  # where the chats' images are kept

    def compose(self):
        yield Label("History", id="history-title")
        yield Input(placeholder="Search titles and messages (/)", id="history-search")
        yield DataTable(id="history-table", cursor_type="row", zebra_stripes=True)
        yield Label("", id="history-empty")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_column("Title", key="title")
        table.add_column("Messages", key="messages")
        table.add_column("Updated", key="updated")
        self.refresh_rows()
        table.focus()

    @property
    def search(self) -> str:
        return self.query_one("#history-search", Input).value

    def refresh_rows(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        try:
            summaries = self.store.summaries(self.search)
        except UserError as exc:  # the history cannot be read just now
            self.notify(f"Could not read the history: {exc}", severity="error", timeout=20)
            summaries = []
        for s in summaries:
            table.add_row(Text(s.title), str(s.messages), when(s.updated), key=str(s.id))  # a title is never markup
        empty = self.query_one("#history-empty", Label)
        found = "No saved conversation holds every word of that search." if self.search.strip() else ""
        empty.update("" if summaries else found or "No saved conversations yet.")
        empty.display = not summaries
        table.display = bool(summaries)  # else the table fills the screen and the line is far below, unseen

    @on(Input.Changed, "#history-search")
    def searched(self) -> None:
        self.refresh_rows()

    @on(Input.Submitted, "#history-search")
    def search_done(self) -> None:
        self.query_one(DataTable).focus()

    def on_key(self, event: events.Key) -> None:
        """Down in the search field goes to the list."""
        if event.key == "down" and self.query_one("#history-search", Input).has_focus:
            event.stop()
            self.query_one(DataTable).focus()

    def action_search(self) -> None:
        self.query_one("#history-search", Input).focus()

    def selected(self) -> int | None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        return row_conversation(key)

    def action_open(self) -> None:
        conversation_id = self.selected()
        if conversation_id is not None:
            self.dismiss(conversation_id)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.dismiss(row_conversation(event.row_key))

    def action_close(self) -> None:
        self.dismiss(None)

    def _selected_conversation(self) -> tuple[int, Conversation] | None:
        """The selected row's id and conversation, read from the store; None when no row is selected or the
        store refuses (said in a notice)."""
        conversation_id = self.selected()
        if conversation_id is None:
            return None
        try:
            return conversation_id, self.store.load(conversation_id)
        except UserError as exc:
            self.notify(str(exc), severity="error", timeout=20)
            return None

    def _change(self, change: Callable[[], None]) -> None:
        """Change the store, then show its rows again; a change the store refuses is said in a notice."""
        try:
            change()
        except UserError as exc:
            self.notify(str(exc), severity="error", timeout=20)
            return
        self.refresh_rows()

    @work
    async def action_rename(self) -> None:
        selected = self._selected_conversation()
        if selected is None:
            return
        conversation_id, conversation = selected
        title = await self.app.push_screen_wait(TextDialog("Rename conversation", conversation.title))
        if title is not None:
            self._change(lambda: self.store.rename(conversation_id, title))

    @work
    async def action_delete(self) -> None:
        selected = self._selected_conversation()
        if selected is None:
            return
        conversation_id, conversation = selected
        if await self.app.push_screen_wait(ConfirmDialog(f"Delete “{conversation.title}”? This cannot be undone.")):
            self._change(lambda: self._delete(conversation_id))

    def _delete(self, conversation_id: int) -> None:
        """The chat deleted, and the files of its images that no other chat holds."""
        gone = self.store.delete(conversation_id)
        if self.images is not None and gone:
            self.images.forget(gone)

    @work
    async def action_export(self) -> None:
        selected = self._selected_conversation()
        if selected is None:
            return
        conversation = selected[1]
        default = str(self.export_dir / export_filename(conversation.title))
        target = await self.app.push_screen_wait(TextDialog("Export to Markdown file", default))
        if not target:
            return
        path = Path(target).expanduser()
        if path.is_file() and not await self.app.push_screen_wait(ConfirmDialog(f"{path} exists. Replace it?")):
            return  # a file of the user's is only replaced when they say so
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            export_markdown(conversation, path, self.store.images_folder)
        except (OSError, ValueError) as exc:
            why = getattr(exc, "strerror", None) or exc
            self.notify(f"could not write {path}: {why}. Pick another path.", severity="error", timeout=20)
            return
        self.notify(f"exported to {path}")
