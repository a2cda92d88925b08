"""keymap.resolve: which overrides apply, and the line that says why one does not."""

from __future__ import annotations

import pytest

from dflash_chat.ui import keymap


@pytest.mark.parametrize(
    "overrides, applied, fragment",
    [
        (
            {"toggle-thinking": "ctrl+n", "new-chat": "ctrl+t"},
            {"toggle-thinking": "ctrl+n", "new-chat": "ctrl+t"},
            None,
        ),
        ({"stop": "Ctrl+G"}, {"stop": "ctrl+g"}, None),
        ({"stop": "shift+ctrl+g"}, {"stop": "ctrl+shift+g"}, None),
        ({"stop": "f5,ctrl+g"}, {"stop": "f5,ctrl+g"}, None),
        ({"quit": "ctrl+t"}, {}, "ctrl+t is also toggle-thinking's key"),
        ({"stop": "enter"}, {}, "enter is kept for sending the message"),
        ({"stop": "ctrl+p"}, {}, "kept for the command palette"),
        ({"stop": "k"}, {}, "types a character"),
        ({"stop": "shift+k"}, {}, "types a character"),
        ({"stop": "ctl+k"}, {}, "'ctl' is not a modifier"),
        ({"stop": "ctrl+kk"}, {}, "'kk' is not a key name"),
        ({"stop": "ctrl+ctrl+k"}, {}, "repeats a modifier"),
        ({"stop": "  "}, {}, "stop needs keys"),
        ({"no-such-id": "f6"}, {}, "unknown binding id 'no-such-id'"),
    ],
)
def test_resolve(overrides, applied, fragment):
    result = keymap.resolve(overrides)
    assert result.keymap == applied
    if fragment is None:
        assert result.problems == []
    else:
        assert len(result.problems) == 1 and fragment in result.problems[0]
    # whatever was refused, no two actions share a key and every action has one
    keys = [k for c in keymap.ALL for k in keymap.split_keys(result.keys(c.id))]
    assert len(keys) == len(set(keys)) and all(result.keys(c.id) for c in keymap.ALL)
