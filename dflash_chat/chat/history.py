"""Conversations saved in SQLite (paths.history_db()).

Each message is written when it is sent or as its answer streams: an answer
is saved as "partial" while it is written and updated when it ends, so a
crash keeps everything before it and the part of the answer already seen.

A message's images are a JSON list of their attachments in its `images` column (chat/images.py): the hash
names the file that holds the bytes, in the images folder beside the history (`images_folder`).

A history that cannot be used (a read-only file or folder, a file another
program holds locked, a full disk) raises HistoryUnavailable, whose message
says in words what is wrong and what to do; when it cannot even be opened,
`open_or_recover` keeps this session's chats in memory instead.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dflash_chat.chat.conversation import (
    Conversation,
    Message,
)
from dflash_chat.chat.history_search import SearchIndex
from dflash_chat.chat.images import attachments_from_json, attachments_to_json
from dflash_chat.chat.tools.choice import ChatTools
from dflash_chat.engine.events import GenerationStats
from dflash_chat.errors import UserError
from dflash_chat.runtime.tool_calls import ToolCall

SCHEMA_VERSION = 4  # 2: messages.note (why an answer ended early); 3: tool calls, each chat's tools, search; 4: images
SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    tools TEXT
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    thinking TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL,
    stats TEXT,
    created REAL NOT NULL,
    note TEXT NOT NULL DEFAULT '',
    tool_calls TEXT,
    tool_call_id TEXT NOT NULL DEFAULT '',
    images TEXT
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""
UPGRADES = {  # from a version to the next: columns added, nothing else touched
    1: "ALTER TABLE messages ADD COLUMN note TEXT NOT NULL DEFAULT '';",
    2: "ALTER TABLE conversations ADD COLUMN tools TEXT; ALTER TABLE messages ADD COLUMN tool_calls TEXT; "
    "ALTER TABLE messages ADD COLUMN tool_call_id TEXT NOT NULL DEFAULT '';",
    3: "ALTER TABLE messages ADD COLUMN images TEXT;",
}


BUSY_TIMEOUT_S = 1.0  # how long a write waits for another program's lock (on the UI thread: keep it short)


class HistoryCorruptError(UserError):
    """The history file exists but SQLite cannot read it."""


class HistoryUnavailable(UserError):
    """The history cannot be read or written just now; the message says why and what to do."""


def explain(exc: BaseException, path: Path) -> str:
    """Why the history at `path` cannot be used, in words, with what to do about it."""
    text = str(exc).lower()
    if "locked" in text or "busy" in text:
        return (
            f"another program holds the history file {path} (another dflash-chat, or a database tool): "
            "close it, or keep the history elsewhere with --data-dir DIR"
        )
    if "readonly" in text or "read-only" in text or isinstance(exc, PermissionError):
        return (
            f"the history file {path} or its folder is read-only: make them writable, "
            "or keep the history elsewhere with --data-dir DIR"
        )
    if "unable to open" in text or isinstance(exc, (NotADirectoryError, FileExistsError, IsADirectoryError)):
        return (
            f"the history file {path} cannot be opened or created (is {path.parent} a writable folder?): "
            "fix that, or keep the history elsewhere with --data-dir DIR"
        )
    if "full" in text or "disk i/o" in text or isinstance(exc, OSError) and exc.errno == 28:
        return f"the disk holding the history file {path} is full or failing: free some space"
    return f"the history file {path} cannot be used ({exc})"


@dataclass(frozen=True)
class ConversationSummary:
    id: int
    title: str
    created: float
    updated: float
    messages: int


class HistoryStore:
    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time, in_memory: bool = False) -> None:
        """The history at `path`; `in_memory`: a store for this session only (path is where it would be)."""
        self.path = path
        self.clock = clock
        self.in_memory = in_memory
        try:
            if not in_memory:
                path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(":memory:" if in_memory else path, isolation_level=None, timeout=BUSY_TIMEOUT_S)
            self.db.execute("PRAGMA foreign_keys = ON")
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise HistoryUnavailable(f"{path} was written by a newer dflash-chat; upgrade, or move the file away")
            if 0 < version < SCHEMA_VERSION:  # an older history: its columns added in one transaction
                steps = " ".join(UPGRADES[v] for v in range(version, SCHEMA_VERSION))
                self.db.executescript(f"BEGIN; {steps} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")
            elif version == 0:  # a new file: the only write an open makes, besides the search index
                self.db.executescript(SCHEMA)
                self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self.search_index = SearchIndex.open(self.db)
        except (OSError, sqlite3.OperationalError) as exc:  # read-only, locked, cannot be opened: the file is fine
            raise HistoryUnavailable(explain(exc, path)) from None
        except sqlite3.DatabaseError as exc:
            raise HistoryCorruptError(f"the history file {path} cannot be read ({exc})") from None

    @classmethod
    def open_or_recover(cls, path: Path, **kwargs) -> tuple[HistoryStore, str | None]:
        """Open the store. A corrupt file is moved aside and a new one started; a history that cannot be
        used is left as it is and this session's chats are kept in memory. Returns the store and, when
        either happened, a line saying so."""
        try:
            return cls(path, **kwargs), None
        except HistoryCorruptError as exc:
            aside = _free_name(path.with_name(path.name + ".corrupt"))
            try:
                path.rename(aside)
                for suffix in ("-wal", "-shm", "-journal"):
                    path.with_name(path.name + suffix).unlink(missing_ok=True)
                return cls(path, **kwargs), f"{exc}. It was moved to {aside} and a new history was started."
            except (OSError, HistoryUnavailable) as failed:
                reason = explain(failed, path) if isinstance(failed, OSError) else str(failed)
                return cls(
                    path, in_memory=True, **kwargs
                ), f"{exc}, and it could not be moved aside: {reason}. " + _MEMORY_NOTE
        except HistoryUnavailable as exc:
            return cls(path, in_memory=True, **kwargs), f"Chat history is off: {exc}. " + _MEMORY_NOTE

    @contextmanager
    def _using(self) -> Iterator[None]:
        """Any SQLite failure of a read or write becomes HistoryUnavailable, in words."""
        try:
            yield
        except sqlite3.Error as exc:
            raise HistoryUnavailable(explain(exc, self.path)) from None

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """One write, whole or not at all: the rows and their search index in one transaction."""
        with self._using():
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    @property
    def images_folder(self) -> Path:
        """Where the chats' images are kept, by content hash (chat/images.py: ImageStore)."""
        return self.path.parent / "images"

    def close(self) -> None:
        try:
            self.db.close()
        except sqlite3.Error:
            pass

    # conversations

    def create(self, title: str, tools: ChatTools | None = None) -> int:
        with self._writing():
            now = self.clock()
            cursor = self.db.execute(
                "INSERT INTO conversations (title, created, updated, tools) VALUES (?, ?, ?, ?)",
                (title, now, now, tools.to_json() if tools is not None else None),
            )
            conversation_id = _row_id(cursor)
            self.search_index.title(conversation_id, title)
            return conversation_id

    def rename(self, conversation_id: int, title: str) -> None:
        title = title.strip()
        if not title:
            raise UserError("a conversation title cannot be empty")
        with self._writing():
            self.db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))
            self.search_index.title(conversation_id, title)

    def set_tools(self, conversation_id: int, tools: ChatTools) -> None:
        """Save which tools the chat offers (and which run without asking)."""
        with self._writing():
            self.db.execute("UPDATE conversations SET tools = ? WHERE id = ?", (tools.to_json(), conversation_id))

    def delete(self, conversation_id: int) -> set[str]:
        """Delete the chat; returns the hashes of its images that no other message holds (their files can go)."""
        with self._writing():
            held = self._image_digests("WHERE conversation_id = ?", (conversation_id,))
            self.search_index.conversation_removed(conversation_id)
            self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
            return held - self._image_digests("WHERE images IS NOT NULL", ()) if held else set()

    def _image_digests(self, where: str, args: tuple) -> set[str]:
        rows = self.db.execute(f"SELECT images FROM messages {where}", args)
        return {
            image.digest for (text,) in rows for image in attachments_from_json(text if isinstance(text, str) else None)
        }

    def summaries(self, search: str = "") -> list[ConversationSummary]:
        """Every saved chat, the latest first; with `search`, those whose title or one of whose messages
        holds every word of it (chat/history_search.py)."""
        with self._using():
            found = self.search_index.matching(search) if search.strip() else None
            rows = self.db.execute(
                "SELECT c.id, c.title, c.created, c.updated, COUNT(m.id) FROM conversations c "
                "LEFT JOIN messages m ON m.conversation_id = c.id "
                "GROUP BY c.id ORDER BY c.updated DESC, c.id DESC"
            ).fetchall()
            return [
                ConversationSummary(cid, _text(title), _time(created), _time(updated), count)
                for cid, title, created, updated, count in rows
                if found is None or cid in found
            ]

    def load(self, conversation_id: int) -> Conversation:
        with self._using():
            row = self.db.execute("SELECT title, tools FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
            if row is None:
                raise UserError(f"conversation {conversation_id} is not in the history")
            messages = [
                Message(
                    role=_text(role),
                    content=_text(content),
                    thinking=_text(thinking),
                    status=_text(status),
                    stats=_stats_from_json(stats if isinstance(stats, str) else None),
                    id=message_id,
                    note=_text(note),
                    tool_calls=_calls_from_json(calls if isinstance(calls, str) else None),
                    tool_call_id=_text(call_id),
                    images=attachments_from_json(images if isinstance(images, str) else None),
                )
                for message_id, role, content, thinking, status, stats, note, calls, call_id, images in self.db.execute(
                    "SELECT id, role, content, thinking, status, stats, note, tool_calls, tool_call_id, images "
                    "FROM messages WHERE conversation_id = ? ORDER BY id",
                    (conversation_id,),
                )
            ]
            tools = ChatTools.from_json(row[1] if isinstance(row[1], str) else None)
            return Conversation(title=_text(row[0]), messages=messages, id=conversation_id, tools=tools)

    # messages

    def add(self, conversation_id: int, message: Message) -> int:
        with self._writing():
            now = self.clock()
            cursor = self.db.execute(
                "INSERT INTO messages (conversation_id, role, content, thinking, status, stats, created, note, "
                "tool_calls, tool_call_id, images) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id,
                    message.role,
                    message.content,
                    message.thinking,
                    message.status,
                    _stats_to_json(message.stats),
                    now,
                    message.note,
                    _calls_to_json(message.tool_calls),
                    message.tool_call_id,
                    attachments_to_json(message.images),
                ),
            )
            self._touch(conversation_id, now)
            row_id = _row_id(cursor)
            self.search_index.message(row_id, message.content)
        message.id = row_id
        return row_id

    def update(self, message: Message) -> None:
        """Rewrite a saved message (an answer as it streams, then as it ended); one never saved: nothing."""
        if message.id is None:
            return
        with self._writing():
            self.db.execute(
                "UPDATE messages SET content = ?, thinking = ?, status = ?, stats = ?, note = ?, tool_calls = ? "
                "WHERE id = ?",
                (
                    message.content,
                    message.thinking,
                    message.status,
                    _stats_to_json(message.stats),
                    message.note,
                    _calls_to_json(message.tool_calls),
                    message.id,
                ),
            )
            self.search_index.message(message.id, message.content)

    def remove_message(self, message_id: int) -> None:
        with self._writing():
            self.search_index.message_removed(message_id)
            self.db.execute("DELETE FROM messages WHERE id = ?", (message_id,))

    def recent_prompts(self, limit: int = 200) -> list[str]:
        """The user's latest prompts, oldest first (for Up/Down in the input)."""
        with self._using():
            rows = self.db.execute(
                "SELECT content FROM messages WHERE role = 'user' ORDER BY id DESC LIMIT ?", (limit,)
            ).fetchall()
            return [_text(content) for (content,) in reversed(rows)]

    def _touch(self, conversation_id: int, now: float) -> None:
        self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))


