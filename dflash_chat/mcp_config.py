"""The `[mcp]` table of config.toml: the MCP servers the chat may use, how many rounds of tool calls one message
may take, and how long one call may run. Plain data and checks, no MCP SDK: settings.py reads and writes it,
chat/tools/ starts the servers.

    [mcp]
    rounds = 8          # tool-call rounds per message (the model answers again after each)
    timeout = 60        # seconds one tool call may run

    [mcp.servers.files]                 # a server started as a command (stdio)
    command = "npx"
    args = ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"]
    env = { NOTES_READONLY = "1" }      # the only variables it gets, besides PATH and HOME
    enabled = true

    [mcp.servers.search]                # a server reached over streamable HTTP
    url = "http://127.0.0.1:8931/mcp"

A server entry that cannot be used is named in a notice and skipped (`read_table`); the others are used.
`check_table` refuses the first problem instead (`--set`, `dflash-chat doctor`). `apply` is one `--set
mcp.…` edit; `edits` the smallest changes that turn one table into another (settings.py writes only those).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dflash_chat.engine import rules

ROUNDS = rules.Number(int, 1, 100)
TIMEOUT = rules.Number(float, 1, 3600)
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SERVER_KEYS = ("command", "args", "env", "url", "enabled")
TABLE_KEYS = ("rounds", "timeout", "servers")


@dataclass(frozen=True)
class McpServer:
    """One server: started as `command args` with `env` (stdio), or reached at `url` (streamable HTTP)."""

    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str = ""
    enabled: bool = True

    @property
    def kind(self) -> str:
        return "http" if self.url else "stdio"

    def where(self) -> str:
        """The server as a person recognises it: its URL, or its command line."""
        return self.url or shlex.join([self.command, *self.args])


@dataclass(frozen=True)
class McpSettings:
    servers: Mapping[str, McpServer] = field(default_factory=dict)
    rounds: int = 8
    timeout: float = 60.0

    @property
    def enabled(self) -> dict[str, McpServer]:
        return {name: server for name, server in self.servers.items() if server.enabled}


def _table(value: Any, where: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise rules.Invalid(f"{where} must be a table")
    return value


def check_server(name: str, value: Any) -> McpServer:
    """One `[mcp.servers.NAME]` entry, checked; rules.Invalid says what is wrong (worded with its table)."""
    where = f"[mcp.servers.{name}]"
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise rules.Invalid(f"{where}: a server's name is 1 to 64 letters, digits, '_' or '-'")
    entry = _table(value, where)
    unknown = [key for key in entry if key not in SERVER_KEYS]
    if unknown:
        raise rules.Invalid(f"{where} has an unknown key {unknown[0]!r} (known: {', '.join(SERVER_KEYS)})")
    command, url = entry.get("command", ""), entry.get("url", "")
    if not isinstance(command, str) or not isinstance(url, str):
        raise rules.Invalid(f"{where}: command and url must be text")
    command, url = command.strip(), url.strip()
    if command and url:
        raise rules.Invalid(f"{where} has both command and url: keep the one that reaches the server")
    if not command and not url:
        raise rules.Invalid(
            f'{where} needs command = "..." (a program to start) or url = "http://..." (a server to reach)'
        )
    if url and not url.lower().startswith(("http://", "https://")):
        raise rules.Invalid(f"{where}: url must be an http:// or https:// URL, got {rules.shown(url)}")
    args = entry.get("args", [])
    if not isinstance(args, (list, tuple)) or not all(isinstance(a, str) for a in args):
        raise rules.Invalid(f'{where}: args must be a list of text, e.g. args = ["-y", "some-server"]')
    env = entry.get("env", {})
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and ENV_NAME.fullmatch(k) and isinstance(v, str) for k, v in env.items()
    ):
        raise rules.Invalid(f'{where}: env must be a table of NAME = "value", e.g. env = {{ API_KEY = "..." }}')
    if url and (args or env):
        raise rules.Invalid(f"{where}: args and env go with command, not with url")
    enabled = entry.get("enabled", True)
    if not isinstance(enabled, bool):
        raise rules.Invalid(f"{where}: enabled must be true or false")
    return McpServer(command, tuple(args), dict(env), url, enabled)


def read_table(value: Any) -> tuple[McpSettings, list[str]]:
    """The `[mcp]` table as far as it can be used, and a line for each part that cannot (skipped)."""
    problems: list[str] = []
    if not isinstance(value, Mapping):
        return McpSettings(), ["mcp must be a table: an [mcp] section with rounds, timeout and [mcp.servers.NAME]"]
    rounds, timeout = McpSettings.rounds, McpSettings.timeout
    for key in value:
        if key not in TABLE_KEYS:
            problems.append(f"[mcp] has an unknown key {key!r} (known: {', '.join(TABLE_KEYS)}); it is ignored")
    try:
        rounds = ROUNDS.check(value.get("rounds", rounds))
    except rules.Invalid as exc:
        problems.append(f"mcp.rounds {exc}; using {rounds}")
    try:
        timeout = TIMEOUT.check(value.get("timeout", timeout))
    except rules.Invalid as exc:
        problems.append(f"mcp.timeout (seconds) {exc}; using {timeout:g}")
    servers: dict[str, McpServer] = {}
    table = value.get("servers", {})
    if not isinstance(table, Mapping):
        problems.append("mcp.servers must be a table of [mcp.servers.NAME] sections")
        table = {}
    for name, entry in table.items():
        try:
            servers[name] = check_server(name, entry)
        except rules.Invalid as exc:
            problems.append(f"{exc}; that server is skipped")
    return McpSettings(servers, rounds, timeout), problems


def check_table(value: Any) -> McpSettings:
    """The `[mcp]` table, or rules.Invalid for its first problem."""
    if isinstance(value, McpSettings):
        value = as_table(value)
    settings, problems = read_table(value)
    if problems:
        raise rules.Invalid(problems[0].split("; ")[0])
    return settings


def as_table(settings: McpSettings) -> dict[str, Any]:
    """The settings as config.toml holds them (only what differs from the defaults)."""
    table: dict[str, Any] = {}
    if settings.rounds != McpSettings.rounds:
        table["rounds"] = settings.rounds
    if settings.timeout != McpSettings.timeout:
        table["timeout"] = settings.timeout
    if settings.servers:
        table["servers"] = {name: server_table(server) for name, server in settings.servers.items()}
    return table


def server_table(server: McpServer) -> dict[str, Any]:
    """One server's entry, its defaults left out."""
    defaults = McpServer()
    entry: dict[str, Any] = {}
    for key in SERVER_KEYS:
        value = getattr(server, key)
        if value != getattr(defaults, key):
            entry[key] = list(value) if key == "args" else dict(value) if key == "env" else value
    return entry


