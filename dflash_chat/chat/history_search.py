"""Search over the saved chats' titles and message text, for the history screen.

With SQLite's FTS5 (nearly every build has it) two full-text tables mirror the titles and the messages'
text, keyed by their row ids; the store (chat/history.py) writes them in the same transaction as the rows
themselves. Each word typed must start a word of the title, or of one message (case and accents aside).
Without FTS5 the same search runs as LIKE (each word anywhere in the text, ASCII case aside).

A history may be written by a SQLite without FTS5 after one with it made the index (another Python, say):
those writes cannot reach the index, so they mark it stale (`search_state`), and the next open with FTS5
rebuilds it.
"""

from __future__ import annotations

import sqlite3

INDEX = """
CREATE VIRTUAL TABLE IF NOT EXISTS title_search USING fts5(title, tokenize = 'unicode61 remove_diacritics 2');
CREATE VIRTUAL TABLE IF NOT EXISTS message_search USING fts5(content, tokenize = 'unicode61 remove_diacritics 2');
CREATE TABLE IF NOT EXISTS search_state (stale INTEGER NOT NULL);
"""
FILL = """
DELETE FROM title_search; DELETE FROM message_search; DELETE FROM search_state;
INSERT INTO title_search (rowid, title) SELECT id, title FROM conversations;
INSERT INTO message_search (rowid, content) SELECT id, content FROM messages;
INSERT INTO search_state VALUES (0);
"""


def fts5_available(db: sqlite3.Connection) -> bool:
    """Whether this SQLite has FTS5 (a virtual table of it can be made, in the connection's temp schema)."""
    try:
        db.execute("CREATE VIRTUAL TABLE temp.fts5_probe USING fts5(x)")
        db.execute("DROP TABLE temp.fts5_probe")
    except sqlite3.OperationalError:
        return False
    return True


def words(text: str) -> list[str]:
    return text.split()


class SearchIndex:
    """The index of one store's connection: kept up to date by its writes, asked by `matching`."""

    def __init__(self, db: sqlite3.Connection, fts: bool, exists: bool) -> None:
        self.db = db
        self.fts = fts  # searches (and writes) go through FTS5; else LIKE
        self.exists = exists  # the file holds an index (it is marked stale by writes made without FTS5)
        self._marked = False

    @classmethod
    def open(cls, db: sqlite3.Connection, fts: bool | None = None) -> SearchIndex:
        """The index of `db`: made (or rebuilt, when stale) if FTS5 is there and the file can be written;
        `fts` False: search by LIKE whatever this SQLite has."""
        exists = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'search_state'").fetchone() is not None
        if fts is False or (fts is None and not fts5_available(db)):
            return cls(db, False, exists)
        stale = not exists or db.execute("SELECT coalesce(max(stale), 1) FROM search_state").fetchone()[0] != 0
        if stale:
            try:
                db.executescript(f"BEGIN; {INDEX} {FILL} COMMIT;")
            except sqlite3.OperationalError:  # read-only or locked: search by LIKE this time
                if db.in_transaction:
                    db.execute("ROLLBACK")
                return cls(db, False, exists)
        return cls(db, True, True)

    # kept up to date (inside the store's write transactions)

    def _without_fts(self) -> bool:
        """True when writes cannot reach the index; the first such write marks an existing index stale."""
        if self.fts:
            return False
        if self.exists and not self._marked:
            self.db.execute("UPDATE search_state SET stale = 1")
            self._marked = True
        return True

    def title(self, conversation_id: int, title: str) -> None:
        if self._without_fts():
            return
        self.db.execute("DELETE FROM title_search WHERE rowid = ?", (conversation_id,))
        self.db.execute("INSERT INTO title_search (rowid, title) VALUES (?, ?)", (conversation_id, title))

    def message(self, message_id: int, content: str) -> None:
        if self._without_fts():
            return
        self.db.execute("DELETE FROM message_search WHERE rowid = ?", (message_id,))
        self.db.execute("INSERT INTO message_search (rowid, content) VALUES (?, ?)", (message_id, content))

    def message_removed(self, message_id: int) -> None:
        if not self._without_fts():
            self.db.execute("DELETE FROM message_search WHERE rowid = ?", (message_id,))

    def conversation_removed(self, conversation_id: int) -> None:
        """Before the conversation's rows go: its title and its messages leave the index."""
        if self._without_fts():
            return
        self.db.execute("DELETE FROM title_search WHERE rowid = ?", (conversation_id,))
        self.db.execute(
            "DELETE FROM message_search WHERE rowid IN (SELECT id FROM messages WHERE conversation_id = ?)",
            (conversation_id,),
        )

    # searching

    def matching(self, text: str) -> set[int]:
        """The ids of the conversations whose title, or one of whose messages, holds every word of `text`."""
        terms = words(text)
        if not terms:
            return set()
        if self.fts:
            query = " ".join('"' + term.replace('"', '""') + '"*' for term in terms)
            rows = self.db.execute(
                "SELECT rowid FROM title_search WHERE title_search MATCH ?1 UNION "
                "SELECT m.conversation_id FROM message_search s JOIN messages m ON m.id = s.rowid "
                "WHERE message_search MATCH ?1",
                (query,),
            )
        else:
            patterns = [
                "%" + term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%" for term in terms
            ]
            title = " AND ".join("title LIKE ? ESCAPE '\\'" for _ in terms)
            content = " AND ".join("content LIKE ? ESCAPE '\\'" for _ in terms)
            rows = self.db.execute(
                f"SELECT id FROM conversations WHERE {title} UNION "
                f"SELECT conversation_id FROM messages WHERE {content}",
                (*patterns, *patterns),
            )
        return {row[0] for row in rows}
