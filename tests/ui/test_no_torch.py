"""The UI starts without torch: it is imported only in the worker that loads a model (and without the MCP
SDK, imported only on the thread of the tool servers, once one starts)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

CHECK = textwrap.dedent(
    """
    import asyncio, sys
    import dflash_chat.ui
    import dflash_chat.ui.app
    import dflash_chat.commands.chat
    from dflash_chat.settings import Settings
    after_import = "torch" in sys.modules
    mcp_after_import = "mcp" in sys.modules

    async def main():
        app = dflash_chat.ui.app.DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("ctrl+o")
            await pilot.pause()
            await pilot.press("escape")
            await pilot.pause()
            await pilot.press("f3")
            await pilot.pause()
            await pilot.press("escape")
            await pilot.pause()

    asyncio.run(main())
    print(after_import, "torch" in sys.modules, mcp_after_import, "mcp" in sys.modules)
    """
)


def test_importing_and_starting_the_ui_does_not_import_torch(tmp_path):
    env = {**os.environ, "DFLASH_CHAT_HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "False", "False"]  # nor the MCP SDK, with no servers


def test_commands_import_no_hub_client_until_they_run():
    """--help builds every subparser: a module-level import of hub (huggingface_hub, httpx) makes it slow."""
    check = textwrap.dedent(
        """
        import sys
        import dflash_chat.commands.bench, dflash_chat.commands.chat, dflash_chat.commands.doctor
        import dflash_chat.commands.run, dflash_chat.commands.models, dflash_chat.commands.pull
        import dflash_chat.commands.serve
        from dflash_chat.cli import build_parser
        build_parser()
        heavy = ("dflash_chat.models.hub", "huggingface_hub", "httpx", "httpx2", "torch", "fastapi", "uvicorn")
        print(sorted(m for m in heavy if m in sys.modules))
        """
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
