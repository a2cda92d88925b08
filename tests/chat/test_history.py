from __future__ import annotations

import itertools

import pytest

from dflash_chat.chat.conversation import CANCELLED, COMPLETE, PARTIAL, Message
from dflash_chat.chat.history import (
    SCHEMA_VERSION,
    HistoryCorruptError,
    HistoryStore,
    HistoryUnavailable,
)
from dflash_chat.chat.markdown import export_filename, to_markdown
from dflash_chat.engine.events import GenerationStats
from dflash_chat.errors import UserError


def store_at(path):
    counter = itertools.count(1000)
    return HistoryStore(path, clock=lambda: float(next(counter)))


def test_messages_round_trip_with_stats(tmp_path):
    store = store_at(tmp_path / "h.sqlite3")
    cid = store.create("first")
    store.add(cid, Message("user", "hello"))
    stats = GenerationStats(
        prompt_tokens=9,
        new_tokens=20,
        steps=6,
        drafted=75,
        accepted=14,
        acceptance_histogram=[1, 2, 3],
        draft_histogram=[1, 0, 5],
        draft="auto",
        speculative=True,
    )
    store.add(cid, Message("assistant", "hi", thinking="hm", stats=stats))
    loaded = store.load(cid)
    assert [(m.role, m.content, m.thinking, m.status) for m in loaded.messages] == [
        ("user", "hello", "", COMPLETE),
        ("assistant", "hi", "hm", COMPLETE),
    ]
    assert loaded.messages[1].stats == stats
    assert loaded.title == "first"


def test_a_crash_mid_answer_keeps_the_partial_answer(tmp_path):
    path = tmp_path / "h.sqlite3"
    store = store_at(path)
    cid = store.create("chat")
    store.add(cid, Message("user", "tell me"))
    answer = Message("assistant", "", status=PARTIAL)
    store.add(cid, answer)
    answer.content = "Once upon"
    store.update(answer)
    del store  # no close, no final update: what a crash leaves

    again = store_at(path)
    messages = again.load(cid).messages
    assert [m.content for m in messages] == ["tell me", "Once upon"]
    assert messages[1].status == PARTIAL
    assert "interrupted" in to_markdown(again.load(cid))


def test_list_rename_delete(tmp_path):
    store = store_at(tmp_path / "h.sqlite3")
    a = store.create("a")
    b = store.create("b")
    store.add(a, Message("user", "newest activity"))
    assert [(s.title, s.messages) for s in store.summaries()] == [("a", 1), ("b", 0)]
    store.rename(b, "  renamed ")
    assert store.load(b).title == "renamed"
    with pytest.raises(UserError):
        store.rename(b, "  ")
    store.delete(a)
    assert [s.id for s in store.summaries()] == [b]
    with pytest.raises(UserError, match="not in the history"):
        store.load(a)
    assert store.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


def test_recent_prompts_oldest_first(tmp_path):
    store = store_at(tmp_path / "h.sqlite3")
    cid = store.create("c")
    for text in ["one", "two", "three"]:
        store.add(cid, Message("user", text))
        store.add(cid, Message("assistant", "ok"))
    assert store.recent_prompts(limit=2) == ["two", "three"]


def test_corrupt_file_is_moved_aside(tmp_path):
    path = tmp_path / "h.sqlite3"
    path.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(HistoryCorruptError):
        HistoryStore(path)
    store, note = HistoryStore.open_or_recover(path)
    assert note and "moved to" in note and "h.sqlite3.corrupt" in note
    assert (tmp_path / "h.sqlite3.corrupt").read_bytes().startswith(b"this is not")
    assert store.summaries() == []
    store.add(store.create("fresh"), Message("user", "works"))


def make_read_only(path) -> None:
    """Mark the file read-only the way SQLite itself honours (even for root, whom chmod does not stop):
    a file format write version above 2 (header byte 18) means "read only" to every SQLite library."""
    with open(path, "r+b") as handle:
        handle.seek(18)
        handle.write(bytes([3]))


