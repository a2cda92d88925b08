"""The suite's own order (tests/conftest.py): the longest slow tests first, and the coding agents' tests last when
tools/test.sh installs the agents beside the run (their tests wait for the install to end)."""

from __future__ import annotations

import threading
import time

import pytest

from tests import conftest


class Item:
    def __init__(self, name: str, *marks: pytest.MarkDecorator):
        self.name, self.marks = name, {m.mark.name: m.mark for m in marks}

    def get_closest_marker(self, name: str):
        return self.marks.get(name)


def ordered(items: list[Item]) -> list[str]:
    conftest.pytest_collection_modifyitems(None, items)
    return [item.name for item in items]


def test_agents_go_last_when_their_install_runs_beside_the_suite_and_by_their_length_otherwise(tmp_path, monkeypatch):
    items = lambda: [  # noqa: E731
        Item("quick"),
        Item("agents", pytest.mark.slow(seconds=150), pytest.mark.agents),
        Item("kernels", pytest.mark.slow(seconds=60)),
    ]
    status = tmp_path / "install-status"
    monkeypatch.setenv("DFLASH_CHAT_AGENTS_STATUS", str(status))
    assert ordered(items()) == ["kernels", "quick", "agents"]
    status.write_text("installed\n")  # the order stays: each xdist worker must collect the same one
    assert ordered(items()) == ["kernels", "quick", "agents"]
    monkeypatch.delenv("DFLASH_CHAT_AGENTS_STATUS")  # no install beside the run: by their length
    assert ordered(items()) == ["agents", "kernels", "quick"]


def test_an_agents_test_waits_for_the_install_to_end(tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    from tests.serve import test_agents

    status = tmp_path / "install-status"
    monkeypatch.setenv("DFLASH_CHAT_AGENTS_STATUS", str(status))
    writer = threading.Timer(0.6, lambda: status.write_text("installed\n"))
    started = time.monotonic()
    writer.start()
    test_agents._installed()
    assert status.exists() and time.monotonic() - started >= 0.5
    writer.join()
