"""A gated drafter repo in the DownloadScreen: it asks for a token, stores it as `hf auth login`
does, and resumes the download (the local Hub answers gated repos as the real one does)."""

from __future__ import annotations

import asyncio

import pytest
from huggingface_hub import constants, get_token
from textual.widgets import Input, Label

from dflash_chat.models import hub
from tests.hubserver import HubServer, Repo, isolate_hub, point_login_at
from tests.ui.test_download_screen import TARGET, Host, make_plan, until


@pytest.fixture
def hf_home(monkeypatch, tmp_path):
    """A private HF cache and token store: the test stores a token and must not touch the user's."""
    monkeypatch.setattr(hub, "PROGRESS_INTERVAL", 0.0)
    home = isolate_hub(monkeypatch, tmp_path)
    assert constants.HF_TOKEN_PATH.startswith(str(tmp_path))
    return home


@pytest.fixture
def gated_server():
    repos = {
        "tiny/Tiny-GGUF": Repo({"Tiny-Q4_K_M.gguf": TARGET}),
        "tiny/Tiny-DFlash": Repo(
            {"config.json": b"{}", "model.safetensors": b"w" * 5000}, gated="manual", granted={"hf_granted"}
        ),
        "tiny/Tiny": Repo({"tokenizer_config.json": b"{}"}),
    }
    with HubServer(repos, tokens={"hf_granted": "ada", "hf_refused": "bob"}) as running:
        yield running


def test_a_gated_repo_asks_for_a_token_stores_it_and_resumes(gated_server, hf_home, monkeypatch):
    from dflash_chat.ui.download_screen import DownloadScreen

    point_login_at(monkeypatch, gated_server)
    app = Host(DownloadScreen(make_plan(gated_server)))

    def gated_text() -> str:
        return str(app.download.query_one("#download-gated-text", Label).render())

    async def answer(pilot, token: str, expect: str) -> str:
        field = app.download.query_one("#download-token", Input)
        await until(pilot, lambda: not field.disabled and field.has_focus, "the token field")
        field.value = token
        await pilot.press("enter")
        await until(pilot, lambda: expect in gated_text() or app.result != "pending", f"'{expect}'")
        return gated_text()

    async def scenario():
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.download.query_one("#download-gated").has_class("shown"), "the gate")
            steps = gated_text()
            typo = await answer(pilot, "hf_typo", "did not accept")
            refused = await answer(pilot, "hf_refused", "has no access")
            assert not gated_server.gets("/resolve/")  # nothing fetched while access is missing
            field = app.download.query_one("#download-token", Input)
            await until(pilot, lambda: not field.disabled, "the field again")
            field.value = "hf_granted"
            await pilot.press("enter")
            await until(pilot, lambda: app.result != "pending", "the download")
            return steps, typo, refused

    steps, typo, refused = asyncio.run(scenario())
    assert steps.startswith("tiny/Tiny-DFlash is gated: accept its terms on ") and "`hf auth login`" in steps
    assert typo.startswith("the Hub did not accept that token (HTTP 401)")
    assert refused.startswith("tiny/Tiny-DFlash is gated and your Hugging Face token has no access to it yet")
    files = app.result
    assert isinstance(files, hub.ModelFiles) and files.target.read_bytes() == TARGET
    assert (files.drafter / "model.safetensors").read_bytes() == b"w" * 5000
    assert get_token() == "hf_granted"  # stored where huggingface_hub and the `hf` CLI read it
    assert open(constants.HF_TOKEN_PATH).read() == "hf_granted"
