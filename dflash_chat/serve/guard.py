"""What a browser must not do to a server on this machine, checked before any route runs.

A web page the user opens can send requests to 127.0.0.1 (a "simple" POST needs no CORS preflight
when its body is text/plain), and with DNS rebinding its own host name can point at this machine so
that it may read the answers too. llama-server and Ollama met both. So, as they do now:
- the `Host` header must name this server: a loopback name, an IP address, the bound host, this
  machine's own name, or a name given with --allow-host (a rebinding page's host is none of them);
- an `Origin` (sent by browsers with cross-origin requests) must be one given with --allow-origin;
  those get CORS headers and their preflight (OPTIONS) is answered;
- a POST under /v1 must say `Content-Type: application/json` (415 otherwise), which no page can send
  cross-origin without a preflight.
A pure ASGI middleware: streams and disconnects pass through untouched.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
from collections.abc import Callable, Iterable

from dflash_chat.serve.errors import ApiError

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
ALLOWED_HEADERS = "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta"
log = logging.getLogger("dflash_chat.serve")


def host_names(host: str, extra: Iterable[str] = ()) -> set[str]:
    """The names a `Host` header may carry for a server bound to `host`."""
    names = set(LOOPBACK_NAMES) | {name.lower().rstrip(".") for name in extra}
    if host not in ("0.0.0.0", "::", ""):
        names.add(host.lower().strip("[]"))
    try:
        own = socket.gethostname()
        names |= {own.lower(), own.split(".")[0].lower()}
    except OSError:  # pragma: no cover - no host name at all
        pass
    return names


def _host_of(header: str) -> str:
    """The name in a Host header, without its port ('[::1]:8000' -> '::1')."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


ErrorShape = Callable[[str, ApiError], dict]  # (path, error) -> the error's JSON in the path's dialect


class Guard:
    def __init__(
        self, app, *, hosts: set[str], origins: Iterable[str] = (), shape: ErrorShape = lambda path, e: e.body()
    ) -> None:
        self.app = app
        self.shape = shape
        self.hosts = hosts
        self.origins = {origin.rstrip("/").lower() for origin in origins}

    def host_ok(self, header: str) -> bool:
        name = _host_of(header).rstrip(".")
        return bool(name) and (name in self.hosts or _is_ip(name) or name.endswith(".localhost"))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method, path = scope["method"], scope["path"]
        refusal = self._refusal(headers, method, path)
        if refusal is not None:
            status, message, code = refusal
            log.warning("%s %s %s: %s", status, method, path, message)
            kind = "invalid_request_error" if status != 403 else "permission_error"
            body = self.shape(path, ApiError(status, message, type=kind, code=code))
            return await _send_error(send, status, body)
        origin = headers.get("origin")
        if origin is None:
            return await self.app(scope, receive, send)
        if method == "OPTIONS":
            return await _send_preflight(send, origin)

        async def with_cors(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *_cors(origin)]}
            await send(message)

        return await self.app(scope, receive, with_cors)

    def _refusal(self, headers: dict[str, str], method: str, path: str) -> tuple[int, str, str] | None:
        host = headers.get("host", "")
        if not self.host_ok(host):
            return (
                421,
                f"This server does not answer for the host {host[:80]!r}: reach it by its address "
                "(or pass --allow-host NAME to serve).",
                "invalid_host",
            )
        origin = headers.get("origin")
        if origin is not None and origin.rstrip("/").lower() not in self.origins:
            return (
                403,
                f"Requests from the web origin {origin[:80]!r} are refused: start serve with "
                "--allow-origin ORIGIN to let a page use it.",
                "origin_not_allowed",
            )
        if method == "POST" and path.startswith("/v1/"):
            kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if kind != "application/json":
                return (
                    415,
                    f"The body must be JSON, sent with 'Content-Type: application/json' (got {kind[:60] or 'none'!r}).",
                    "unsupported_media_type",
                )
        return None


def _cors(origin: str) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]


async def _send_preflight(send, origin: str) -> None:
    headers = [
        *_cors(origin),
        (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
        (b"access-control-allow-headers", ALLOWED_HEADERS.encode()),
        (b"access-control-max-age", b"600"),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def _send_error(send, status: int, error: dict) -> None:
    body = json.dumps(error).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
