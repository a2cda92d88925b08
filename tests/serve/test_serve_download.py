"""`serve` chooses, downloads and loads as the app does: the same model loader, with `pull`'s bars.

The Hub is tests/hubserver.py on loopback with the tiny catalog pair of tests/ui/test_first_run.py;
the GPU probe is the only double (a 24 GB card), and DFLASH_CHAT_DEVICE=cpu loads on the CPU.
"""

from __future__ import annotations

from dflash_chat.chat.backends.remote import httpx_module
from dflash_chat.runtime.model_source import Pick
from dflash_chat.serve.served import Served
from dflash_chat.serve.server import Running, start_loading
from tests.ui.conftest import fast_settings, home  # noqa: F401 - fixtures
from tests.ui.test_first_run import first_run, repo_files, server  # noqa: F401 - fixtures


def test_serve_with_nothing_named_downloads_the_choice_loads_it_and_answers(first_run, server, capfd):  # noqa: F811
    settings = fast_settings()
    served = Served(None, settings)
    loader = start_loading(served, Pick(), settings, quiet=True)
    assert loader.done.wait(120), "the model did not load"
    assert served.load_error is None and served.name == "Tiny-Q8_0"
    fetched = {r.path.rsplit("/", 1)[-1] for r in server.requests if "/resolve/" in r.path}
    assert {"Tiny-Q8_0.gguf", "Tiny-DFlash-q8_0.gguf"} <= fetched
    assert "Tiny-Q8_0.gguf" in capfd.readouterr().out  # pull's progress bars, one per file
    with Running(served) as running:
        reply = httpx_module().post(
            f"{running.url}/v1/chat/completions",
            timeout=60,
            json={"model": "Tiny-Q8_0", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        )
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1
    assert reply.json()["metrics"]["speculative_decoding"]["num_spec_tokens"] == 15


def test_a_model_that_cannot_be_had_stops_serve_with_its_reason(first_run, monkeypatch):  # noqa: F811
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    settings = fast_settings()
    served = Served(None, settings)
    loader = start_loading(served, Pick(), settings, quiet=True)
    assert loader.done.wait(60)
    assert served.load_error.startswith("Tiny Q8_0 + drafter Q8_0 is not downloaded yet: ")
    assert served.session is None
