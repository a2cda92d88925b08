"""A chat's choice of tools: what an answer offers the model, and how it is saved."""

from __future__ import annotations

from dflash_chat.chat.tools.choice import AUTO, ChatTools
from dflash_chat.runtime.tool_calls import ToolSpec

LISTED = {
    "files": (ToolSpec("read", "Read a file", {"type": "object"}), ToolSpec("search", "Search files")),
    "web": (ToolSpec("search", "Search the web"), ToolSpec("fetch")),
}


def test_a_chat_that_never_chose_offers_every_tool_and_tells_same_named_tools_apart():
    offered = ChatTools().offer(LISTED, first=True)
    assert [t.name for t in offered.use.tools] == ["read", "files__search", "web__search", "fetch"]
    assert offered.route("files__search") == ("files", "search") and offered.route("fetch") == ("web", "fetch")
    assert offered.route("search") is None and offered.use.choice == AUTO
    assert offered.use.tools[0] == ToolSpec("read", "Read a file", {"type": "object"})


def test_unticking_keeps_exactly_the_tools_offered_then_and_servers_follow():
    every = ["files/read", "files/search", "web/search", "web/fetch"]
    tools = ChatTools().with_offered("web/fetch", False, every).with_offered("web/search", False, every)
    assert tools.offered == {"files/read", "files/search"}
    offered = tools.offer(LISTED, first=True)
    assert [t.name for t in offered.use.tools] == ["read", "files__search"]  # the web's search is still listed
    assert tools.servers(["files", "web", "git"]) == ["files"] and ChatTools().servers(["files", "web"]) == [
        "files",
        "web",
    ]
    assert ChatTools(offered=frozenset()).offer(LISTED, first=True) is None


def test_the_chosen_tool_is_forced_in_the_first_answer_only_and_unticking_it_drops_the_choice():
    tools = ChatTools(choice="web/fetch")
    assert tools.offer(LISTED, first=True).use.choice == "fetch"
    assert tools.offer(LISTED, first=False).use.choice == AUTO  # after tool results the model chooses freely
    every = ["files/read", "web/fetch"]
    assert tools.with_offered("web/fetch", False, every).choice == AUTO
    assert ChatTools(choice="gone/tool").offer(LISTED, first=True).use.choice == AUTO


def test_the_choice_saves_as_json_and_anything_unreadable_reads_as_the_default():
    tools = ChatTools(offered=frozenset({"a/x"}), always=frozenset({"a/x"}), choice="a/x")
    assert ChatTools.from_json(tools.to_json()) == tools
    assert ChatTools().to_json() is None and ChatTools.from_json(None) == ChatTools()
    assert ChatTools.from_json('{"offered": []}').offered == frozenset()
    for text in ["{not json", "[1]", '{"offered": "a/x"}', '{"always": [1]}', '{"choice": 5}']:
        read = ChatTools.from_json(text)
        assert read.offered is None and read.always == frozenset() and read.choice == AUTO
