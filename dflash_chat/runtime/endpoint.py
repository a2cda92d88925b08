"""Where an OpenAI-compatible server is, the model it serves, and what its refusals mean in one line.

Data and wording only (no network here): chat/backends/remote.py talks to the server, and
chat/backends/remote_stream.py reads one streamed answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from dflash_chat.errors import UserError

API_KEY_ENV = "DFLASH_CHAT_API_KEY"


def key_env(name: str) -> str:
    """The variable holding the key of the named endpoint `name`: big-box -> DFLASH_CHAT_API_KEY_BIG_BOX.
    Keys stay out of config.toml; each named server can have its own."""
    return f"{API_KEY_ENV}_{re.sub(r'[^A-Z0-9]', '_', name.upper())}"


def api_key(given: str | None, name: str, environ: Mapping[str, str]) -> str | None:
    """--api-key, else the named endpoint's own variable, else DFLASH_CHAT_API_KEY."""
    return given or (environ.get(key_env(name)) if name else None) or environ.get(API_KEY_ENV) or None


@dataclass(frozen=True)
class Endpoint:
    """Where the server is: `base` ends in /v1; `root` is the server's own (/metrics, /health)."""

    base: str
    api_key: str | None = None
    name: str = ""  # a named endpoint from the settings, if it is one

    @classmethod
    def of(cls, url: str, api_key: str | None = None, name: str = "") -> Endpoint:
        url = url.strip()
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UserError(
                f"--endpoint {url!r} is not an http(s) URL: give one like http://127.0.0.1:8000/v1, "
                "or the name of an endpoint in the settings (dflash-chat models lists them)"
            )
        base = url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        return cls(base, api_key or None, name)

    @property
    def root(self) -> str:
        return self.base.removesuffix("/v1")

    @property
    def host(self) -> str:
        return urlsplit(self.base).netloc

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True)
class ServedModel:
    """The model a server answers with, and whether its /metrics has vLLM's draft counters."""

    id: str
    owner: str
    counters: bool


class ServerError(Exception):
    """The server answered with an error, or not as an OpenAI server does: one plain sentence."""


def error_text(status: int, body: bytes, endpoint: Endpoint) -> str:
    """What a refused request means, in one line that says what to do."""
    message = _server_message(body)
    if status == 401:
        where = f"{key_env(endpoint.name)} or {API_KEY_ENV}" if endpoint.name else API_KEY_ENV
        return f"{endpoint.host} refused the API key ({message or 'unauthorised'}): pass --api-key KEY, or set {where}"
    return f"HTTP {status} from the server at {endpoint.host}" + (f": {message}" if message else "")


def _server_message(body: bytes) -> str:
    """The message in an OpenAI-shaped error body, else the body's text in one short line ('' for a page)."""
    try:
        error = json.loads(body).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError, RecursionError):
        text = body.decode("utf-8", "replace").strip()
        message = "" if text[:1] == "<" else text  # an HTML error page says nothing useful in one line
    return short_line(message) if isinstance(message, str) else ""


def short_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def tokens_text(count: int) -> str:
    return f"{count} token{'s' if count != 1 else ''}"


def httpx_module():
    """The HTTP client huggingface_hub brought: httpx2 from huggingface_hub 2.4 on, httpx before."""
    import importlib

    try:
        return importlib.import_module("httpx2")
    except ImportError:  # pragma: no cover - depends on the installed huggingface_hub
        return importlib.import_module("httpx")