def test_a_read_only_history_opens_and_is_not_moved_aside(tmp_path):

    path = tmp_path / "h.sqlite3"
    store = store_at(path)
    store.add(store.create("kept"), Message("user", "hello"))
    store.close()
    make_read_only(path)
    store, note = HistoryStore.open_or_recover(path)
    assert note is None and not (tmp_path / "h.sqlite3.corrupt").exists()
    assert [s.title for s in store.summaries()] == ["kept"]
    with pytest.raises(HistoryUnavailable, match="read-only: make them writable"):  # the chat screen says so
        store.create("new")


def test_a_read_only_history_that_needs_its_schema_is_kept_in_memory_not_moved(tmp_path):
    import sqlite3

    path = tmp_path / "h.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE unrelated (x)")  # a valid database at user_version 0
    db.commit()
    db.close()
    make_read_only(path)
    before = path.read_bytes()
    store, note = HistoryStore.open_or_recover(path)
    assert store.in_memory and store.create("works") == 1
    assert "\n" not in note and "read-only" in note and "--data-dir" in note and "kept until you quit" in note
    assert path.read_bytes() == before and not (tmp_path / "h.sqlite3.corrupt").exists()


def test_a_history_from_a_newer_version_is_left_where_it_is(tmp_path):
    import sqlite3

    path = tmp_path / "h.sqlite3"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    store, note = HistoryStore.open_or_recover(path)
    assert store.in_memory and "newer dflash-chat" in note
    assert path.exists() and not (tmp_path / "h.sqlite3.corrupt").exists()


def test_markdown_export(tmp_path):
    store = store_at(tmp_path / "h.sqlite3")
    cid = store.create("Python: with?")
    store.add(cid, Message("user", "What does `with` do?"))
    store.add(cid, Message("assistant", "It manages a context.", thinking="recall PEP 343"))
    store.add(cid, Message("assistant", "Part", status=CANCELLED))
    text = to_markdown(store.load(cid))
    assert text.startswith("# Python: with?\n")
    assert "## You\n\nWhat does `with` do?" in text
    assert "<summary>Thinking</summary>\n\nrecall PEP 343" in text
    assert "*(stopped)*" in text
    assert export_filename("Python: with?") == "python-with.md"
    assert export_filename("???") == "conversation.md"


def test_a_history_another_program_holds_says_so(tmp_path):
    import sqlite3

    path = tmp_path / "h.sqlite3"
    store = store_at(path)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # a database tool in the middle of a write
    try:
        with pytest.raises(HistoryUnavailable, match="another program holds the history file"):
            store.create("new")
        held, note = HistoryStore.open_or_recover(path)
        assert held.in_memory and "another program holds" in note and "permission" not in note
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert store.create("now it can") == 1


@pytest.mark.parametrize("make", ["a file", "a file above"])
def test_a_history_folder_that_cannot_be_one_is_kept_in_memory(tmp_path, make):
    blocker = tmp_path / "data"
    blocker.write_text("not a folder")
    path = blocker / "history.sqlite3" if make == "a file" else blocker / "deeper" / "history.sqlite3"
    store, note = HistoryStore.open_or_recover(path)
    assert store.in_memory and "cannot be opened or created" in note and blocker.read_text() == "not a folder"


def test_a_hand_edited_history_reads_back_without_failing(tmp_path):
    import sqlite3

    path = tmp_path / "h.sqlite3"
    store = store_at(path)
    cid = store.create("edited")
    store.add(cid, Message("user", "question"))
    store.add(cid, Message("assistant", "answer", stats=GenerationStats(new_tokens=3)))
    store.add(cid, Message("assistant", "again", stats=GenerationStats(new_tokens=4)))
    store.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE messages SET stats = '{not json' WHERE content = 'answer'")
    db.execute("""UPDATE messages SET stats = '{"new_tokens": "many"}' WHERE content = 'again'""")
    db.execute("UPDATE messages SET content = X'FFFE41' WHERE role = 'user'")
    db.execute("UPDATE conversations SET updated = 'yesterday'")
    db.commit()
    db.close()
    store = HistoryStore(path)
    messages = store.load(cid).messages
    assert [m.content for m in messages] == ["\ufffd\ufffdA", "answer", "again"]
    assert [m.stats for m in messages] == [None, None, None]  # figures that cannot be read are dropped, not the text
    assert store.summaries()[0].updated == 0.0 and store.recent_prompts() == ["\ufffd\ufffdA"]


