"""bench/prefix_reuse.py on the demo pair, short prompts: every row is measured through serve, and the reused
tokens it reports say where each request resumed."""

import pytest

from dflash_chat.bench import prefix_reuse


def test_the_rows_resume_where_they_should():
    from dflash_chat.engine.load import load_pair
    from dflash_chat.models.demo import demo_available, demo_paths

    if not demo_available():
        pytest.skip("the demo pair is not in dflash_chat/demo_data")
    pair = load_pair(*demo_paths(), device="cpu", max_context=4096)
    (row,) = prefix_reuse.run(pair, short=150, long=900, dialects=("messages",)).values()
    assert set(row) == {"short", "long_cold", "second_turn", "branch", "after_other"}
    long = row["long_cold"]["prompt_tokens"]
    assert long > 900 and row["long_cold"]["cached_tokens"] < 10
    assert row["second_turn"]["cached_tokens"] > long - 10  # the whole first turn, less its generation prompt
    system = row["branch"]["cached_tokens"]
    assert long - 40 < system < long  # the system block's checkpoint
    # after another conversation held the model, the branch's conversation came back from host memory
    assert row["after_other"]["cached_tokens"] >= system
    assert all(r["first_token_s"] > 0 and r["text"] for r in row.values())
    assert "after_other" in prefix_reuse.report({"messages": row})
