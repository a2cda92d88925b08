"""`launch`'s log file (launch-serve.log) holds serve's log: what it serves and where, a line per answer, and
when it stopped, not only its refusals (a good launch used to leave it empty)."""

from __future__ import annotations

import logging

from dflash_chat.commands import launch
from dflash_chat.runtime.endpoint import httpx_module

from .conftest import serving


def test_the_launch_log_has_a_line_per_answer(demo_pair, tmp_path):
    logger = logging.getLogger("dflash_chat.serve")
    before = logger.handlers[:], logger.level, logger.propagate
    path = launch._log_to(tmp_path / "launch-serve.log")
    try:
        with serving(demo_pair) as (_, url):
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            assert httpx_module().post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code == 200
    finally:
        for handler in logger.handlers:
            handler.close()
        logger.handlers, logger.level, logger.propagate = before[0], before[1], before[2]
    lines = path.read_text().splitlines()
    assert any("chat" in line and "prompt tokens" in line and "new at" in line for line in lines), lines