def test_figures_saved_before_the_draft_setting_read_back_with_it_unknown(tmp_path):
    import sqlite3

    path = tmp_path / "h.sqlite3"
    store = store_at(path)
    cid = store.create("old")
    store.add(cid, Message("assistant", "answer", stats=GenerationStats(new_tokens=3, steps=2, drafted=30)))
    store.close()
    db = sqlite3.connect(path)
    db.execute("""UPDATE messages SET stats = '{"new_tokens": 3, "steps": 2, "drafted": 30, "speculative": true}'""")
    db.commit()
    db.close()
    stats = HistoryStore(path).load(cid).messages[0].stats
    assert (stats.new_tokens, stats.drafted, stats.speculative) == (3, 30, True)
    assert stats.draft == ""  # not "off": that answer drafted


def test_why_an_answer_was_cut_is_saved_with_it(tmp_path):
    from dflash_chat.chat.conversation import CUT

    path = tmp_path / "h.sqlite3"
    store = store_at(path)
    cid = store.create("remote")
    reason = "the connection to 127.0.0.1:9 was lost after 12 tokens"
    message = Message("assistant", "partial text", status=CUT, note=reason)
    store.add(cid, message)
    again = store_at(path).load(cid).messages[0]
    assert (again.content, again.status, again.note) == ("partial text", CUT, reason)
    assert f"*(cut short: {reason})*" in to_markdown(store.load(cid))