_MEMORY_NOTE = "This session's chats are kept until you quit, and not saved."


def _free_name(path: Path) -> Path:
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def _row_id(cursor: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just wrote (sqlite3 types `lastrowid` as optional; after an INSERT it is set)."""
    row_id = cursor.lastrowid
    assert row_id is not None
    return row_id


def _calls_to_json(calls: tuple[ToolCall, ...]) -> str | None:
    if not calls:
        return None
    return json.dumps([{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls], ensure_ascii=False)


def _calls_from_json(text: str | None) -> tuple[ToolCall, ...]:
    """An answer's saved calls; those that cannot be read back (hand-edited) are left out, the message kept."""
    try:
        items = json.loads(text) if text else []
    except (ValueError, RecursionError):
        return ()
    calls = []
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and all(isinstance(item.get(k), str) for k in ("id", "name", "arguments")):
            calls.append(ToolCall(item["id"], item["name"], item["arguments"]))
    return tuple(calls)


def _stats_to_json(stats: GenerationStats | None) -> str | None:
    if stats is None:
        return None
    record = stats.as_dict()
    fields = GenerationStats.__dataclass_fields__
    return json.dumps({k: v for k, v in record.items() if k in fields})


def _stats_from_json(text: str | None) -> GenerationStats | None:
    """The saved figures, or None when they cannot be read back (hand-edited, or from another version):
    the message itself is kept either way."""
    if not text:
        return None
    try:
        record = json.loads(text)
        fields = GenerationStats.__dataclass_fields__
        values = {k: v for k, v in record.items() if k in fields}
        if not all(_fits(fields[k].default, v) for k, v in values.items()):
            return None
        values.setdefault("draft", "")  # saved before the draft setting existed: not known
        return GenerationStats(**values)
    except (ValueError, TypeError, AttributeError):
        return None


def _fits(default: object, value: object) -> bool:
    """A saved figure has the kind of its field: a number, a flag, text, or (a histogram) whole numbers."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float))
    return isinstance(value, list) and all(isinstance(n, int) and not isinstance(n, bool) for n in value)


def _time(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _text(value: object) -> str:
    """A text column as text, whatever was stored in it (a hand-edited database may hold bytes or NULL)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)