# --set mcp.…


def apply(settings: McpSettings, path: str, text: str) -> McpSettings:
    """One `--set mcp.PATH=TEXT` edit: `rounds`, `timeout`, `servers.NAME.KEY` (KEY: command, url, enabled,
    args as a TOML list or words, env.VAR), or `servers.NAME` with no value to remove the server. The entry it
    touches is checked whole; rules.Invalid says what is wrong (the caller names the key)."""
    parts = path.split(".")
    if parts == ["rounds"]:
        return replace(settings, rounds=ROUNDS.parse(text))
    if parts == ["timeout"]:
        return replace(settings, timeout=TIMEOUT.parse(text))
    if len(parts) < 2 or parts[0] != "servers" or not parts[1]:
        raise rules.Invalid(
            "the mcp settings are mcp.rounds=N, mcp.timeout=SECONDS, mcp.servers.NAME.KEY=VALUE (KEY: command, args, "
            "env.VAR, url, enabled) and mcp.servers.NAME= (removes that server)"
        )
    name, rest = parts[1], parts[2:]
    servers = dict(settings.servers)
    if not rest:
        if text.strip():
            raise rules.Invalid("a server takes no value (an empty one removes it); set its keys instead")
        servers.pop(name, None)
        return replace(settings, servers=servers)
    entry = server_table(servers.get(name, McpServer(enabled=True)))
    key = rest[0]
    if key == "env" and len(rest) == 2:
        env = dict(entry.get("env", {}))
        env.pop(rest[1], None)
        if text != "":
            env[rest[1]] = text
        entry["env"] = env
    elif len(rest) != 1 or key not in SERVER_KEYS or key == "env":
        raise rules.Invalid("a server's keys are command, args, env.VAR, url and enabled")
    elif key == "args":
        entry["args"] = _words(text)
    elif key == "enabled":
        try:
            entry["enabled"] = rules.switch(text)
        except rules.Invalid as exc:
            raise rules.Invalid(f"enabled {exc}") from None
    elif text.strip():
        entry[key] = text.strip()
    else:
        entry.pop(key, None)
    servers[name] = check_server(name, entry)
    return replace(settings, servers=servers)


def _words(text: str) -> list[str]:
    """args typed on one line: a TOML list (["-y", "pkg"]) or words as a shell splits them."""
    text = text.strip()
    if text.startswith("["):
        import tomlkit

        try:
            value = tomlkit.parse(f"args = {text}")["args"]
        except Exception:  # noqa: BLE001 - any parse failure is said in words
            raise rules.Invalid(f'args must be a list like ["-y", "pkg"], got {rules.shown(text)}') from None
        return [str(item) for item in value]
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise rules.Invalid(f"args: {exc}") from None


# writing: the smallest edits


DELETE = object()  # an edit that removes its key


def edits(old: McpSettings, new: McpSettings) -> list[tuple[tuple[str, ...], Any]]:
    """The (key path under [mcp], value or DELETE) edits that turn `old` into `new`; what both hold alike
    (and whatever the file holds that `old` skipped) is not touched."""
    out: list[tuple[tuple[str, ...], Any]] = []
    for key in ("rounds", "timeout"):
        if getattr(old, key) != getattr(new, key):
            out.append(((key,), getattr(new, key)))
    for name in old.servers:
        if name not in new.servers:
            out.append((("servers", name), DELETE))
    for name, server in new.servers.items():
        before = server_table(old.servers[name]) if name in old.servers else {}
        after = server_table(server)
        for key in SERVER_KEYS:
            if before.get(key) != after.get(key):
                out.append((("servers", name, key), after.get(key, DELETE)))
    return out