def test_a_history_from_before_notes_gains_the_column_and_keeps_every_message(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, created REAL NOT NULL,
                                    updated REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE, role TEXT NOT NULL,
            content TEXT NOT NULL, thinking TEXT NOT NULL DEFAULT '', status TEXT NOT NULL, stats TEXT,
            created REAL NOT NULL);
        INSERT INTO conversations VALUES (1, 'kept', 1.0, 2.0);
        INSERT INTO messages VALUES (1, 1, 'user', 'hello', '', 'complete', NULL, 1.0);
        INSERT INTO messages VALUES (2, 1, 'assistant', 'half an ans', '', 'cancelled', NULL, 2.0);
        PRAGMA user_version = 1;
    """)
    db.close()
    store = store_at(path)
    loaded = store.load(1)
    assert [(m.content, m.status, m.note) for m in loaded.messages] == [
        ("hello", COMPLETE, ""),
        ("half an ans", CANCELLED, ""),
    ]
    store.add(1, Message("assistant", "x", status=CANCELLED, note="stopped"))
    assert store_at(path).load(1).messages[-1].note == "stopped"
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


# tool calls, each chat's tools, and search (schema 3)


def test_tool_calls_and_their_results_round_trip_with_the_chats_choice_of_tools(tmp_path):
    from dflash_chat.chat.conversation import DENIED
    from dflash_chat.chat.tools.choice import ChatTools
    from dflash_chat.runtime.tool_calls import ToolCall

    path = tmp_path / "h.sqlite3"
    store = store_at(path)
    chosen = ChatTools(offered=frozenset({"files/read"}), choice="files/read")
    cid = store.create("tools", chosen)
    calls = (ToolCall("call_1", "read", '{"path": "/etc/hosts"}'), ToolCall("call_2", "read", '{"path": "~"}'))
    store.add(cid, Message("user", "read my hosts file"))
    store.add(cid, Message("assistant", "Let me look.", tool_calls=calls))
    store.add(cid, Message("tool", "127.0.0.1 localhost", tool_call_id="call_1"))
    store.add(
        cid, Message("tool", "The user declined this call; it was not run.", status=DENIED, tool_call_id="call_2")
    )
    store.set_tools(cid, ChatTools(offered=chosen.offered, always=frozenset({"files/read"})))
    loaded = store_at(path).load(cid)
    assert loaded.messages[1].tool_calls == calls
    assert [(m.role, m.tool_call_id, m.status) for m in loaded.messages[2:]] == [
        ("tool", "call_1", COMPLETE),
        ("tool", "call_2", DENIED),
    ]
    assert loaded.tools == ChatTools(offered=frozenset({"files/read"}), always=frozenset({"files/read"}))
    assert loaded.chat_turns()[1]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": {"path": "/etc/hosts"}}},
        {"id": "call_2", "type": "function", "function": {"name": "read", "arguments": {"path": "~"}}},
    ]
    assert loaded.chat_turns()[2] == {"role": "tool", "content": "127.0.0.1 localhost", "tool_call_id": "call_1"}
    markdown = to_markdown(loaded)
    assert "<details><summary>Tool call: read (done)</summary>" in markdown and "127.0.0.1 localhost" in markdown
    assert "Tool call: read (declined)" in markdown and "## You" in markdown and markdown.count("## Assistant") == 1


def test_hand_edited_tool_columns_read_back_as_no_calls_and_the_default_choice(tmp_path):
    import sqlite3

    from dflash_chat.chat.tools.choice import ChatTools

    path = tmp_path / "h.sqlite3"
    store = store_at(path)
    cid = store.create("edited", ChatTools(choice="a/b"))
    store.add(cid, Message("assistant", "answer"))
    store.close()
    db = sqlite3.connect(path)
    db.execute("""UPDATE messages SET tool_calls = '[{"id": 1}, "x", {"id": "c", "name": "n", "arguments": "{}"}]'""")
    db.execute("UPDATE conversations SET tools = '{not json'")
    db.commit()
    db.close()
    loaded = store_at(path).load(cid)
    assert [c.id for c in loaded.messages[0].tool_calls] == ["c"] and loaded.tools == ChatTools()


@pytest.fixture(params=["fts5", "like"])
def search_mode(request, monkeypatch):
    """Search by FTS5, and by LIKE as on a SQLite built without FTS5."""
    if request.param == "like":
        monkeypatch.setattr("dflash_chat.chat.history_search.fts5_available", lambda db: False)
    return request.param


def searched(store, text: str) -> list[str]:
    return [s.title for s in store.summaries(text)]


def test_search_finds_chats_by_title_or_by_one_messages_words(tmp_path, search_mode):
    store = store_at(tmp_path / "h.sqlite3")
    assert store.search_index.fts == (search_mode == "fts5")
    sorting = store.create("Sorting a dict by value")
    store.add(sorting, Message("user", "How do I sort a dictionary?"))
    store.add(sorting, Message("assistant", "Use sorted() with a key function."))
    cafe = store.create("Café menu")
    store.add(cafe, Message("user", "Translate the Menu into French"))
    other = store.create("Rust lifetimes")
    store.add(other, Message("assistant", "A lifetime says how long a borrow lives; SORTED is unrelated here."))
    assert searched(store, "") == ["Rust lifetimes", "Café menu", "Sorting a dict by value"]
    assert searched(store, "sort") == ["Rust lifetimes", "Sorting a dict by value"]  # a word's start, any case
    assert searched(store, "dict value") == ["Sorting a dict by value"]  # every word, in one title
    assert searched(store, "key function") == ["Sorting a dict by value"]  # ... or in one message
    assert searched(store, "sort french") == []  # never across two messages
    assert searched(store, "menu") == ["Café menu"]
    assert searched(store, "nothing-like-this") == []
    for odd in ['"', "AND", "*", "-x", "(", "a'b", "NEAR(", "%", "_"]:
        store.summaries(odd)  # any text is a search, never an error


def test_search_follows_every_change_to_the_history(tmp_path, search_mode):
    store = store_at(tmp_path / "h.sqlite3")
    cid = store.create("first title")
    answer = Message("assistant", "", status=PARTIAL)
    store.add(cid, answer)
    answer.content = "streamed words arrive"
    store.update(answer)
    assert searched(store, "arrive") == ["first title"]
    store.rename(cid, "renamed chat")
    assert searched(store, "renamed") == ["renamed chat"] and searched(store, "first") == []
    store.remove_message(answer.id)
    assert searched(store, "arrive") == []
    store.delete(cid)
    assert searched(store, "renamed") == []


def test_the_index_misses_nothing_written_by_a_sqlite_without_fts5(tmp_path, monkeypatch):
    path = tmp_path / "h.sqlite3"
    store = store_at(path)
    store.add(store.create("indexed"), Message("user", "alpha"))
    store.close()
    monkeypatch.setattr("dflash_chat.chat.history_search.fts5_available", lambda db: False)
    store = store_at(path)
    store.add(store.create("written without fts5"), Message("user", "beta"))
    assert searched(store, "beta") == ["written without fts5"]  # by LIKE meanwhile
    store.close()
    monkeypatch.undo()
    store = store_at(path)
    assert store.search_index.fts and searched(store, "beta") == ["written without fts5"]  # the index was rebuilt
    assert searched(store, "alpha") == ["indexed"]


V2_SCHEMA = """
CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE, role TEXT NOT NULL,
    content TEXT NOT NULL, thinking TEXT NOT NULL DEFAULT '', status TEXT NOT NULL, stats TEXT,
    created REAL NOT NULL, note TEXT NOT NULL DEFAULT '');
CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
"""


def test_a_history_written_by_the_previous_schema_loads_searches_and_takes_tool_calls(tmp_path):
    """A file exactly as schema 2 (the one before tools) wrote it: its CREATE statements, its rows; upgraded, it
    takes tool calls and images."""
    import sqlite3

    from dflash_chat.chat.images import Attachment
    from dflash_chat.runtime.tool_calls import ToolCall

    path = tmp_path / "v2.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(V2_SCHEMA)
    db.executescript("""
        INSERT INTO conversations VALUES (1, 'Old chat about kettles', 1.0, 3.0);
        INSERT INTO messages VALUES (1, 1, 'user', 'Why does my kettle whistle?', '', 'complete', NULL, 1.0, '');
        INSERT INTO messages VALUES (2, 1, 'assistant', 'Steam through a narrow opening.', '', 'cut', NULL, 2.0,
                                     'the connection was lost');
        PRAGMA user_version = 2;
    """)
    db.close()
    store = store_at(path)
    loaded = store.load(1)
    assert [(m.role, m.content, m.status, m.note, m.tool_calls) for m in loaded.messages] == [
        ("user", "Why does my kettle whistle?", COMPLETE, "", ()),
        ("assistant", "Steam through a narrow opening.", "cut", "the connection was lost", ()),
    ]
    assert searched(store, "steam") == ["Old chat about kettles"] and searched(store, "kettles") == [
        "Old chat about kettles"
    ]
    store.add(1, Message("assistant", "", tool_calls=(ToolCall("c1", "weather", "{}"),)))
    store.add(1, Message("tool", "sunny", tool_call_id="c1"))
    again = store_at(path).load(1)
    assert again.messages[2].tool_calls[0].name == "weather" and again.messages[3].tool_call_id == "c1"
    image = Attachment("ab" * 32, "kettle.png", 40, 24, 1234, "PNG")
    store.add(1, Message("user", "and this one?", images=(image,)))
    assert store_at(path).load(1).messages[4].images == (image,)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4


def test_a_read_only_history_of_the_previous_schema_is_kept_as_it_is(tmp_path):
    import sqlite3

    path = tmp_path / "v2.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(V2_SCHEMA + "INSERT INTO conversations VALUES (1, 'kept', 1.0, 1.0); PRAGMA user_version = 2;")
    db.close()
    make_read_only(path)
    before = path.read_bytes()
    store, note = HistoryStore.open_or_recover(path)
    assert store.in_memory and "read-only" in note
    assert path.read_bytes() == before
